"""The learner: one optax transformation from one config (Pax's Learner + optimizer + schedule).

    apply_if_finite(                        only when skip_nonfinite
        clip_by_global_norm(clip_grad_norm)  only when clip_grad_norm > 0
        -> + l2_regularization * params     coupled L2 (Pax's), masked, only when > 0
        -> optimizer direction              scale_by_adam / factored RMS / lion / momentum
        -> clip_by_block_rms(clip_update_rms) per-tensor update RMS cap, only when > 0
        -> + weight_decay * params          decoupled, masked, only when weight_decay > 0
    ) -> x -learning_rate_fn(step)          the schedule, always counted

This is optax's own structure (`optax.adamw` is scale_by_adam -> add_decayed_weights ->
scale_by_learning_rate), so each optimizer equals its optax alias; the tests check that.
Decoupled weight decay is multiplied by the scheduled learning rate, as in optax.adamw and
PyTorch (optax.adafactor's `weight_decay_rate` is not; ours is, for every optimizer).

The learning-rate scaling sits *outside* the non-finite guard on purpose: its step counter
advances on skipped steps too, so the rate applied at train step `s` is always
`learning_rate_fn(cfg)(s)`, the value the train loop logs (Pax's schedules also follow the
global step). A skipped step applies a zero update and leaves every inner state (moments,
factored statistics) untouched; `skipped_steps(opt_state)` counts them, and the count is
checkpointed with the rest of the optimizer state.

Weight decay skips norms and biases by default (`weight_decay_mask="matrices"`, see
`pax_eqx.learners.decay_mask`); `weight_decay_mask="all"` decays every parameter, as Praxis'
Adam does.

Praxis' `optimizers.Adam` (sharded_adam) is this chain with `optimizer=AdamWConfig(...)`: its
bias-corrected decays give the same moments as Adam's bias correction, its update is
`m / (sqrt(v + epsilon_root) + epsilon)` (= `eps`, `eps_root`), `clip_threshold` caps each
tensor's update RMS (= `clip_update_rms`), and `weight_decay * param` is added to every
update before the learning rate (= `weight_decay` with `weight_decay_mask="all"`); Pax's
`clip_gradient_norm_to_value` is `clip_grad_norm`. `pax_adam(...)` spells it with Pax's names.

Frozen variables and per-variable learners (Pax's `bprop_variable_exclusion` and
`MultiOptimizer`) choose parameters by a regex on their name (`pax_eqx.learners.variables`):

    apply_if_finite(
        masked(set_to_zero, frozen)          frozen parameters: a zero update, no state
        -> clip_by_global_norm               over the trainable parameters only
        -> multi_transform({                 the first `variable_groups` pattern a name matches
             "default": L2 -> direction -> clip_update_rms -> weight decay,
             "group<i>": the same with group i's optimizer -> x lr_multiplier,
             "frozen": set_to_zero}))
    ) -> x -learning_rate_fn(step)

Each group's optimizer state holds only its own parameters' moments (optax's masked states),
and frozen parameters have none. The Task goes further: it differentiates only the trainable
parameters and hands the optimizer only those, so a frozen parameter is never updated (not even
by `+ 0`) and its EMA is not kept. Without `frozen` and `variable_groups` the chain (and the
optimizer state's structure, hence old checkpoints) is the plain one above.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any, Literal, get_args

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Int

from pax_eqx.config import Config, ConfigError, check_range, config, field_names
from pax_eqx.learners.decay_mask import default_decay_mask
from pax_eqx.learners.optimizer_configs import OPTIMIZERS, AdamWConfig, OptimizerConfig
from pax_eqx.learners.schedules import ConstantSchedule, ScheduleConfig, build_schedule
from pax_eqx.learners.variables import check_patterns, label_params, matches, require_matches

DecayMask = Literal["matrices", "all"]

# optax.apply_if_finite gives up (and applies a NaN update) after this many consecutive bad
# steps; the int32 counter saturates below it, so the guard never gives up.
_NEVER_GIVE_UP = 2**31 - 1


@config
class VariableGroupConfig(Config):
    """Parameters whose name fully matches `pattern` train with their own learning-rate multiplier
    and, optionally, their own optimizer (Pax's MultiOptimizer / optimizer_with_vars).

    pattern: a regex on the parameter's name (`pax_eqx.learners.variables`), e.g.
        "stack\\.layers\\.attention\\..*" or ".*norm.*".
    lr_multiplier: these parameters' learning rate is lr_multiplier * learner's lr(step).
    optimizer: None = the learner's optimizer; else an optimizer config of its own
        (`optimizer_configs`, e.g. SgdConfig(momentum=0.0)).
    """

    pattern: str = ".*"
    lr_multiplier: float = 1.0
    optimizer: OptimizerConfig | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_patterns("learner.variable_groups pattern", (self.pattern,))
        check_range(self, "lr_multiplier", gt=0, prefix="learner.variable_groups", note="use learner.frozen for 0")
        if self.optimizer is not None and not isinstance(self.optimizer, tuple(OPTIMIZERS.values())):
            raise ConfigError(
                f"learner.variable_groups optimizer={self.optimizer!r} is not an optimizer config (None = the "
                f"learner's, or one of {', '.join(c.__name__ for c in OPTIMIZERS.values())})."
            )

    @classmethod
    def migrate(cls, data: dict) -> dict:
        """An older config.json named the group's optimizer ("" = the learner's); a named one now
        starts from that optimizer's defaults."""
        name = data.get("optimizer")
        if isinstance(name, str):
            data = {**data, "optimizer": {"kind": name} if name else None}
        return data


