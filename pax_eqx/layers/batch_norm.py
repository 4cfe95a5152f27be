"""BatchNorm (praxis.layers.normalizations.BatchNorm) with moving statistics as state.

The moving mean and variance are non-trainable variables marked `mean_sync=True` (Pax's
REQUIRES_MEAN_SYNC): they are batch statistics, so when a step is computed in microbatches
the new values are averaged. In TRAIN mode the batch statistics normalise the input and the
moving averages are updated (`new = decay * old + (1 - decay) * batch`); in EVAL/DECODE the
moving statistics are used and the state is untouched.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from pax_eqx.config import Config, check_range, config
from pax_eqx.layers.base import Context, Variable, variable


@config
class BatchNormConfig(Config):
    """dims: channels (last dimension); decay: moving-average decay; epsilon: added to var.

    scale_init: the initial scale. The scale is applied as `(1 + gamma)` (Praxis), so gamma
      starts at `scale_init - 1`; 0.0 makes the layer output `beta` at first, which a ResNet
      block's last BatchNorm uses so that the block starts as its shortcut (Goyal et al. 2017).
    set_padded_output_to_zero: with `paddings`, output 0 at the padded positions (Praxis' default,
      whose gradients then pass nothing there); off, they are normalised like the others (the
      statistics exclude them either way).
    """

    dims: int
    decay: float = 0.999
    epsilon: float = 1e-3
    use_moving_avg_in_training: bool = False
    scale_init: float = 1.0
    set_padded_output_to_zero: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_range(self, "dims", gt=0)
        check_range(self, "decay", ge=0, le=1)
        check_range(self, "epsilon", ge=0)
        check_range(self, "scale_init")

    def build(self, key: PRNGKeyArray | None = None) -> BatchNorm:
        return BatchNorm(self)


class BatchNorm(eqx.Module):
    beta: Float[Array, " dims"]
    gamma: Float[Array, " dims"]
    moving_mean: Variable
    moving_variance: Variable
    decay: float = eqx.field(static=True)
    epsilon: float = eqx.field(static=True)
    use_moving_avg_in_training: bool = eqx.field(static=True)
    set_padded_output_to_zero: bool = eqx.field(static=True, default=False)

    def __init__(self, cfg: BatchNormConfig):
        self.beta = jnp.zeros((cfg.dims,), jnp.float32)
        # applied as (1 + gamma), as Praxis
        self.gamma = jnp.full((cfg.dims,), cfg.scale_init - 1.0, jnp.float32)
        self.moving_mean = variable(jnp.zeros((cfg.dims,), jnp.float32), mean_sync=True)
        self.moving_variance = variable(jnp.ones((cfg.dims,), jnp.float32), mean_sync=True)
        self.decay = cfg.decay
        self.epsilon = cfg.epsilon
        self.use_moving_avg_in_training = cfg.use_moving_avg_in_training
        self.set_padded_output_to_zero = cfg.set_padded_output_to_zero

    def __call__(
        self,
        x: Float[Array, "*batch dims"],
        ctx: Context,
        paddings: Float[Array, "*batch"] | None = None,
    ) -> tuple[Float[Array, "*batch dims"], Context]:
        """`paddings` (1 = padded) excludes positions from the batch statistics (and with
        `set_padded_output_to_zero` zeroes their outputs)."""
        xf = x.astype(jnp.float32)
        moving_mean, moving_var = ctx.get_var(self.moving_mean), ctx.get_var(self.moving_variance)
        if ctx.is_training:
            w = jnp.ones(x.shape[:-1], jnp.float32) if paddings is None else 1.0 - paddings
            w = w[..., None]
            axes = tuple(range(x.ndim - 1))
            count = jnp.maximum(jnp.sum(w, axes), 1.0)
            mean = jnp.sum(xf * w, axes) / count
            var = jnp.sum(jnp.square(xf - mean) * w, axes) / count
            ctx = ctx.update_var(self.moving_mean, self.decay * moving_mean + (1 - self.decay) * mean)
            ctx = ctx.update_var(self.moving_variance, self.decay * moving_var + (1 - self.decay) * var)
            if self.use_moving_avg_in_training:
                mean, var = moving_mean, moving_var
        else:
            mean, var = moving_mean, moving_var
        y = (xf - mean) * jax.lax.rsqrt(var + self.epsilon) * (1.0 + self.gamma) + self.beta
        if self.set_padded_output_to_zero and paddings is not None:
            y = y * (1.0 - paddings.astype(jnp.float32))[..., None]
        return y.astype(x.dtype), ctx

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {"beta": ("embed",), "gamma": ("embed",)}
