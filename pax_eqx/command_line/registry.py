"""The experiment registry: short names (and Pax class-name aliases) -> ExperimentConfig factories.

    @register("shakespeare_char", aliases=("ShakespeareChar",))
    def shakespeare_char() -> ExperimentConfig: ...

`load_experiment(name)` accepts a registered name or alias, a dotted path to a user's own
experiment, `package.module.attr`, where attr is an ExperimentConfig or a function returning one
(Pax: `--exp=tasks.lm.params.lm_cloud.LmCloudSpmd2BLimitSteps`), or the path of a config.json
(a job dir's, or the best trial's from `python -m pax_eqx.tune`): the experiment exactly as
resolved there.

The mechanism lives in the library so that pax_eqx never imports the top-level `experiments`
package by name (imports point down: experiments compose the library, not the other way).
Which modules hold experiments is declared by the installed distributions, as Python package
entry points of the group `pax_eqx.experiments`:

    [project.entry-points."pax_eqx.experiments"]
    builtin = "experiments"

An entry point names a module or a package; a package has every module in it imported
(`pkgutil`), so a new file in `experiments/` registers its experiments with no edit here. A
project of one's own can declare its own entry point the same way (README.md, "Write your own
experiment", has the steps).

An experiment is the user's code: anything it raises while it is imported or called (a module
that raises, a function with the wrong signature, a value that is not an ExperimentConfig, a
dotted path to a missing attribute) becomes an `ExperimentLoadError`, a ConfigError whose one
line reads `--exp NAME: <exception type>: <message> (in FILE:LINE)`, FILE:LINE being the
innermost frame of the user's code (not pax_eqx's, not an installed library's); the original
exception is its `__cause__`, whose traceback `--verbose` prints.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import inspect
import os
import pkgutil
import sys
import sysconfig
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from pax_eqx.config import ConfigError
from pax_eqx.experiment import ExperimentConfig

ENTRY_POINT_GROUP = "pax_eqx.experiments"

_REGISTRY: dict[str, Callable[[], ExperimentConfig]] = {}
_ALIASES: dict[str, str] = {}
_SEARCH_SPACES: dict[str, Any] = {}
_loaded = False


class UnknownExperimentError(ConfigError):
    """`--exp` names no registered experiment and no importable dotted path (a user error: exit 2)."""


class ExperimentLoadError(ConfigError):
    """Importing or calling an `--exp` target raised, or gave something that is not an
    ExperimentConfig (a user error: exit 2). Its `__cause__` is what the user's code raised."""


def register(name: str, aliases: tuple[str, ...] = (), search: Any = None):
    """Decorator: registers a function returning an ExperimentConfig under `name` (and aliases).

    search: the experiment's hyperparameter search space (a pax_eqx.tuning.SearchSpace), what
    `python -m pax_eqx.tune --exp NAME` searches unless told otherwise."""

    def wrap(fn: Callable[[], ExperimentConfig]) -> Callable[[], ExperimentConfig]:
        if name in _REGISTRY:
            raise ConfigError(f"experiment {name!r} is registered twice.")
        _REGISTRY[name] = fn
        if search is not None:
            _SEARCH_SPACES[name] = search
        for alias in aliases:
            _ALIASES[alias] = name
        return fn

    return wrap


def _import_all(module: ModuleType) -> None:
    """A package's modules, imported so that their @register decorators run (names starting
    with `_` are private helpers and skipped)."""
    if not hasattr(module, "__path__"):
        return
    for info in pkgutil.iter_modules(module.__path__, module.__name__ + "."):
        if not info.name.rpartition(".")[2].startswith("_"):
            importlib.import_module(info.name)


def load_entry_points() -> None:
    """Imports every module the `pax_eqx.experiments` entry points name (once per process).

    An entry point whose module is not installed (a stale editable install) is skipped; anything
    an installed experiment module raises while it is imported is an ExperimentLoadError that
    names the module and the entry point.
    """
    global _loaded
    if _loaded:
        return
    _loaded = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            try:
                module = ep.load()
            except ModuleNotFoundError as e:
                if e.name != ep.module:
                    raise
                continue
            _import_all(module)
        except Exception as e:
            dist = f" of {ep.dist.name}" if getattr(ep, "dist", None) is not None else ""
            raise ExperimentLoadError(
                f"{_describe(e)}, while importing the experiments of the {ENTRY_POINT_GROUP!r} entry point "
                f"{ep.name!r}{dist} ({ep.value})"
            ) from e


def names() -> list[str]:
    load_entry_points()
    return sorted(_REGISTRY)


def aliases() -> dict[str, str]:
    load_entry_points()
    return dict(_ALIASES)