@config
class LearnerConfig(Config):
    """optimizer: the optimizer and its own hyperparameters (`optimizer_configs`): adamw (the
        default: Adam + decoupled weight decay), adam, sgd, lion or adafactor. On the command line
        `--learner.optimizer sgd` switches it and `--learner.optimizer.momentum 0.0` sets its fields.
    learning_rate: the base rate; the schedule multiplies it (lr(step) = learning_rate * schedule(step)).
    schedule: warmup and decay of the rate: constant, cosine, linear, exponential, rsqrt or
        piecewise (`schedules`), switched with `--learner.schedule cosine`.
    weight_decay: decoupled weight decay, times the scheduled rate (0 = off; not with adam).
    l2_regularization: coupled L2 (Pax's L2_REGULARIZER_WEIGHT, Praxis' apply_l2_regularizer):
        adds l2 * w to the gradient (after clipping) before the optimizer, so momentum and Adam's
        moments see it (0 = off). Masked like weight decay.
    weight_decay_mask: which parameters decay (weight decay and L2): "matrices" (>= 2 dims per layer: no norms or
        biases) or "all" (every parameter, as Praxis' Adam and Lion do). A `decay_mask` given to
        `build_optimizer` overrides it.
    clip_update_rms: cap each tensor's update (the optimizer's direction, before weight decay and
        the learning rate) to this root-mean-square, u / max(1, rms(u) / c) (Praxis' Adam/Lion
        `clip_threshold`, optax.clip_by_block_rms; 0 = off).
    clip_grad_norm: clip the gradient to this global L2 norm before the optimizer (0 = off).
    skip_nonfinite: skip (and count) a step whose gradient has a NaN/Inf; False: the run stops.
    ema_decay: keep an exponential moving average of the parameters with this decay (0 = off).
    num_microbatches: gradient accumulation: the train step splits each batch into this many
        sequential microbatches and averages their gradients.
    frozen: regexes on parameter names (`pax_eqx.learners.variables`; re.fullmatch); a matching
        parameter gets no gradient, no optimizer state, no EMA, and keeps its value (Pax's
        bprop_variable_exclusion), e.g. ("stack\\.layers\\.attention\\..*",).
    variable_groups: per-variable learners (Pax's MultiOptimizer): `VariableGroupConfig`s, the
        first whose pattern matches a parameter decides its learning-rate multiplier and
        optimizer; unmatched parameters use this learner as it is.
    """

    optimizer: OptimizerConfig = AdamWConfig()
    learning_rate: float = 1e-3
    schedule: ScheduleConfig = ConstantSchedule()
    weight_decay: float = 0.0
    l2_regularization: float = 0.0
    weight_decay_mask: DecayMask = "matrices"
    clip_grad_norm: float = 0.0
    clip_update_rms: float = 0.0
    skip_nonfinite: bool = False
    ema_decay: float = 0.0
    num_microbatches: int = 1
    frozen: tuple[str, ...] = ()
    variable_groups: tuple[VariableGroupConfig, ...] = ()

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix (the optimizer and the
        schedule check themselves)."""
        if not isinstance(self.optimizer, tuple(OPTIMIZERS.values())):
            raise ConfigError(
                f"learner.optimizer={self.optimizer!r} is not an optimizer config; choose one of "
                f"{', '.join(OPTIMIZERS)} (--learner.optimizer NAME; in Python e.g. SgdConfig(momentum=0.9))."
            )
        lr = self.learning_rate
        if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not (math.isfinite(lr) and lr > 0):
            raise ConfigError(f"learner.learning_rate must be a finite number > 0, got {lr!r}.")
        check_range(self, "ema_decay", ge=0, lt=1, prefix="learner", note="0 = off")
        check_range(
            self, ("weight_decay", "l2_regularization", "clip_grad_norm", "clip_update_rms"),
            ge=0, prefix="learner", note="0 = off",
        )  # fmt: skip
        check_range(self, "num_microbatches", ge=1, prefix="learner", note="1 = no accumulation")
        if self.weight_decay_mask not in get_args(DecayMask):
            raise ConfigError(
                f"learner.weight_decay_mask={self.weight_decay_mask!r} is not one of {get_args(DecayMask)}."
            )
        check_patterns("learner.frozen", self.frozen)
        if not isinstance(self.variable_groups, (tuple, list)) or not all(
            isinstance(g, VariableGroupConfig) for g in self.variable_groups
        ):
            raise ConfigError(
                f"learner.variable_groups={self.variable_groups!r} must be a tuple of VariableGroupConfig(pattern=..., "
                "lr_multiplier=..., optimizer=...)."
            )
        decays = self.weight_decay > 0.0 or self.l2_regularization > 0.0
        if not decays and self.weight_decay_mask != "matrices":
            raise ConfigError(
                f"learner.weight_decay_mask={self.weight_decay_mask!r} has no effect with learner.weight_decay=0 "
                "and learner.l2_regularization=0; set one > 0 or leave weight_decay_mask at its default 'matrices'."
            )
        if not self.optimizer.has_weight_decay and self.weight_decay > 0:
            raise ConfigError(
                f"learner.weight_decay={self.weight_decay} with learner.optimizer {self.optimizer.kind!r}: plain Adam "
                "has no weight decay; switch with --learner.optimizer adamw for decoupled weight decay, or set "
                "weight_decay=0."
            )

    @classmethod
    def migrate(cls, data: dict) -> dict:
        """An older config.json held the optimizer as a name beside every optimizer's fields (b1,
        b2, eps, eps_root, momentum, nesterov; the ones it did not read at their defaults)."""
        name = data.get("optimizer")
        if not isinstance(name, str):
            return data
        moved = ("b1", "b2", "eps", "eps_root", "momentum", "nesterov")
        reads = set(field_names(OPTIMIZERS[name])) if name in OPTIMIZERS else set()
        optimizer = {"kind": name, **{k: data[k] for k in moved if k in data and k in reads}}
        return {**{k: v for k, v in data.items() if k not in moved}, "optimizer": optimizer}

    def resolve(self, num_steps: int) -> LearnerConfig:
        """This learner with its schedule's decay_end filled in (`ScheduleConfig.resolve`): what a
        run of `num_steps` steps trains with. `ExperimentConfig.resolved_learner()` calls it."""
        schedule = self.schedule.resolve(num_steps)
        return self if schedule is self.schedule else self.replace(schedule=schedule)


def learning_rate_fn(cfg: LearnerConfig) -> optax.Schedule:
    """step -> learning rate (float32): learning_rate * schedule(step), for the loop to log."""
    return build_schedule(cfg.schedule, cfg.learning_rate)


def build_optimizer(cfg: LearnerConfig, params: Any = None, *, decay_mask: Any = None) -> optax.GradientTransformation:
    """The optax transformation for `cfg` (see the module docstring for the chain).

    params: the parameters (or `eqx.filter(model, eqx.is_array)`), optional; when given with a
      `decay_mask` pytree, the mask's structure is checked against them here, not at the
      first step.
    decay_mask: which parameters get weight decay: a pytree of bools shaped like params (or
      a prefix of it), or a function params -> such a pytree; None = `cfg.weight_decay_mask`:
      "matrices" is `default_decay_mask` (no decay on arrays with < 2 dimensions per layer),
      "all" decays every array. A function is applied to the arrays the optimizer sees at
      init and at every update, so it works on abstract models.
    """
    if decay_mask is not None:
        mask = decay_mask
    else:
        mask = default_decay_mask if cfg.weight_decay_mask == "matrices" else None
    if params is not None and mask is not None and not callable(mask):
        _check_mask(mask, params)
    if params is not None:
        require_matches("learner.frozen", cfg.frozen, params)
        require_matches("learner.variable_groups", [g.pattern for g in cfg.variable_groups], params)
    if not cfg.frozen and not cfg.variable_groups:
        return _finish(cfg, [*_clip(cfg), *_inner(cfg, cfg.optimizer, mask)])
    labels = functools.partial(_labels, cfg)
    is_frozen = lambda tree: jax.tree.map(lambda label: label == "frozen", labels(tree))  # noqa: E731
    groups = {"default": optax.chain(*_inner(cfg, cfg.optimizer, mask)), "frozen": optax.set_to_zero()}
    for i, g in enumerate(cfg.variable_groups):
        inner = _inner(cfg, g.optimizer or cfg.optimizer, mask)
        groups[f"group{i}"] = optax.chain(*inner, optax.scale(g.lr_multiplier))
    return _finish(
        cfg, [optax.masked(optax.set_to_zero(), is_frozen), *_clip(cfg), optax.multi_transform(groups, labels)]
    )


def _labels(cfg: LearnerConfig, params: Any) -> Any:
    """Each parameter's label: "frozen", "group<i>" (the first matching group) or "default"."""

    def label_of(name: str) -> str:
        if any(matches(p, name) for p in cfg.frozen):
            return "frozen"
        for i, g in enumerate(cfg.variable_groups):
            if matches(g.pattern, name):
                return f"group{i}"
        return "default"

    return label_params(params, label_of)


