"""The optimizer choice: one config per optimizer, each holding only the hyperparameters it reads.

    LearnerConfig(optimizer=AdamWConfig(b2=0.95), learning_rate=2e-4, ...)
    --learner.optimizer sgd --learner.optimizer.momentum 0.0        (the command line)

What every optimizer shares (the learning rate and its schedule, clipping, weight decay, L2,
EMA, microbatching) stays on `LearnerConfig`, so switching the optimizer keeps it. Each config
gives the optimizer's *direction*: the optax transformation between the coupled L2 and the
decoupled weight decay of the learner's chain (`optimizers.py`); the learning rate comes last.
Adam and AdamW share their moments' fields (a common base class), so a switch between them
keeps b1, b2, eps and eps_root; any other switch starts at the new optimizer's defaults.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import optax

from pax_eqx.config import ConfigError, Variant, check_range, config
from pax_eqx.learners import factored_rms, quantized_momentum


@config
class _Optimizer(Variant):
    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""

    @property
    def has_weight_decay(self) -> bool:
        """Whether the learner's decoupled weight decay may go with this optimizer."""
        return True

    def direction(self) -> optax.GradientTransformation:
        """The optax transformation this optimizer applies to the (clipped, L2-added) gradient.
        Every optimizer config below defines it; `_Optimizer` itself is never chosen."""
        raise TypeError(f"{type(self).__name__} is not an optimizer; choose one of {', '.join(OPTIMIZERS)}.")


@config
class _AdamMoments(_Optimizer):
    """b1, b2: the decays of the first and second moments. eps: the epsilon added to the root.
    eps_root: the epsilon inside the square root, m / (sqrt(v + eps_root) + eps) (Pax's
    epsilon_root; 0 = off)."""

    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    eps_root: float = 0.0

    def validate(self) -> None:
        check_range(self, ("b1", "b2"), ge=0, lt=1, prefix="learner.optimizer")
        check_range(self, ("eps", "eps_root"), ge=0, prefix="learner.optimizer", note="0 = off")

    def direction(self) -> optax.GradientTransformation:
        return optax.scale_by_adam(b1=self.b1, b2=self.b2, eps=self.eps, eps_root=self.eps_root)


@config
class AdamConfig(_AdamMoments):
    """Adam without weight decay (optax.adam); its fields are Adam's moments (`_AdamMoments`)."""

    kind: ClassVar[str] = "adam"

    @property
    def has_weight_decay(self) -> bool:
        return False


@config
class AdamWConfig(_AdamMoments):
    """Adam with the learner's decoupled weight decay (optax.adamw); its fields are Adam's moments
    (`_AdamMoments`)."""

    kind: ClassVar[str] = "adamw"


@config
class LionConfig(_Optimizer):
    """Lion (optax.lion): the sign of an interpolation of momentum and gradient.

    b1: the interpolation's weight of the momentum. b2: the momentum's decay (the paper's 0.99).
    """

    kind: ClassVar[str] = "lion"
    b1: float = 0.9
    b2: float = 0.99

    def validate(self) -> None:
        check_range(self, ("b1", "b2"), ge=0, lt=1, prefix="learner.optimizer")

    def direction(self) -> optax.GradientTransformation:
        return optax.scale_by_lion(b1=self.b1, b2=self.b2)


@config
class SgdConfig(_Optimizer):
    """SGD (optax.sgd). momentum: the momentum's decay (0 = plain SGD). nesterov: Nesterov momentum."""

    kind: ClassVar[str] = "sgd"
    momentum: float = 0.9
    nesterov: bool = False

    def validate(self) -> None:
        check_range(self, "momentum", ge=0, lt=1, prefix="learner.optimizer")
        if self.nesterov and self.momentum == 0.0:
            raise ConfigError(
                "learner.optimizer.nesterov=True has no effect with learner.optimizer.momentum=0 (plain SGD); set "
                "momentum > 0 or nesterov=False."
            )

    def direction(self) -> optax.GradientTransformation:
        if self.momentum > 0:
            return optax.trace(decay=self.momentum, nesterov=self.nesterov)
        return optax.identity()


