"""Pooling (praxis.layers.poolings.Pooling, GlobalPooling) over NHWC images; no parameters.

    pool = PoolingConfig(kind="max", window=(3, 3), strides=(2, 2)).build()
    y = pool(x)                                  # [B, H, W, C] -> [B, ceil(H/2), ceil(W/2), C]
    features = GlobalPoolingConfig().build()(y)  # [B, H', W', C] -> [B, C]

Padding follows `Conv2DConfig`'s ("SAME", "VALID" or ((top, bottom), (left, right))). Padded
positions never win a max (they are -inf) and are not counted in an average: a window at the
border averages only the real pixels it covers (Praxis' and TensorFlow's convention; PyTorch's
`count_include_pad=True` would divide by the full window instead).
"""

from __future__ import annotations

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, config
from pax_eqx.layers.convolutions import Padding, check_padding, check_pair, lax_padding

PoolingKind = Literal["max", "avg"]


def _check_kind(owner: str, kind: object) -> None:
    if kind not in ("max", "avg"):
        raise ConfigError(f"{owner}.kind={kind!r} is unknown: use 'max' or 'avg'.")


@config
class PoolingConfig(Config):
    """Max or average pooling over (height, width) windows.

    kind: "max" or "avg". window: (wh, ww). strides: (sh, sw); padding: as Conv2DConfig's.
    """

    kind: PoolingKind = "max"
    window: tuple[int, int] = (2, 2)
    strides: tuple[int, int] = (2, 2)
    padding: Padding = "SAME"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        _check_kind("PoolingConfig", self.kind)
        check_pair("PoolingConfig", "window", self.window)
        check_pair("PoolingConfig", "strides", self.strides)
        check_padding("PoolingConfig", self.padding)

    def build(self, key: PRNGKeyArray | None = None) -> Pooling:
        return Pooling(self)


class Pooling(eqx.Module):
    kind: str = eqx.field(static=True)
    window: tuple[int, int] = eqx.field(static=True)
    strides: tuple[int, int] = eqx.field(static=True)
    padding: str | tuple[tuple[int, int], ...] = eqx.field(static=True)

    def __init__(self, cfg: PoolingConfig):
        self.kind = cfg.kind
        self.window = tuple(cfg.window)
        self.strides = tuple(cfg.strides)
        self.padding = lax_padding(cfg.padding)

    def __call__(
        self, x: Float[Array, "batch height width channels"]
    ) -> Float[Array, "batch out_height out_width channels"]:
        dims, strides = (1, *self.window, 1), (1, *self.strides, 1)
        pads = self.padding
        if not isinstance(pads, str):
            pads = ((0, 0), *pads, (0, 0))
        if self.kind == "max":
            return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, dims, strides, pads).astype(x.dtype)
        # Sum in float32, then divide by the number of real (unpadded) pixels under each window.
        total = jax.lax.reduce_window(x.astype(jnp.float32), 0.0, jax.lax.add, dims, strides, pads)
        ones = jnp.ones((1, *x.shape[1:3], 1), jnp.float32)
        count = jax.lax.reduce_window(ones, 0.0, jax.lax.add, dims, strides, pads)
        return (total / count).astype(x.dtype)


@config
class GlobalPoolingConfig(Config):
    """Pools over all of height and width: [B, H, W, C] -> [B, C]. kind: "avg" or "max"."""

    kind: PoolingKind = "avg"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        _check_kind("GlobalPoolingConfig", self.kind)

    def build(self, key: PRNGKeyArray | None = None) -> GlobalPooling:
        return GlobalPooling(self)


class GlobalPooling(eqx.Module):
    kind: str = eqx.field(static=True)

    def __init__(self, cfg: GlobalPoolingConfig):
        self.kind = cfg.kind

    def __call__(self, x: Float[Array, "batch height width channels"]) -> Float[Array, "batch channels"]:
        if self.kind == "max":
            return jnp.max(x, axis=(1, 2))
        return global_average_pool(x)


def global_average_pool(x: Float[Array, "batch height width channels"]) -> Float[Array, "batch channels"]:
    """The mean over height and width, accumulated in float32, returned in x's dtype."""
    return jnp.mean(x.astype(jnp.float32), axis=(1, 2)).astype(x.dtype)