def _clip(cfg: LearnerConfig) -> list[optax.GradientTransformation]:
    return [optax.clip_by_global_norm(cfg.clip_grad_norm)] if cfg.clip_grad_norm > 0 else []


def _inner(cfg: LearnerConfig, optimizer: OptimizerConfig, mask: Any) -> list[optax.GradientTransformation]:
    """L2 -> the optimizer's direction -> update RMS cap -> decoupled weight decay."""
    inner = []
    if cfg.l2_regularization > 0:
        inner.append(optax.add_decayed_weights(cfg.l2_regularization, mask))
    inner.append(optimizer.direction())
    if cfg.clip_update_rms > 0:
        inner.append(optax.clip_by_block_rms(cfg.clip_update_rms))
    if cfg.weight_decay > 0:
        inner.append(optax.add_decayed_weights(cfg.weight_decay, mask))
    return inner


def _finish(cfg: LearnerConfig, inner: list[optax.GradientTransformation]) -> optax.GradientTransformation:
    """The non-finite guard around `inner`, then the scheduled learning rate."""
    guarded = optax.chain(*inner)
    if cfg.skip_nonfinite:
        guarded = optax.apply_if_finite(guarded, max_consecutive_errors=_NEVER_GIVE_UP)
    return optax.chain(guarded, optax.scale_by_learning_rate(learning_rate_fn(cfg)))


