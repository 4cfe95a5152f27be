"""Dropout, drop-path and StochasticResidual (praxis.layers.stochastics).

All draw randomness only in TRAIN mode and only when their rate is non-zero, so EVAL and
DECODE need no key and a zero-rate layer costs nothing.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from pax_eqx.config import Config, check_range, config
from pax_eqx.layers.base import Context


@config
class DropoutConfig(Config):
    """rate: probability of zeroing an element; kept elements are scaled by 1/(1-rate)."""

    rate: float = 0.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_range(self, "rate", ge=0, lt=1)

    def build(self, key=None) -> Dropout:
        return Dropout(self.rate)


class Dropout(eqx.Module):
    rate: float = eqx.field(static=True)

    def __call__(self, x: Float[Array, "*shape"], ctx: Context) -> tuple[Float[Array, "*shape"], Context]:
        if self.rate == 0.0 or not ctx.is_training:
            return x, ctx
        key, ctx = ctx.next_key()
        keep = jax.random.bernoulli(key, 1.0 - self.rate, x.shape)
        return jnp.where(keep, x / (1.0 - self.rate), jnp.zeros_like(x)), ctx


def drop_path(
    residual: Float[Array, "batch ..."], survival_prob: float | Float[Array, ""], ctx: Context
) -> tuple[Float[Array, "batch ..."], Context]:
    """Stochastic depth: each example's whole `residual` kept with probability `survival_prob`
    and divided by it, else zeroed (Praxis' StochasticResidual._drop_connect), so its expectation
    is the residual itself and eval needs no rescaling. TRAIN mode only; identity otherwise.

    survival_prob may be traced (a scanned stack's per-layer schedule); a Python 1.0 draws nothing.
    """
    if not ctx.is_training or (isinstance(survival_prob, float) and survival_prob == 1.0):
        return residual, ctx
    key, ctx = ctx.next_key()
    shape = (residual.shape[0],) + (1,) * (residual.ndim - 1)
    keep = jax.random.bernoulli(key, survival_prob, shape)
    return residual * (keep / survival_prob).astype(residual.dtype), ctx


@config
class StochasticResidualConfig(Config):
    """y = x + residual_weight * residual, the residual dropped per example with prob 1 - survival_prob."""

    residual_weight: float = 1.0
    survival_prob: float = 1.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_range(self, "residual_weight")
        check_range(self, "survival_prob", gt=0, le=1)

    def build(self, key=None) -> StochasticResidual:
        return StochasticResidual(self.residual_weight, self.survival_prob)


class StochasticResidual(eqx.Module):
    residual_weight: float = eqx.field(static=True)
    survival_prob: float = eqx.field(static=True)

    def __call__(
        self, x: Float[Array, "batch ..."], residual: Float[Array, "batch ..."], ctx: Context
    ) -> tuple[Float[Array, "batch ..."], Context]:
        residual, ctx = drop_path(residual, self.survival_prob, ctx)
        return x + self.residual_weight * residual, ctx
