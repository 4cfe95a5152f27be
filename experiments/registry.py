"""The experiment registry: short names (and Pax class-name aliases) -> ExperimentConfig factories.

    @register("shakespeare_char", aliases=("ShakespeareChar",))
    def shakespeare_char() -> ExperimentConfig: ...

`load_experiment(name)` accepts a registered name or alias, or a dotted path to a user's own
experiment, `package.module.attr`, where attr is an ExperimentConfig or a function returning one
(Pax: `--exp=tasks.lm.params.lm_cloud.LmCloudSpmd2BLimitSteps`).
"""

from __future__ import annotations

import difflib
import importlib
from typing import Callable

from pax_eqx.experiment import ExperimentConfig

_REGISTRY: dict[str, Callable[[], ExperimentConfig]] = {}
_ALIASES: dict[str, str] = {}
_MODULES = ("experiments.shakespeare", "experiments.gpt3", "experiments.lm_cloud", "experiments.c4")


class UnknownExperimentError(ValueError):
    pass


def register(name: str, aliases: tuple[str, ...] = ()):
    def wrap(fn: Callable[[], ExperimentConfig]) -> Callable[[], ExperimentConfig]:
        if name in _REGISTRY:
            raise ValueError(f"experiment {name!r} is registered twice.")
        _REGISTRY[name] = fn
        for alias in aliases:
            _ALIASES[alias] = name
        return fn

    return wrap


def _load_builtin() -> None:
    for module in _MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise


def names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def aliases() -> dict[str, str]:
    _load_builtin()
    return dict(_ALIASES)


def describe() -> str:
    """One line per experiment: name, aliases and the first docstring line."""
    _load_builtin()
    lines = []
    for name in sorted(_REGISTRY):
        alias = [a for a, n in _ALIASES.items() if n == name]
        doc = (_REGISTRY[name].__doc__ or "").strip().splitlines()
        lines.append(f"  {name}{' (' + ', '.join(alias) + ')' if alias else ''}: {doc[0] if doc else ''}")
    return "\n".join(lines)


def load_experiment(name: str) -> ExperimentConfig:
    _load_builtin()
    key = _ALIASES.get(name, name)
    if key in _REGISTRY:
        exp = _REGISTRY[key]()
        return exp if exp.name else exp.replace(name=key)
    if "." in name:
        return _load_dotted(name)
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
