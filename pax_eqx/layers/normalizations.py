"""LayerNorm, RmsNorm, RmsNormNoScale (praxis.layers.normalizations); BatchNorm is its own file.

Praxis conventions kept on purpose: LayerNorm's scale is stored as an offset from one
(`y = norm(x) * (1 + scale) + bias`, scale initialised to 0) so weight decay pulls it towards
the identity, RmsNorm's is the factor itself (`y = x / rms(x) * scale`, initialised to 1), and
epsilon defaults to 1e-6. `direct_scale` chooses the other form, as Praxis' own `direct_scale`
does (LayerNorm's defaults to False, RmsNorm's to True; None here means that default).
Statistics are computed in float32 whatever the input dtype (bf16 variances lose too much
precision), and the result is cast back.
"""

from __future__ import annotations

import difflib
import typing
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, check_range, config

NormKind = Literal["layer_norm", "rms_norm", "rms_norm_no_scale"]


@config
class NormConfig(Config):
    """A normalisation over the last dimension; the size of that dimension is not a field, the
    layer that owns the norm passes it to `build(dims)` (its model width decides it).

    kind: "layer_norm" (Praxis LayerNorm), "rms_norm" (RmsNorm, y = x/rms(x) * scale) or
      "rms_norm_no_scale" (RmsNormNoScale).
    epsilon: added to the variance.
    use_scale / use_bias: LayerNorm's learnable scale and bias (the RMS kinds have no bias, and
      their scale is chosen by the kind, so these must stay at their defaults there).
    direct_scale: Praxis' `direct_scale`: True multiplies by `scale` (initialised to 1), False by
      `1 + scale` (initialised to 0); None = the kind's Praxis default (layer_norm: False,
      rms_norm: True). A kind without a scale refuses it.
    """

    kind: NormKind = "layer_norm"
    epsilon: float = 1e-6
    use_scale: bool = True
    use_bias: bool = True
    direct_scale: bool | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        kinds = typing.get_args(NormKind)
        if self.kind not in kinds:
            close = difflib.get_close_matches(str(self.kind), kinds, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"NormConfig.kind={self.kind!r} is unknown.{hint} Choose one of {', '.join(kinds)}.")
        check_range(self, "epsilon", ge=0)
        if self.kind != "layer_norm" and not self.use_bias:
            raise ConfigError(
                f"NormConfig.use_bias=False has no effect with kind={self.kind!r} (an RMS norm has no bias); "
                "leave use_bias at its default True, or use kind='layer_norm'."
            )
        if self.kind != "layer_norm" and not self.use_scale:
            raise ConfigError(
                f"NormConfig.use_scale=False has no effect with kind={self.kind!r} (the kind decides an RMS "
                "norm's scale); use kind='rms_norm_no_scale' for an RMS norm without scale, or kind='layer_norm'."
            )
        if self.direct_scale is not None and not self.has_scale:
            raise ConfigError(
                f"NormConfig.direct_scale={self.direct_scale} has no effect with kind={self.kind!r}, "
                f"use_scale={self.use_scale} (there is no scale); leave direct_scale at None, or use a norm with a "
                "scale (kind='layer_norm' with use_scale=True, or kind='rms_norm')."
            )

    @property
    def has_scale(self) -> bool:
        return self.kind == "rms_norm" or (self.kind == "layer_norm" and self.use_scale)

    @property
    def is_direct_scale(self) -> bool:
        """Whether the scale multiplies directly: direct_scale, or the kind's Praxis default."""
        return self.kind == "rms_norm" if self.direct_scale is None else self.direct_scale

    def build(self, dims: int, key: PRNGKeyArray | None = None) -> LayerNorm | RmsNorm:
        """The norm over a last dimension of size `dims` (the owning layer's width)."""
        if dims <= 0:
            raise ConfigError(f"NormConfig.build: dims must be > 0, got {dims}.")
        if self.kind == "layer_norm":
            return LayerNorm(
                dims, epsilon=self.epsilon, use_scale=self.use_scale, use_bias=self.use_bias,
                direct_scale=self.is_direct_scale,
            )  # fmt: skip
        return RmsNorm(dims, epsilon=self.epsilon, use_scale=self.kind == "rms_norm", direct_scale=self.is_direct_scale)


class LayerNorm(eqx.Module):
    """y = (x - mean) / sqrt(var + eps) * (1 + scale) + bias (direct_scale: * scale, scale
    initialised to 1)."""

    scale: Float[Array, " dims"] | None
    bias: Float[Array, " dims"] | None
    epsilon: float = eqx.field(static=True)
    direct_scale: bool = eqx.field(static=True, default=False)

    def __init__(self, dims: int, *, epsilon: float, use_scale: bool, use_bias: bool, direct_scale: bool = False):
        self.scale = jnp.full((dims,), 1.0 if direct_scale else 0.0, jnp.float32) if use_scale else None
        self.bias = jnp.zeros((dims,), jnp.float32) if use_bias else None
        self.epsilon = epsilon
        self.direct_scale = direct_scale

    def __call__(self, x: Float[Array, "*batch dims"]) -> Float[Array, "*batch dims"]:
        xf = x.astype(jnp.float32)
        mean = jnp.mean(xf, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
        y = (xf - mean) * jax.lax.rsqrt(var + self.epsilon)
        if self.scale is not None:
            y = y * (self.scale if self.direct_scale else 1.0 + self.scale)
        if self.bias is not None:
            y = y + self.bias
        return y.astype(x.dtype)

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {"scale": ("embed",), "bias": ("embed",)}


class RmsNorm(eqx.Module):
    """y = x / sqrt(mean(x^2) + eps) * scale (scale initialised to 1; absent for NoScale);
    direct_scale=False: * (1 + scale), scale initialised to 0."""

    scale: Float[Array, " dims"] | None
    epsilon: float = eqx.field(static=True)
    direct_scale: bool = eqx.field(static=True, default=True)

    def __init__(self, dims: int, *, epsilon: float, use_scale: bool, direct_scale: bool = True):
        self.scale = jnp.full((dims,), 1.0 if direct_scale else 0.0, jnp.float32) if use_scale else None
        self.epsilon = epsilon
        self.direct_scale = direct_scale

    def __call__(self, x: Float[Array, "*batch dims"]) -> Float[Array, "*batch dims"]:
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + self.epsilon)
        if self.scale is not None:
            y = y * (self.scale if self.direct_scale else 1.0 + self.scale)
        return y.astype(x.dtype)

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {"scale": ("embed",)}


def rms_norm_no_scale(epsilon: float = 1e-6) -> NormConfig:
    """Praxis' RmsNormNoScale; build it with `.build(dims)`."""
    return NormConfig(kind="rms_norm_no_scale", epsilon=epsilon)