def describe(width: int | None = None) -> str:
    """The experiments, one to a paragraph: the name and its short aliases (a Pax class name;
    Pax's dotted paths are aliases too, not listed), then the first sentence of its docstring,
    indented and wrapped to `width` (the terminal's by default)."""
    import shutil
    import textwrap

    load_entry_points()
    width = max(width or shutil.get_terminal_size().columns, 40)
    lines = []
    for name in sorted(_REGISTRY):
        alias = sorted(a for a, n in _ALIASES.items() if n == name and "." not in a)
        lines.append(f"  {name}" + (f" ({', '.join(alias)})" if alias else ""))
        text = first_sentence(_REGISTRY[name].__doc__ or "")
        lines += textwrap.wrap(
            text, width, initial_indent=" " * 6, subsequent_indent=" " * 6, break_long_words=False,
            break_on_hyphens=False,
        )  # fmt: skip
    return "\n".join(lines)


def search_space(name: str) -> Any:
    """The search space registered with experiment `name` (or its alias); None if it has none."""
    load_entry_points()
    return _SEARCH_SPACES.get(_ALIASES.get(name, name))


def first_sentence(doc: str) -> str:
    """The first sentence of a docstring's (or a help's) first paragraph, on one line."""
    paragraph = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())
    head, dot, _ = paragraph.partition(". ")
    return head + "." if dot else paragraph


def load_experiment(name: str) -> ExperimentConfig:
    """The experiment `name` (a registered name, an alias or a dotted path) as a fresh config.

    UnknownExperimentError when `name` names nothing; ExperimentLoadError when the experiment's
    code raises (importing or calling it) or gives something that is not an ExperimentConfig.
    """
    try:
        load_entry_points()
    except ExperimentLoadError as e:
        raise ExperimentLoadError(f"--exp {name!r}: {e}") from e.__cause__
    key = _ALIASES.get(name, name)
    if name.endswith(".json") and key not in _REGISTRY:
        return _load_json(name)
    if key in _REGISTRY:
        exp = _call(name, _REGISTRY[key])
        return exp if exp.name else exp.replace(name=key)
    if "." in name:
        return _load_dotted(name)
    if not _REGISTRY:
        raise UnknownExperimentError(
            f"--exp {name!r}: no experiments are registered: no installed distribution declares the "
            f"{ENTRY_POINT_GROUP!r} entry point (an install older than it?); reinstall pax_eqx (pip install -e .), "
            "or pass a dotted path package.module.name to your own experiment."
        )
    raise UnknownExperimentError(
        f"--exp {name!r} is not a registered experiment.{_did_you_mean(name, n=5)} --help lists the experiments, "
        f"--help-all each of the {len(_REGISTRY)}; or pass a dotted path package.module.name to your own experiment."
    )


