"""Conv2D (praxis.layers.convolutions.Conv2D) over NHWC images, weights HWIO.

    conv = Conv2DConfig(input_channels=3, output_channels=16, kernel_size=(3, 3), strides=(2, 2)).build(key)
    y = conv(x)        # x: [batch, height, width, 3] -> y: [batch, ceil(height/2), ceil(width/2), 16]

The weight is `[kernel_h, kernel_w, input_channels // feature_group_count, output_channels]`
(HWIO, as Praxis and `jax.lax.conv_general_dilated` with `("NHWC", "HWIO", "NHWC")`), so no
transpose happens at run time. `feature_group_count` splits the input and output channels into
that many groups convolved independently (grouped convolution, ResNeXt); `feature_group_count
== input_channels` is a depthwise convolution (MobileNet), each output channel seeing one input
channel. Like the other layers, the weight is stored float32 and cast to the input's dtype where
it is used.

Xavier initialisation here uses the convolution's fans, which include the receptive field
(`fan_in = kh * kw * input_channels / groups`, `fan_out = kh * kw * output_channels / groups`),
as Praxis computes them for a 4-D weight; the other methods ignore fans.

Logical axes: `w: (None, None, "conv_in", "conv_out")`, `b: ("conv_out",)` (see
pax_eqx.sharding.rules: the kernel's spatial dims are never sharded).
"""

from __future__ import annotations

import math
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, config, require_positive
from pax_eqx.layers.initializers import WeightInit
from pax_eqx.quantization.products import quantized_conv
from pax_eqx.quantization.quantized_weight import QuantizedWeight

Padding = Literal["SAME", "VALID"] | tuple[tuple[int, int], tuple[int, int]]
""""SAME" (output = ceil(input / stride), zeros split evenly, the extra one after), "VALID" (no
padding), or explicit `((top, bottom), (left, right))` zeros."""


def check_padding(owner: str, padding: object) -> None:
    """ConfigError unless `padding` is "SAME", "VALID" or ((top, bottom), (left, right)) of ints >= 0."""
    if padding in ("SAME", "VALID"):
        return
    ok = (
        isinstance(padding, (tuple, list))
        and len(padding) == 2
        and all(isinstance(p, (tuple, list)) and len(p) == 2 for p in padding)
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for p in padding for v in p)
    )
    if not ok:
        raise ConfigError(
            f"{owner}.padding={padding!r} is not valid: use 'SAME', 'VALID' or explicit "
            "((top, bottom), (left, right)) non-negative ints."
        )


def lax_padding(padding: Padding) -> str | tuple[tuple[int, int], ...]:
    """The form `jax.lax` takes: the string, or a tuple of (low, high) pairs."""
    return padding if isinstance(padding, str) else tuple((int(lo), int(hi)) for lo, hi in padding)


def check_pair(owner: str, name: str, value: object) -> None:
    """ConfigError unless `value` is a pair of positive ints (a window, stride or dilation)."""
    if not (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise ConfigError(f"{owner}.{name} must be two positive ints (height, width), got {value!r}.")


@config
class Conv2DConfig(Config):
    """A 2-D convolution over NHWC inputs; see the module docstring.

    input_channels / output_channels: C_in and C_out; both divisible by feature_group_count.
    kernel_size: (kh, kw). strides: (sh, sw). dilation: the kernel's (atrous) dilation (dh, dw).
    padding: "SAME", "VALID" or ((top, bottom), (left, right)).
    feature_group_count: groups; 1 is a dense convolution, input_channels is depthwise.
    use_bias: add a learned per-output-channel bias (off by default: a BatchNorm usually follows).
    init: the weight's initialiser (Xavier with the receptive field in the fans by default).
    """

    input_channels: int
    output_channels: int
    kernel_size: tuple[int, int] = (3, 3)
    strides: tuple[int, int] = (1, 1)
    padding: Padding = "SAME"
    dilation: tuple[int, int] = (1, 1)
    feature_group_count: int = 1
    use_bias: bool = False
    init: WeightInit = WeightInit()

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        require_positive(self, ("input_channels", "output_channels", "feature_group_count"))
        for name in ("kernel_size", "strides", "dilation"):
            check_pair("Conv2DConfig", name, getattr(self, name))
        check_padding("Conv2DConfig", self.padding)
        g = self.feature_group_count
        for name in ("input_channels", "output_channels"):
            if getattr(self, name) % g:
                raise ConfigError(
                    f"Conv2DConfig.{name}={getattr(self, name)} is not divisible by feature_group_count={g}; "
                    "each group needs the same number of channels."
                )

    def build(self, key: PRNGKeyArray) -> Conv2D:
        return Conv2D(self, key=key)


def conv_weight_init(init: WeightInit, key: PRNGKeyArray, shape: tuple[int, int, int, int]) -> Array:
    """A float32 HWIO weight. Xavier takes fans with the receptive field (`kh*kw*I`,
    `kh*kw*O`), which `WeightInit` (made for `[in, out]` matrices) would leave out."""
    if init.method != "xavier":
        return init(key, shape)
    kh, kw, cin, cout = shape
    limit = init.scale * math.sqrt(6.0 / (kh * kw * (cin + cout)))
    return jax.random.uniform(key, shape, jnp.float32, -limit, limit)


class Conv2D(eqx.Module):
    w: Float[Array, "kernel_h kernel_w in_per_group out_channels"]
    b: Float[Array, " out_channels"] | None
    strides: tuple[int, int] = eqx.field(static=True)
    padding: str | tuple[tuple[int, int], ...] = eqx.field(static=True)
    dilation: tuple[int, int] = eqx.field(static=True)
    feature_group_count: int = eqx.field(static=True)

    def __init__(self, cfg: Conv2DConfig, *, key: PRNGKeyArray):
        kh, kw = cfg.kernel_size
        shape = (kh, kw, cfg.input_channels // cfg.feature_group_count, cfg.output_channels)
        self.w = conv_weight_init(cfg.init, key, shape)
        self.b = jnp.zeros((cfg.output_channels,), jnp.float32) if cfg.use_bias else None
        self.strides = tuple(cfg.strides)
        self.padding = lax_padding(cfg.padding)
        self.dilation = tuple(cfg.dilation)
        self.feature_group_count = cfg.feature_group_count

    @property
    def input_channels(self) -> int:
        return self.w.shape[2] * self.feature_group_count

    @property
    def output_channels(self) -> int:
        return self.w.shape[3]

    def __call__(
        self, x: Float[Array, "batch height width in_channels"]
    ) -> Float[Array, "batch out_height out_width out_channels"]:
        if x.shape[-1] != self.input_channels:
            raise ValueError(
                f"Conv2D expects {self.input_channels} input channels (the last dimension, NHWC), "
                f"got an input of shape {x.shape}."
            )
        conv = dict(
            window_strides=self.strides,
            padding=self.padding,
            rhs_dilation=self.dilation,
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=self.feature_group_count,
        )
        if isinstance(self.w, QuantizedWeight):  # integers convolved, scaled per output channel after
            y = quantized_conv(x, self.w, **conv)
        else:
            y = jax.lax.conv_general_dilated(x, self.w.astype(x.dtype), **conv)
        if self.b is not None:
            y = y + self.b.astype(y.dtype)
        return y

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {"w": (None, None, "conv_in", "conv_out"), "b": ("conv_out",)}