def _check_mask(mask: Any, params: Any) -> None:
    try:
        jax.tree.map(lambda m, p: None, mask, params)
    except ValueError as e:
        raise ConfigError(
            f"build_optimizer: decay_mask does not match the structure of params ({e}); give one bool per "
            "array (or per subtree), or a function params -> mask."
        ) from None


def skipped_steps(opt_state: Any) -> Int[Array, ""]:
    """How many steps the non-finite guard has skipped so far (0 when skip_nonfinite is off)."""
    guards = [
        s
        for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, optax.ApplyIfFiniteState))
        if isinstance(s, optax.ApplyIfFiniteState)
    ]
    if not guards:
        return jnp.zeros((), jnp.int32)
    return guards[0].total_notfinite


def pax_adam(
    *,
    learning_rate: float,
    schedule: ScheduleConfig = ConstantSchedule(),
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-6,
    epsilon_root: float = 0.0,
    clip_threshold: float = 1.0,
    weight_decay: float = 0.0,
    clip_gradient_norm_to_value: float = 0.0,
) -> LearnerConfig:
    """Praxis' `optimizers.Adam` (sharded_adam) behind Paxml's Learner, with Pax's names and defaults.

    clip_threshold <= 0 turns the per-tensor update RMS cap off (Pax's -1.0); weight decay
    applies to every parameter, norms and biases included, as in Praxis. A step whose gradient
    has a NaN/Inf is skipped (Paxml's `Learner.check_valid_step`, on by default); one
    difference: Pax's step counter, hence its schedule, also stands still on a skipped step,
    ours moves on (see the module docstring).
    """
    return LearnerConfig(
        optimizer=AdamWConfig(b1=beta1, b2=beta2, eps=epsilon, eps_root=epsilon_root),
        learning_rate=learning_rate,
        schedule=schedule,
        weight_decay=weight_decay,
        weight_decay_mask="all" if weight_decay > 0 else "matrices",  # the mask means nothing without decay
        clip_grad_norm=clip_gradient_norm_to_value,
        clip_update_rms=max(clip_threshold, 0.0),
        skip_nonfinite=True,
    )
