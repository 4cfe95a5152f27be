"""LayerNorm, RmsNorm, RmsNormNoScale (praxis.layers.normalizations); BatchNorm is its own file.

Praxis conventions kept on purpose: LayerNorm's scale is stored as an offset from one
(`y = norm(x) * (1 + scale) + bias`, scale initialised to 0) so weight decay pulls it towards
the identity, and epsilon defaults to 1e-6. Statistics are computed in float32 whatever the
input dtype (bf16 variances lose too much precision), and the result is cast back.
"""

from __future__ import annotations

import typing
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, config

NormKind = Literal["layer_norm", "rms_norm", "rms_norm_no_scale"]


@config
class NormConfig(Config):
    """A normalisation over the last dimension.

    kind: "layer_norm" (Praxis LayerNorm), "rms_norm" (RmsNorm, y = x/rms(x) * scale) or
      "rms_norm_no_scale" (RmsNormNoScale).
    dims: size of the last dimension (set by the parent layer).
    epsilon: added to the variance.
    use_scale / use_bias: LayerNorm's learnable scale and bias.
    """

    kind: NormKind = "layer_norm"
    dims: int = 0
    epsilon: float = 1e-6
    use_scale: bool = True
    use_bias: bool = True

    def build(self, key: PRNGKeyArray | None = None) -> LayerNorm | RmsNorm:
        if self.dims <= 0:
            raise ValueError(f"NormConfig.dims must be > 0, got {self.dims}.")
        if self.kind not in typing.get_args(NormKind):
            raise ConfigError(
                f"NormConfig.kind={self.kind!r} is unknown; choose one of {', '.join(typing.get_args(NormKind))}."
            )
        if self.kind == "layer_norm":
            return LayerNorm(self)
        return RmsNorm(self.replace(use_scale=self.kind == "rms_norm"))


class LayerNorm(eqx.Module):
    """y = (x - mean) / sqrt(var + eps) * (1 + scale) + bias."""

    scale: Float[Array, " dims"] | None
    bias: Float[Array, " dims"] | None
    epsilon: float = eqx.field(static=True)

    def __init__(self, cfg: NormConfig):
        self.scale = jnp.zeros((cfg.dims,), jnp.float32) if cfg.use_scale else None
        self.bias = jnp.zeros((cfg.dims,), jnp.float32) if cfg.use_bias else None
        self.epsilon = cfg.epsilon

    def __call__(self, x: Float[Array, "*batch dims"]) -> Float[Array, "*batch dims"]:
        xf = x.astype(jnp.float32)
        mean = jnp.mean(xf, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
        y = (xf - mean) * jax.lax.rsqrt(var + self.epsilon)
        if self.scale is not None:
            y = y * (1.0 + self.scale)
        if self.bias is not None:
            y = y + self.bias
        return y.astype(x.dtype)

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {"scale": ("embed",), "bias": ("embed",)}


class RmsNorm(eqx.Module):
    """y = x / sqrt(mean(x^2) + eps) * scale (scale initialised to 1; absent for NoScale)."""

    scale: Float[Array, " dims"] | None
    epsilon: float = eqx.field(static=True)

    def __init__(self, cfg: NormConfig):
        self.scale = jnp.ones((cfg.dims,), jnp.float32) if cfg.use_scale else None
        self.epsilon = cfg.epsilon

    def __call__(self, x: Float[Array, "*batch dims"]) -> Float[Array, "*batch dims"]:
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + self.epsilon)
        if self.scale is not None:
            y = y * self.scale
        return y.astype(x.dtype)

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {"scale": ("embed",)}


def rms_norm_no_scale(dims: int, epsilon: float = 1e-6) -> NormConfig:
    return NormConfig(kind="rms_norm_no_scale", dims=dims, epsilon=epsilon)
