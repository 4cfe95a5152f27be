"""A search space held against an experiment, before any trial runs; a trial's flags.

`check_space` walks every path through the experiment's config (a typo is refused with the
field's class and a suggestion), matches each domain to the field's type (a float range on an
int field is refused), and applies every end of every domain -- LOW and HIGH, each choice --
through the same flag parser and `validate` a run uses. A space that passes cannot produce a
trial that the CLI would refuse for one value alone (a combination may still fail; that trial is
recorded as failed and the study goes on).
"""

from __future__ import annotations

import dataclasses
import threading
import types
import typing
from typing import Any

from pax_eqx.command_line import cli
from pax_eqx.config import ConfigError, check_fields, field_hints
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.tuning.space import Choice, Domain, IntRange, Scalar, SearchSpace, SearchSpaceError, flag

PROG = "python -m pax_eqx.train"
# The tuner's worker threads parse their trials' flags one at a time: tyro reads field docstrings
# with `inspect.getsource` -> `ast.parse`, which the CPython 3.11 here (3.11.7) cannot run in two
# threads at once: "SystemError: AST constructor recursion depth mismatch" killed a two-worker
# study under load (the flaky killed-study test).
_PARSING = threading.Lock()


def field_type(exp: ExperimentConfig, path: str) -> Any:
    """The annotation of the field at canonical `path` in `exp` (following the values, so a
    `model: ModelConfig` holding a LanguageModelConfig has its fields); SearchSpaceError names
    the first part that is not a field."""
    value: Any = exp
    parts = path.split(".")
    for i, name in enumerate(parts):
        if not dataclasses.is_dataclass(value):
            raise SearchSpaceError(
                f"search space {path}: {'.'.join(parts[:i])} is a value, not a config; it has no field {name!r}."
            )
        try:
            check_fields(type(value), [name])
        except ConfigError as e:
            where = ".".join(parts[:i]) or "the experiment"
            raise SearchSpaceError(f"search space {path}: {where}: {e}") from None
        if i == len(parts) - 1:
            return field_hints(type(value))[name]
        value = getattr(value, name)
    raise AssertionError("unreachable")


def _options(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _check_kind(path: str, domain: Domain, hint: Any) -> None:
    options = _options(hint)
    if isinstance(domain, Choice):
        return  # each value goes through the parser
    wanted = {int} if isinstance(domain, IntRange) else {float}
    fits = any(o in wanted or (o is float and int in wanted) for o in options)
    if not fits:
        name = getattr(hint, "__name__", str(hint))
        fix = "an int range (int:LOW:HIGH)" if int in options else "choice:A,B,..."
        raise SearchSpaceError(f"search space {path}={domain}: the field is {name}; use {fix}.")


def flags(exp: ExperimentConfig, values: dict[str, Scalar]) -> list[str]:
    """The CLI flags that set `values` ({canonical path: value}) on `exp`, as a user types them:
    `--learner.learning-rate 0.003`, `--train.no-sample-at-end` for a bool."""
    out: list[str] = []
    for path, value in values.items():
        hint = field_type(exp, path)
        if bool in _options(hint) and isinstance(value, bool):
            head, _, leaf = path.rpartition(".")
            out.append(flag(path) if value else flag(f"{head}.no_{leaf}" if head else f"no_{leaf}"))
        else:
            out += [flag(path), _text(value)]
    return out


def _text(value: Scalar) -> str:
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back as the same float
    return "None" if value is None else str(value)


def trial_experiment(base: ExperimentConfig, values: dict[str, Scalar]) -> ExperimentConfig:
    """`base` with a trial's values applied by the CLI's parser, then validated (ConfigError)."""
    with _PARSING:
        exp = cli.parse_fields(base, flags(base, values), PROG)
    exp.validate(num_devices=None)
    return exp


def check_space(space: SearchSpace, base: ExperimentConfig) -> None:
    """SearchSpaceError naming the path, the domain and the value the experiment refuses."""
    if not space.params:
        raise SearchSpaceError(
            "the search space is empty: the experiment declares none; name what to search with --param "
            "PATH=DOMAIN (e.g. --param learner.learning_rate=loguniform:1e-4:1e-2)."
        )
    for path, domain in space.params.items():
        _check_kind(path, domain, field_type(base, path))
        for value in domain.ends():
            try:
                trial_experiment(base, {path: value})
            except ConfigError as e:
                raise SearchSpaceError(
                    f"search space {path}={domain}: the experiment refuses {path}={_text(value)}: {e} Narrow the "
                    "domain to values a run accepts."
                ) from None


def baseline(space: SearchSpace, base: ExperimentConfig) -> dict[str, Scalar] | None:
    """The experiment's own values of the searched fields, when each lies in its domain: the
    first trial, so the study shows what tuning gained over the experiment as written."""
    values: dict[str, Scalar] = {}
    for path, domain in space.params.items():
        value: Any = base
        for name in path.split("."):
            value = getattr(value, name)
        if not domain.contains(value):
            return None
        values[path] = value
    return values