def _load_json(path: str) -> ExperimentConfig:
    """An experiment from a config.json a run wrote (DIR/config.json) or the tuner's best config:
    the resolved experiment, every field as it was."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ExperimentLoadError(
            f"--exp {path!r}: not an experiment's config.json: byte {e.start} is not UTF-8 (a damaged or foreign "
            "file); restore it from a copy, or delete it to let train recover the experiment from the checkpoint."
        ) from None
    except OSError as e:
        raise UnknownExperimentError(
            f"--exp {path!r}: cannot read it ({e.strerror or e}); pass a config.json a run or the tuner wrote, or a "
            "registered experiment's name."
        ) from None
    try:
        return ExperimentConfig.from_json(text)
    except (ValueError, TypeError) as e:  # JSONDecodeError is a ValueError; ConfigError names the field
        raise ExperimentLoadError(f"--exp {path!r}: not an experiment's config.json: {_one_line(e)}") from None


def _did_you_mean(name: str, n: int = 1) -> str:
    """` Did you mean 'a', 'b' or 'c'?`: the `n` experiments nearest `name`, each by its nearest
    registered name or alias, the nearest first (Pax's dotted aliases only for a dotted `name`)."""
    known = sorted(_REGISTRY) + sorted(a for a in _ALIASES if "." in name or "." not in a)
    targets: dict[str, str] = {}  # experiment -> the nearest of its spellings
    for match in difflib.get_close_matches(name, known, n=4 * n):
        targets.setdefault(_ALIASES.get(match, match), match)
    close = [repr(c) for c in list(targets.values())[:n]]
    if not close:
        return ""
    return f" Did you mean {close[0]}?" if len(close) == 1 else f" Did you mean {', '.join(close[:-1])} or {close[-1]}?"


def _load_dotted(path: str) -> ExperimentConfig:
    module_name, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if module_name == missing or module_name.startswith(missing + "."):  # the path's own module is not there
            raise UnknownExperimentError(
                f"--exp {path!r}: cannot import module {module_name!r} (ModuleNotFoundError: {e}).{_did_you_mean(path)}"
                " A dotted path is package.module.name: run from the directory that holds the package, or add it "
                "to PYTHONPATH."
            ) from None
        raise ExperimentLoadError(f"--exp {path!r}: {_describe(e)}") from e  # an import inside the user's module
    except Exception as e:
        raise ExperimentLoadError(f"--exp {path!r}: {_describe(e)}") from e
    if not hasattr(module, attr):
        submodule = _import_submodule(path, module_name)
        if submodule is not None:
            found = sorted(n for n, fn in _REGISTRY.items() if getattr(fn, "__module__", None) == path)
            found_text = f" It registers: {', '.join(found)} (pass --exp with one of them)." if found else ""
            raise ExperimentLoadError(
                f"--exp {path!r}: {path!r} is a module, not an experiment; name a function in it that returns an "
                f"ExperimentConfig, --exp {path}.<function>.{found_text} (in {_short(submodule.__file__)})"
            )
        public = [n for n in dir(module) if not n.startswith("_")]
        close = difflib.get_close_matches(attr, public, n=1)
        hint = f"; did you mean {module_name}.{close[0]}?" if close else ""
        raise ExperimentLoadError(
            f"--exp {path!r}: AttributeError: module {module_name!r} has no attribute {attr!r}{hint} "
            f"(in {_short(getattr(module, '__file__', None) or module_name)})"
        )
    value = getattr(module, attr)
    exp = _call(path, value) if callable(value) and not isinstance(value, ExperimentConfig) else value
    if not isinstance(exp, ExperimentConfig):
        raise ExperimentLoadError(
            f"--exp {path!r}: TypeError: {path} is {_a(type(exp).__name__)}, not an ExperimentConfig or a function "
            f"returning one (in {_short(getattr(module, '__file__', None) or module_name)})"
        )
    return exp if exp.name else exp.replace(name=path)


def _import_submodule(path: str, parent: str) -> ModuleType | None:
    """`path` imported as a module, when it is one (`--exp mypkg.mymodule`, no function named)."""
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as e:
        if e.name == path:
            return None
        raise ExperimentLoadError(f"--exp {path!r}: {_describe(e)}") from e
    except Exception as e:
        raise ExperimentLoadError(f"--exp {path!r}: {_describe(e)}") from e


def _call(name: str, fn: Callable[[], ExperimentConfig]) -> ExperimentConfig:
    """`fn()`, its exceptions and a result that is not an ExperimentConfig as ExperimentLoadError."""
    try:
        exp = fn()
    except Exception as e:
        frames = traceback.extract_tb(e.__traceback__)
        if len(frames) == 1:  # raised by the call itself (the wrong signature): point at the definition
            raise ExperimentLoadError(f"--exp {name!r}: {type(e).__name__}: {_one_line(e)} (in {_defined(fn)})") from e
        raise ExperimentLoadError(f"--exp {name!r}: {_describe(e)}") from e
    if not isinstance(exp, ExperimentConfig):
        raise ExperimentLoadError(
            f"--exp {name!r}: TypeError: {getattr(fn, '__qualname__', fn)!s}() returned "
            f"{_a(type(exp).__name__)}, not an ExperimentConfig (in {_defined(fn)})"
        )
    return exp


# ---------------------------------------------------------------- where the user's code failed


def _a(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or "(no message)"


def _describe(error: BaseException) -> str:
    """`<type>: <message> (in FILE:LINE)`, FILE:LINE the innermost frame of the user's code."""
    where = _where(error)
    return f"{type(error).__name__}: {_one_line(error)}" + (f" (in {where})" if where else "")


def _library_dirs() -> tuple[str, ...]:
    """pax_eqx itself, the standard library and installed packages: not the user's code."""
    dirs = {str(Path(__file__).resolve().parents[1])}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            dirs.add(str(Path(sysconfig.get_paths()[key]).resolve()))
        except (KeyError, OSError):
            pass
    return tuple(d + os.sep for d in dirs)


def _where(error: BaseException) -> str:
    """FILE:LINE of the innermost frame outside pax_eqx, the standard library, installed packages
    and importlib; a SyntaxError's own file and line; else the innermost frame's."""
    if isinstance(error, SyntaxError) and error.filename:
        return f"{_short(error.filename)}:{error.lineno}"
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""

    def outside(dirs: tuple[str, ...]) -> Callable[[traceback.FrameSummary], bool]:
        def check(frame: traceback.FrameSummary) -> bool:
            if frame.filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
                return False
            return not str(Path(frame.filename).resolve()).startswith(dirs)

        return check

    library = _library_dirs()
    ours = tuple(d for d in library if "-packages" not in d)  # an installed user package: its frames count
    frame = next(
        (f for test in (outside(library), outside(ours)) for f in reversed(frames) if test(f)),
        frames[-1],
    )
    return f"{_short(frame.filename)}:{frame.lineno}"


def _defined(fn: object) -> str:
    """FILE:LINE where `fn` is defined (or its module's file)."""
    try:
        return f"{_short(inspect.getsourcefile(fn))}:{inspect.getsourcelines(fn)[1]}"
    except (TypeError, OSError):
        module = getattr(fn, "__module__", None)
        return _short(getattr(sys.modules.get(module or ""), "__file__", None) or module or repr(fn))


def _short(path: str | None) -> str:
    """`path` relative to the working directory when it is under it."""
    if not path:
        return "?"
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative
