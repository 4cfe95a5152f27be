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

from typing import ClassVar

import optax

from pax_eqx.config import ConfigError, Variant, check_range, config


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
    """Adafactor with optax's defaults: factored second moments of parameters with both dimensions
    >= 128, decay 0.8, update clipping at RMS 1, relative step size."""

    kind: ClassVar[str] = "adafactor"

    def direction(self) -> optax.GradientTransformation:
        # optax.adafactor's pieces, in its order, less its learning rate and sign flip.
        return optax.chain(
            optax.scale_by_factored_rms(), optax.clip_by_block_rms(1.0), optax.scale_by_param_block_rms()
        )


OptimizerConfig = AdamWConfig | AdamConfig | SgdConfig | LionConfig | AdafactorConfig
"""The choice of an optimizer (`--learner.optimizer sgd`)."""

OPTIMIZERS: dict[str, type] = {c.kind: c for c in (AdamWConfig, AdamConfig, SgdConfig, LionConfig, AdafactorConfig)}