@config
class AdafactorConfig(_Optimizer):
    """Adafactor: factored second moments, update clipping at RMS 1. The defaults are
    optax.adafactor's (T5X's): pow decay 0.8, relative step size, no momentum, factoring the two
    largest dimensions when both are >= 128.

    decay_method, decay_rate: the second moments' decay at 0-based step t: "pow":
        1 - (t + 1)^-decay_rate (optax's decay_rate; Praxis' decay_method="pow", decay_pow);
        "adam": decay_rate (1 - decay_rate^t) / (1 - decay_rate^(t + 1)), Adam's beta2 with its
        bias correction folded in (Praxis' decay_method="adam", decay_adam).
    beta1: the momentum's decay (Praxis' beta1, optax's momentum; 0 = no momentum): an
        exponential moving average, without bias correction, of the updates, computed in
        float32. It averages the updates before the learning rate multiplies them, so it equals
        Praxis' and optax's (which average lr * update) under a constant rate only.
    momentum_dtype: how beta1's momentum is kept between steps (Praxis' quantized_dtype):
        "float32" (optax.ema's state; Praxis' quantized_dtype="float32"), "int8" (Praxis'
        default: int8 values with a float32 scale per slice along the parameter's first axis,
        `quantized_momentum`), "int16", or "bfloat16". The default stays float32, as optax's
        (and as every pax_eqx run before this field), so no experiment's numbers move by
        default; the experiments that reproduce a Pax recipe built on ShardedAdafactor's
        defaults set "int8" (experiments/bert.py's set_default_adafactor, nvidia.py's
        NVIDIA_ADAFACTOR). With beta1 = 0 there is nothing to store: any value but float32 is refused.
    multiply_by_parameter_scale: multiply each tensor's update by its parameter's RMS (at least
        1e-3): Adafactor's relative step size (optax's default; Praxis' ShardedAdafactor's is False).
    factored_dims: the dimensions a >= 2-D parameter's second moment is factored over: "largest"
        (its two largest, when both are >= 128, else a full second moment: optax, T5X, Praxis'
        sort_factored_second_moment_dims=True) or "last" (its last two, whatever their size:
        Praxis' ShardedAdafactor default, `factored_rms.scale_by_last_dims_factored_rms`).

    Pax's LM recipe (paxml model_params.set_default_adafactor: decay_method="adam",
    decay_adam=0.99, beta1=0.9, weight_decay=wd) is AdafactorConfig(decay_method="adam",
    decay_rate=0.99, beta1=0.9, multiply_by_parameter_scale=False, factored_dims="last",
    momentum_dtype="int8") with the learner's weight_decay=wd, weight_decay_mask="all"
    (tests/praxis/test_praxis_optimizers.py, test_praxis_quantized_momentum.py).
    """

    kind: ClassVar[str] = "adafactor"
    decay_method: Literal["pow", "adam"] = "pow"
    decay_rate: float = 0.8
    beta1: float = 0.0
    multiply_by_parameter_scale: bool = True
    factored_dims: Literal["largest", "last"] = "largest"
    momentum_dtype: Literal["float32", "bfloat16", "int8", "int16"] = "float32"

    def validate(self) -> None:
        for name, choices in (
            ("decay_method", ("pow", "adam")),
            ("factored_dims", ("largest", "last")),
            ("momentum_dtype", ("float32", "bfloat16", "int8", "int16")),
        ):
            if getattr(self, name) not in choices:
                raise ConfigError(f"learner.optimizer.{name}={getattr(self, name)!r} is not one of {choices}.")
        if self.momentum_dtype != "float32" and self.beta1 == 0.0:
            raise ConfigError(
                f"learner.optimizer.momentum_dtype={self.momentum_dtype!r} has no effect with "
                "learner.optimizer.beta1=0 (no momentum); set beta1 > 0 (Pax's LM recipe: 0.9) or "
                "momentum_dtype='float32'."
            )
        if self.decay_method == "pow":
            check_range(self, "decay_rate", gt=0, le=1, prefix="learner.optimizer", note="the pow decay's exponent")
        else:
            check_range(self, "decay_rate", gt=0, lt=1, prefix="learner.optimizer", note="Adam's beta2")
        check_range(self, "beta1", ge=0, lt=1, prefix="learner.optimizer", note="0 = no momentum")

    def direction(self) -> optax.GradientTransformation:
        # optax.adafactor's pieces, in its order, less its learning rate and sign flip.
        decay = {} if self.decay_method == "pow" else {"decay_rate_fn": factored_rms.decay_rate_adam}
        if self.factored_dims == "largest":
            rms = optax.scale_by_factored_rms(decay_rate=self.decay_rate, **decay)
        else:
            rms = factored_rms.scale_by_last_dims_factored_rms(decay_rate=self.decay_rate, **decay)
        parts = [rms, optax.clip_by_block_rms(1.0)]
        if self.multiply_by_parameter_scale:
            parts.append(optax.scale_by_param_block_rms())
        if self.beta1 > 0 and self.momentum_dtype == "float32":
            parts.append(optax.ema(self.beta1, debias=False))
        elif self.beta1 > 0:
            parts.append(quantized_momentum.quantized_ema(self.beta1, self.momentum_dtype))
        return optax.chain(*parts)


OptimizerConfig = AdamWConfig | AdamConfig | SgdConfig | LionConfig | AdafactorConfig
"""The choice of an optimizer (`--learner.optimizer sgd`)."""

OPTIMIZERS: dict[str, type] = {c.kind: c for c in (AdamWConfig, AdamConfig, SgdConfig, LionConfig, AdafactorConfig)}
