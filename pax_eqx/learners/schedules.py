"""Learning-rate schedules (praxis.schedules), built from optax's schedule functions.

As in Pax, the learning rate at a step is `learner.learning_rate x schedule(step)`: the
schedule is a multiplier. Every kind has the same three phases, and the same field names as
Pax's `LinearRampup*Decay` schedules:

    [0, warmup_steps)              linear ramp from 0 to `max`
    [warmup_steps, decay_start)    hold at `max` (no hold when decay_start <= warmup_steps)
    [decay_start, decay_end]       decay from `max` to `max * min_ratio`, then hold there

`decay_start = 0` means "decay right after warmup", `decay_end = 0` "at the end of the run"
(train.num_steps, filled in by the experiment): an experiment whose length is not part of its
definition (shakespeare_char) leaves it 0, so `--train.num-steps 500` decays over 500 steps
instead of stopping at 90% of the peak on the way to 2000; Pax's experiments keep the steps they
publish. A run that ends before its decay does (a decay_end past train.num_steps, a warm-up
longer than the run) is not an error, but it is said: `note_for_run` is the banner's line.
The decay of each kind:

    kind          decay phase, t = step - start, T = decay_end - start     Pax equivalent
    constant      none: stays at `max`                                      Constant
    cosine        max * (r + (1 - r) * (1 + cos(pi * t / T)) / 2)          LinearRampupCosineDecay
    linear        max * (1 - (1 - r) * t / T)                               LinearRampupPolynomialDecay(power=1)
    exponential   max * r ** (t / T)   (geometric interpolation)            LinearRampupExponentialDecay
    rsqrt         max * sqrt(start / step)   (no floor, no decay_end)       LinearRampupSqrtDecay
    piecewise     max * values[i] from step boundaries[i] on (max before)   LinearRampupPiecewiseConstant

with `r = min_ratio` and `start = max(warmup_steps, decay_start)`. `exponential` *is* Pax's
LinearRampupExponentialDecay and `cosine` its LinearRampupCosineDecay (start_step 0),
parameter for parameter; `linear_rampup_exponential_decay(...)` and
`linear_rampup_cosine_decay(...)` spell them with Pax's names. With no hold, `cosine` equals
`optax.warmup_cosine_decay_schedule(0, max, warmup_steps, decay_end, max * min_ratio)`.
`rsqrt` matches Pax's LinearRampupSqrtDecay(peak=max, warmup_steps) at every step >= 1 (Pax
clamps step 0 to 1; here step 0 is the start of the linear ramp, 0).

`ScheduleConfig` is a choice (`config.Variant`): one class per kind, each with only the fields
it reads (`--learner.schedule cosine`, `--learner.schedule.decay-end 5000`). warmup_steps and
max are every kind's, so a switch keeps them.
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, ArrayLike, Float

from pax_eqx.config import ConfigError, Variant, check_range, config


@config
class _Schedule(Variant):
    """What every schedule reads. warmup_steps: linear ramp from 0 to `max` over this many steps
    (0 = start at `max`). max: the peak multiplier of the base learning rate (Pax's `max`)."""

    warmup_steps: int = 0
    max: float = 1.0

    def __post_init__(self) -> None:
        self.validate()

    @property
    def follows_num_steps(self) -> bool:
        """Whether the decay ends at train.num_steps (a decaying kind with decay_end 0): only the
        experiment knows that step, so `resolve(num_steps)` must fill it in before `build_schedule`."""
        return False

    def resolve(self, num_steps: int) -> _Schedule:
        """This schedule with decay_end = num_steps if it follows train.num_steps, else itself."""
        return self

    def note_for_run(self, num_steps: int) -> str | None:
        """One line for a run of `num_steps` that ends before this schedule would have it end (in
        the warm-up, before the decay starts, or before the decay ends), saying where the schedule
        goes, the learning rate the run ends at and the flag that changes it; None when the run
        sees its schedule through. Said rather than refused: a short run on a long schedule is a
        fair choice (a smoke test, a run to be extended), only a silent one misleads."""
        resolved = self.resolve(num_steps)
        decay_end = getattr(resolved, "decay_end", 0)  # only a decaying schedule ends
        flag = "--learner.schedule.decay-start" if self.decay_begins > self.warmup_steps else "the warm-up"
        if num_steps < self.warmup_steps:
            where, fix = f"the warm-up ends at step {self.warmup_steps}", "lower --learner.schedule.warmup-steps"
        elif num_steps >= decay_end:
            return None
        elif self.follows_num_steps:  # decay_end 0, and the run ends before the decay starts
            where, fix = f"the decay starts at step {self.decay_begins}", f"lower {flag}"
        else:
            where = f"the schedule decays until step {decay_end}"
            fix = "--learner.schedule.decay-end 0 ties it to the run"
        at_end = _percent_of_peak(resolved, num_steps - 1)  # the last update's rate, as metrics.jsonl logs it
        return f"{where}, after this run's last step {num_steps} (learning rate at the end: {at_end} of peak); {fix}"

    @property
    def decay_begins(self) -> int:
        """The first step of the decay phase: max(warmup_steps, decay_start)."""
        return max(self.warmup_steps, getattr(self, "decay_start", 0))

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        check_range(self, "warmup_steps", ge=0, prefix="learner.schedule")
        check_range(self, "max", gt=0, prefix="learner.schedule")

    def _check_decay_start(self) -> None:
        check_range(self, "decay_start", ge=0, prefix="learner.schedule")
        if 0 < self.decay_start < self.warmup_steps:
            raise ConfigError(
                f"learner.schedule.decay_start={self.decay_start} is before the end of warmup_steps="
                f"{self.warmup_steps}; set decay_start >= warmup_steps, or 0 to decay right after warmup."
            )


@config
class ConstantSchedule(_Schedule):
    """Linear warmup, then `max` for ever (Pax's Constant). warmup_steps / max: as every schedule's."""

    kind: ClassVar[str] = "constant"


@config
class _Decaying(_Schedule):
    """A warmup, a hold, then a decay from `max` to `max * min_ratio` at decay_end.

    decay_start: the step the decay starts (0 = when warmup ends); must be >= warmup_steps.
    decay_end: the step the decay reaches `max * min_ratio`; 0 = the run's last step,
      train.num_steps (the experiment fills it in: `ExperimentConfig.resolved_learner`).
    min_ratio: the floor, as a fraction of `max`.
    """

    decay_start: int = 0
    decay_end: int = 0
    min_ratio: float = 0.01

    @property
    def follows_num_steps(self) -> bool:
        return self.decay_end == 0

    def resolve(self, num_steps: int) -> _Decaying:
        if not self.follows_num_steps:
            return self
        # A run that ends before the decay starts (6 steps of a 100-step warm-up) never reaches
        # it: the decay goes right after its start, to build, and `note_for_run` says so.
        return self.replace(decay_end=max(num_steps, self.decay_begins + 1))

    def validate(self) -> None:
        super().validate()
        self._check_decay_start()
        check_range(self, "decay_end", ge=0, prefix="learner.schedule", note="0 = train.num_steps")
        check_range(self, "min_ratio", ge=0, le=1, prefix="learner.schedule")
        if 0 < self.decay_end <= self.decay_begins:
            raise ConfigError(
                f"learner.schedule.decay_end={self.decay_end} must be after the step the {self.kind!r} decay "
                f"starts ({self.decay_begins} = max(warmup_steps, decay_start)); set decay_end to the step "
                "where the decay should reach max * min_ratio, or 0 for train.num_steps."
            )


@config
class CosineSchedule(_Decaying):
    """Cosine decay: max * (r + (1 - r) * (1 + cos(pi * t / T)) / 2) (Pax's LinearRampupCosineDecay)."""

    kind: ClassVar[str] = "cosine"


@config
class LinearSchedule(_Decaying):
    """Linear decay: max * (1 - (1 - r) * t / T) (Pax's LinearRampupPolynomialDecay, power 1)."""

    kind: ClassVar[str] = "linear"


@config
class ExponentialSchedule(_Decaying):
    """Geometric decay: max * r ** (t / T) (Pax's LinearRampupExponentialDecay). min_ratio: > 0."""

    kind: ClassVar[str] = "exponential"

    def validate(self) -> None:
        super().validate()
        if self.min_ratio <= 0.0:
            raise ConfigError(
                f"learner.schedule.min_ratio must be > 0 for the 'exponential' schedule (it decays geometrically "
                f"towards it), got {self.min_ratio}."
            )


@config
class RsqrtSchedule(_Schedule):
    """Inverse square root: max * sqrt(start / step) from start = max(warmup_steps, decay_start) on,
    no floor and no end (Pax's LinearRampupSqrtDecay).

    decay_start: the step the decay starts (0 = when warmup ends); must be >= warmup_steps.
    """

    kind: ClassVar[str] = "rsqrt"
    decay_start: int = 0

    def validate(self) -> None:
        super().validate()
        self._check_decay_start()
        if self.decay_begins < 1:
            raise ConfigError(
                "learner.schedule: the 'rsqrt' schedule decays as sqrt(start / step) and needs warmup_steps or "
                "decay_start >= 1, got both 0."
            )


@config
class PiecewiseSchedule(_Schedule):
    """Constant pieces after the warmup (Pax's LinearRampupPiecewiseConstant).

    boundaries / values: from step boundaries[i] on, the multiplier is max * values[i] (increasing
      steps, all after warmup; one value per boundary). Pax's LinearRampupPiecewiseConstant(
      boundaries=[w, b0, b1, ...], values=[v, v0, v1, ...]) is warmup_steps=w, max=v,
      boundaries=(b0, b1, ...), values=(v0/v, v1/v, ...).
    """

    kind: ClassVar[str] = "piecewise"
    boundaries: tuple[int, ...] = ()  # required: a piecewise schedule without pieces means nothing
    values: tuple[float, ...] = ()

    def validate(self) -> None:
        super().validate()
        check_range(self, "boundaries", ge=0, prefix="learner.schedule")
        check_range(self, "values", ge=0, prefix="learner.schedule")
        if not self.boundaries or len(self.values) != len(self.boundaries):
            raise ConfigError(
                f"learner.schedule: the 'piecewise' schedule needs boundaries and one value per boundary, got "
                f"boundaries={list(self.boundaries)}, values={list(self.values)}."
            )
        steps = (self.warmup_steps, *self.boundaries)
        if any(b <= a for a, b in zip(steps, steps[1:])):
            raise ConfigError(
                f"learner.schedule.boundaries={list(self.boundaries)} must increase, after warmup_steps="
                f"{self.warmup_steps}."
            )


ScheduleConfig = (
    ConstantSchedule | CosineSchedule | LinearSchedule | ExponentialSchedule | RsqrtSchedule | PiecewiseSchedule
)
"""The choice of a learning-rate schedule (`--learner.schedule cosine`)."""


def linear_rampup_exponential_decay(
    *, warmup_steps: int = 0, decay_start: int = 0, decay_end: int = 0, min_ratio: float = 0.01, max: float
) -> ExponentialSchedule:
    """Pax's `schedules.LinearRampupExponentialDecay`, with Pax's parameters and semantics."""
    return ExponentialSchedule(
        warmup_steps=warmup_steps, decay_start=decay_start, decay_end=decay_end, min_ratio=min_ratio, max=max
    )


def linear_rampup_cosine_decay(
    *, warmup_steps: int = 0, decay_start: int = 0, decay_end: int = 0, min_ratio: float = 0.01, max: float
) -> CosineSchedule:
    """Pax's `schedules.LinearRampupCosineDecay` (start_step 0), with Pax's parameters and semantics."""
    return CosineSchedule(
        warmup_steps=warmup_steps, decay_start=decay_start, decay_end=decay_end, min_ratio=min_ratio, max=max
    )


def build_schedule(cfg: ScheduleConfig, scale: float = 1.0) -> optax.Schedule:
    """`step -> scale * multiplier(step)` as a float32 scalar; `scale` is the base learning rate.

    A decaying schedule must end somewhere: decay_end 0 (follow train.num_steps) is resolved by
    the experiment first (`ExperimentConfig.resolved_learner`, `ScheduleConfig.resolve`).

    The phases are joined with `optax.join_schedules`, which hands each piece the steps since
    its own start; zero-length phases are left out (as Pax does).
    """
    if cfg.follows_num_steps:
        raise ConfigError(
            f"learner.schedule.decay_end=0 with the {cfg.kind!r} schedule means train.num_steps, which "
            "the schedule alone does not know: build it from ExperimentConfig.resolved_learner() (the programs "
            "do), or the schedule's resolve(num_steps), or set learner.schedule.decay_end."
        )
    peak = scale * cfg.max
    start = cfg.decay_begins
    pieces, boundaries = [], []
    if cfg.warmup_steps > 0:
        pieces.append(optax.linear_schedule(0.0, peak, cfg.warmup_steps))
        boundaries.append(cfg.warmup_steps)
    if start > cfg.warmup_steps:
        pieces.append(optax.constant_schedule(peak))
        boundaries.append(start)
    pieces.append(_decay(cfg, peak, start))
    schedule = optax.join_schedules(pieces, boundaries) if boundaries else pieces[0]

    def value(step: ArrayLike) -> Float[Array, ""]:
        return jnp.asarray(schedule(step), jnp.float32)

    return value


def _percent_of_peak(resolved: ScheduleConfig, step: int) -> str:
    """The multiplier at `step` as a percentage of `max` ("90.5%"), read from the schedule the
    run builds (not a second copy of its formulas)."""
    return f"{100 * float(build_schedule(resolved)(step)) / resolved.max:.3g}%"


def _decay(cfg: ScheduleConfig, peak: float, start: int) -> optax.Schedule:
    """The decay phase, as a function of the steps since `start`."""
    if cfg.kind == "constant":
        return optax.constant_schedule(peak)
    if cfg.kind == "piecewise":
        offsets = jnp.asarray([b - start for b in cfg.boundaries], jnp.int32)
        levels = jnp.asarray((1.0, *cfg.values), jnp.float32) * peak
        return lambda t: levels[jnp.searchsorted(offsets, jnp.asarray(t, jnp.int32), side="right")]
    if cfg.kind == "rsqrt":
        # sqrt(start / step) with step = start + t.
        return lambda t: peak * jax.lax.rsqrt(1.0 + jnp.asarray(t, jnp.float32) / start)
    span = cfg.decay_end - start
    if cfg.kind == "cosine":
        return optax.cosine_decay_schedule(peak, span, alpha=cfg.min_ratio)
    if cfg.kind == "linear":
        return optax.linear_schedule(peak, peak * cfg.min_ratio, span)
    return optax.exponential_decay(peak, span, cfg.min_ratio, end_value=peak * cfg.min_ratio)
