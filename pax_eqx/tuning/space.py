"""A search space: experiment fields, named by their CLI paths, and the values each may take.

    SearchSpace(
        {"learner.learning_rate": LogUniform(3e-4, 1e-2),
         "learner.schedule.warmup_steps": IntRange(0, 200, step=20)},
        metric="loss", direction="minimize",
        overrides=("--train.eval-interval-steps", "50"),
    )

A path is the dotted field path the CLI overrides use (`learner.learning_rate` or
`learner.learning-rate`: `--learner.learning-rate 3e-3` sets it). A trial's values are passed to
`python -m pax_eqx.train` as exactly those flags (`flags`), so a trial is the command it prints.
`metric` / `direction` name the eval metric the study optimises (a key of the trainer's eval
lines in metrics.jsonl: `loss`, `log_pplx`, `accuracy`, ...). `overrides` are flags every trial
gets before the user's own: what a search needs and a single run does not (frequent evals to
prune on, no sample at the end).

On the command line a domain is written `loguniform:LOW:HIGH`, `uniform:LOW:HIGH[:STEP]`,
`int:LOW:HIGH[:STEP]`, `logint:LOW:HIGH` or `choice:A,B,...` (`parse_param`).

This module knows nothing of Optuna or of the experiment's config classes: a domain asks a
trial for a value through the trial's `suggest_float` / `suggest_int` / `suggest_categorical`
(Optuna's names), and `pax_eqx.tuning.check` holds the space against an experiment.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from pax_eqx.config import ConfigError

Scalar = bool | int | float | str | None


class SearchSpaceError(ConfigError):
    """A search space that cannot be searched as written (a user error: exit 2)."""


@runtime_checkable
class Trial(Protocol):
    """What a domain asks of a trial (Optuna's Trial has these)."""

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False): ...

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False): ...

    def suggest_categorical(self, name: str, choices: Sequence[Scalar]): ...


def _check_bounds(text: str, low: float | int, high: float | int, log: bool) -> None:
    if not (math.isfinite(low) and math.isfinite(high)) or not low < high:
        raise SearchSpaceError(f"{text}: needs finite LOW < HIGH, got {low} and {high}.")
    if log and low <= 0:
        raise SearchSpaceError(f"{text}: a log scale needs LOW > 0, got {low}; use uniform (or int) for ranges from 0.")


@dataclasses.dataclass(frozen=True)
class LogUniform:
    """A float, uniform in log(value) over [low, high] (learning rates, weight decays)."""

    low: float
    high: float

    def __post_init__(self):
        _check_bounds(str(self), self.low, self.high, log=True)

    def suggest(self, trial: Trial, name: str) -> float:
        return trial.suggest_float(name, self.low, self.high, log=True)

    def contains(self, value: Any) -> bool:
        return _is_number(value) and self.low <= value <= self.high

    def ends(self) -> tuple[float, ...]:
        return (self.low, self.high)

    def __str__(self) -> str:
        return f"loguniform:{self.low:g}:{self.high:g}"


@dataclasses.dataclass(frozen=True)
class Uniform:
    """A float, uniform over [low, high]; with `step`, one of low, low + step, ... <= high."""

    low: float
    high: float
    step: float | None = None

    def __post_init__(self):
        _check_bounds(str(self), self.low, self.high, log=False)
        if self.step is not None and not 0 < self.step <= self.high - self.low:
            raise SearchSpaceError(f"{self}: STEP must be in (0, HIGH - LOW], got {self.step}.")

    def suggest(self, trial: Trial, name: str) -> float:
        return trial.suggest_float(name, self.low, self.high, step=self.step)

    def contains(self, value: Any) -> bool:
        if not (_is_number(value) and self.low <= value <= self.high):
            return False
        return self.step is None or math.isclose((value - self.low) / self.step, round((value - self.low) / self.step))

    def ends(self) -> tuple[float, ...]:
        return (self.low, self.high)

    def __str__(self) -> str:
        return f"uniform:{self.low:g}:{self.high:g}" + (f":{self.step:g}" if self.step is not None else "")


@dataclasses.dataclass(frozen=True)
class IntRange:
    """An int in [low, high]: every `step`-th from low, or log-uniform (`log=True`, step 1)."""

    low: int
    high: int
    step: int = 1
    log: bool = False

    def __post_init__(self):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (self.low, self.high, self.step)):
            raise SearchSpaceError(f"{self}: LOW, HIGH and STEP must be ints; use uniform for floats.")
        _check_bounds(str(self), self.low, self.high, log=self.log)
        if not 0 < self.step <= self.high - self.low:
            raise SearchSpaceError(f"{self}: STEP must be in [1, HIGH - LOW], got {self.step}.")
        if self.log and self.step != 1:
            raise SearchSpaceError(f"{self}: a log-scaled int range takes no STEP.")

    def suggest(self, trial: Trial, name: str) -> int:
        return trial.suggest_int(name, self.low, self.high, step=self.step, log=self.log)

    def contains(self, value: Any) -> bool:
        return (
            _is_number(value)
            and value == int(value)
            and self.low <= value <= self.high
            and not ((int(value) - self.low) % self.step)
        )

    def ends(self) -> tuple[int, ...]:
        return (self.low, self.high - (self.high - self.low) % self.step)

    def __str__(self) -> str:
        if self.log:
            return f"logint:{self.low}:{self.high}"
        return f"int:{self.low}:{self.high}" + (f":{self.step}" if self.step != 1 else "")


