"""LayerNorm, RmsNorm, RmsNormNoScale (praxis.layers.normalizations); BatchNorm is its own file.

Praxis conventions kept on purpose: LayerNorm's scale is stored as an offset from one
(`y = norm(x) * (1 + scale) + bias`, scale initialised to 0) so weight decay pulls it towards
the identity, RmsNorm's is the factor itself (`y = x / rms(x) * scale`, initialised to 1), and
epsilon defaults to 1e-6. `direct_scale` chooses the other form, as Praxis' own `direct_scale`
does (LayerNorm's defaults to False, RmsNorm's to True).

`NormConfig` is a choice (`config.Variant`): LayerNormConfig, RmsNormConfig or
RmsNormNoScaleConfig, each with only the fields it reads; `--model.final-norm rms_norm` switches.
Statistics are computed in float32 whatever the input dtype (bf16 variances lose too much
precision), and the result is cast back.
"""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from pax_eqx.config import ConfigError, Variant, check_range, config


@config
class _Norm(Variant):
    """What every normalisation reads. epsilon: added to the variance."""

    epsilon: float = 1e-6

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        check_range(self, "epsilon", ge=0, prefix=f"{self.kind} norm")

    @classmethod
    def migrate(cls, data: dict) -> dict:
        """An older config.json's `direct_scale: null` meant the kind's default."""
        return {k: v for k, v in data.items() if not (k == "direct_scale" and v is None)}

    def _check_dims(self, dims: int) -> None:
        if dims <= 0:
            raise ConfigError(f"{type(self).__name__}.build: dims must be > 0, got {dims}.")


@config
class LayerNormConfig(_Norm):
    """Praxis LayerNorm over the last dimension, whose size the owning layer passes to
    `build(dims)` (its model width decides it).

    epsilon: added to the variance.
    use_scale / use_bias: the learnable scale and bias.
    direct_scale: Praxis' `direct_scale`: True multiplies by `scale` (initialised to 1), False (the
      default) by `1 + scale` (initialised to 0). Refused without a scale.
    """

    kind: ClassVar[str] = "layer_norm"
    use_scale: bool = True
    use_bias: bool = True
    direct_scale: bool = False

    def validate(self) -> None:
        super().validate()
        if self.direct_scale and not self.use_scale:
            raise ConfigError(
                "layer_norm direct_scale=True has no effect with use_scale=False (there is no scale); leave "
                "direct_scale False, or set use_scale True."
            )

    @property
    def has_scale(self) -> bool:
        return self.use_scale

    def build(self, dims: int, key: PRNGKeyArray | None = None) -> LayerNorm:
        self._check_dims(dims)
        return LayerNorm(
            dims, epsilon=self.epsilon, use_scale=self.use_scale, use_bias=self.use_bias, direct_scale=self.direct_scale
        )


@config
class RmsNormConfig(_Norm):
    """Praxis RmsNorm: y = x / rms(x) * scale, no bias.

    epsilon: added to the mean square.
    direct_scale: Praxis' `direct_scale`: True (the default) multiplies by `scale` (initialised to
      1), False by `1 + scale` (initialised to 0).
    """

    kind: ClassVar[str] = "rms_norm"
    direct_scale: bool = True
    has_scale: ClassVar[bool] = True

    def build(self, dims: int, key: PRNGKeyArray | None = None) -> RmsNorm:
        self._check_dims(dims)
        return RmsNorm(dims, epsilon=self.epsilon, use_scale=True, direct_scale=self.direct_scale)


@config
class RmsNormNoScaleConfig(_Norm):
    """Praxis RmsNormNoScale: y = x / rms(x), no learnable parameter. epsilon: added to the mean square."""

    kind: ClassVar[str] = "rms_norm_no_scale"
    has_scale: ClassVar[bool] = False

    def build(self, dims: int, key: PRNGKeyArray | None = None) -> RmsNorm:
        self._check_dims(dims)
        return RmsNorm(dims, epsilon=self.epsilon, use_scale=False, direct_scale=True)


NormConfig = LayerNormConfig | RmsNormConfig | RmsNormNoScaleConfig
"""The choice of a normalisation over the last dimension (`--model.final-norm rms_norm`)."""


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


def rms_norm_no_scale(epsilon: float = 1e-6) -> RmsNormNoScaleConfig:
    """Praxis' RmsNormNoScale; build it with `.build(dims)`."""
    return RmsNormNoScaleConfig(epsilon=epsilon)
