"""The experiment registry: short names (and Pax class-name aliases) -> ExperimentConfig factories.

    @register("shakespeare_char", aliases=("ShakespeareChar",))
    def shakespeare_char() -> ExperimentConfig: ...

`load_experiment(name)` accepts a registered name or alias, or a dotted path to a user's own
experiment, `package.module.attr`, where attr is an ExperimentConfig or a function returning one
(Pax: `--exp=tasks.lm.params.lm_cloud.LmCloudSpmd2BLimitSteps`).

The mechanism lives in the library so that pax_eqx never imports the top-level `experiments`
package by name (imports point down: experiments compose the library, not the other way).
Which modules hold experiments is declared by the installed distributions, as Python package
entry points of the group `pax_eqx.experiments`:

    [project.entry-points."pax_eqx.experiments"]
    builtin = "experiments"

An entry point names a module or a package; a package has every module in it imported
(`pkgutil`), so a new file in `experiments/` registers its experiments with no edit here. A
project of one's own can declare its own entry point the same way.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import pkgutil
from collections.abc import Callable
from types import ModuleType

from pax_eqx.config import ConfigError
from pax_eqx.experiment import ExperimentConfig

ENTRY_POINT_GROUP = "pax_eqx.experiments"

_REGISTRY: dict[str, Callable[[], ExperimentConfig]] = {}
_ALIASES: dict[str, str] = {}
_loaded = False


class UnknownExperimentError(ConfigError):
    """`--exp` names no registered experiment and no importable dotted path (a user error: exit 2)."""


def register(name: str, aliases: tuple[str, ...] = ()):
    """Decorator: registers a function returning an ExperimentConfig under `name` (and aliases)."""

    def wrap(fn: Callable[[], ExperimentConfig]) -> Callable[[], ExperimentConfig]:
        if name in _REGISTRY:
            raise ConfigError(f"experiment {name!r} is registered twice.")
        _REGISTRY[name] = fn
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

    An entry point whose module is not installed (a stale editable install) is skipped; an
    import error inside an installed experiment module is a bug there and propagates.
    """
    global _loaded
    if _loaded:
        return
    _loaded = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            module = ep.load()
        except ModuleNotFoundError as e:
            if e.name != ep.module:
                raise
            continue
        _import_all(module)


def names() -> list[str]:
    load_entry_points()
    return sorted(_REGISTRY)


def aliases() -> dict[str, str]:
    load_entry_points()
    return dict(_ALIASES)


def describe() -> str:
    """One line per experiment: name, aliases and the first docstring line."""
    load_entry_points()
    lines = []
    for name in sorted(_REGISTRY):
        alias = [a for a, n in _ALIASES.items() if n == name]
        doc = (_REGISTRY[name].__doc__ or "").strip().splitlines()
        lines.append(f"  {name}{' (' + ', '.join(alias) + ')' if alias else ''}: {doc[0] if doc else ''}")
    return "\n".join(lines)


def load_experiment(name: str) -> ExperimentConfig:
    """The experiment `name` (a registered name, an alias or a dotted path) as a fresh config."""
    load_entry_points()
    key = _ALIASES.get(name, name)
    if key in _REGISTRY:
        exp = _REGISTRY[key]()
        return exp if exp.name else exp.replace(name=key)
    if "." in name:
        return _load_dotted(name)
    if not _REGISTRY:
        raise UnknownExperimentError(
            f"--exp {name!r}: no experiments are registered: no installed distribution declares the "
            f"{ENTRY_POINT_GROUP!r} entry point (an install older than it?); reinstall pax_eqx (pip install -e .), "
            "or pass a dotted path package.module.name to your own experiment."
        )
    choices = sorted(_REGISTRY) + sorted(_ALIASES)
    close = difflib.get_close_matches(name, choices, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise UnknownExperimentError(
        f"--exp {name!r} is not a registered experiment.{hint} Registered: {', '.join(sorted(_REGISTRY))}; "
        "or pass a dotted path package.module.name to your own experiment."
    )


def _load_dotted(path: str) -> ExperimentConfig:
    module_name, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise UnknownExperimentError(f"--exp {path!r}: cannot import module {module_name!r} ({e}).") from None
    if not hasattr(module, attr):
        raise UnknownExperimentError(f"--exp {path!r}: module {module_name!r} has no attribute {attr!r}.")
    value = getattr(module, attr)
    exp = value() if callable(value) and not isinstance(value, ExperimentConfig) else value
    if not isinstance(exp, ExperimentConfig):
        raise UnknownExperimentError(
            f"--exp {path!r} gave a {type(exp).__name__}, not an ExperimentConfig (or a function returning one)."
        )
    return exp if exp.name else exp.replace(name=path)