@dataclasses.dataclass(frozen=True)
class Choice:
    """One of a few values (an activation, a norm kind, a batch size); the only domain a grid
    search takes."""

    values: tuple[Scalar, ...]

    def __post_init__(self):
        object.__setattr__(self, "values", tuple(self.values))
        if len(self.values) < 2:
            raise SearchSpaceError(f"{self}: a choice needs at least two values.")
        if len(set(map(repr, self.values))) != len(self.values):
            raise SearchSpaceError(f"{self}: a value is listed twice.")
        bad = [v for v in self.values if not isinstance(v, bool | int | float | str | type(None))]
        if bad:
            raise SearchSpaceError(f"{self}: values must be numbers, strings, booleans or None, got {bad[0]!r}.")

    def suggest(self, trial: Trial, name: str) -> Scalar:
        return trial.suggest_categorical(name, self.values)

    def contains(self, value: Any) -> bool:
        return any(type(value) is type(v) and value == v for v in self.values)

    def ends(self) -> tuple[Scalar, ...]:
        return self.values

    def __str__(self) -> str:
        return "choice:" + ",".join("none" if v is None else str(v) for v in self.values)


Domain = LogUniform | Uniform | IntRange | Choice


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def canonical_path(path: str) -> str:
    """`learner.learning-rate` -> `learner.learning_rate` (config field names)."""
    parts = path.strip().removeprefix("--").split(".")
    if not path.strip() or any(not p for p in parts):
        raise SearchSpaceError(f"search space path {path!r}: expected a dotted field path, e.g. learner.learning_rate.")
    return ".".join(p.replace("-", "_") for p in parts)


def flag(path: str) -> str:
    """The CLI flag of a canonical path: `learner.learning_rate` -> `--learner.learning-rate`."""
    return "--" + path.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """params: {dotted field path: domain}. metric / direction: the eval metric the study
    optimises and whether lower ("minimize") or higher ("maximize") is better. overrides: CLI
    flags every trial gets before the user's own (frequent evals to prune on, say)."""

    params: Mapping[str, Domain]
    metric: str = "loss"
    direction: Literal["minimize", "maximize"] = "minimize"
    overrides: tuple[str, ...] = ()

    def __post_init__(self):
        params = {}
        for path, domain in dict(self.params).items():
            if not isinstance(domain, LogUniform | Uniform | IntRange | Choice):
                raise SearchSpaceError(
                    f"search space {path}: {domain!r} is not a domain; use LogUniform, Uniform, IntRange or Choice."
                )
            key = canonical_path(path)
            if key in params:
                raise SearchSpaceError(f"search space: {path!r} is given twice.")
            params[key] = domain
        object.__setattr__(self, "params", params)
        object.__setattr__(self, "overrides", tuple(self.overrides))
        if self.direction not in ("minimize", "maximize"):
            raise SearchSpaceError(f"search space direction={self.direction!r} is not 'minimize' or 'maximize'.")
        if not self.metric:
            raise SearchSpaceError("search space metric is empty; name an eval metric such as loss.")

    def replace(self, **changes: Any) -> SearchSpace:
        return dataclasses.replace(self, **changes)

    def suggest(self, trial: Trial) -> dict[str, Scalar]:
        """One value per path, asked of `trial` (named by the canonical path)."""
        return {path: domain.suggest(trial, path) for path, domain in self.params.items()}

    def describe(self) -> dict[str, str]:
        """{path: domain text}: what a study records to recognise its space on a rerun."""
        return {path: str(domain) for path, domain in sorted(self.params.items())}


def parse_param(text: str) -> tuple[str, Domain]:
    """`PATH=DOMAIN` (the tuner's `--param`) -> (canonical path, domain)."""
    path, eq, spec = text.partition("=")
    if not eq or not spec:
        raise SearchSpaceError(
            f"--param {text!r}: expected PATH=DOMAIN, e.g. --param learner.learning_rate=loguniform:1e-4:1e-2."
        )
    kind, _, rest = spec.partition(":")
    args = rest.split(":") if rest else []
    where = f"--param {text!r}"
    try:
        if kind == "loguniform" and len(args) == 2:
            return canonical_path(path), LogUniform(float(args[0]), float(args[1]))
        if kind == "uniform" and len(args) in (2, 3):
            step = float(args[2]) if len(args) == 3 else None
            return canonical_path(path), Uniform(float(args[0]), float(args[1]), step)
        if kind in ("int", "logint") and len(args) in (2, 3) and not (kind == "logint" and len(args) == 3):
            return canonical_path(path), IntRange(*(int(a) for a in args), log=kind == "logint")
        if kind == "choice" and rest:
            return canonical_path(path), Choice(tuple(_scalar(v) for v in rest.split(",")))
    except ValueError as e:
        if isinstance(e, SearchSpaceError):
            raise SearchSpaceError(f"{where}: {e}") from None
        raise SearchSpaceError(f"{where}: {e}; the bounds must be numbers.") from None
    raise SearchSpaceError(
        f"{where}: unknown domain {spec!r}; use loguniform:LOW:HIGH, uniform:LOW:HIGH[:STEP], int:LOW:HIGH[:STEP], "
        "logint:LOW:HIGH or choice:A,B,..."
    )


def _scalar(text: str) -> Scalar:
    """A choice's value as written: an int, a float, true/false, none, else the string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text.strip()
