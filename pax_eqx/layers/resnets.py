"""ResNet blocks and the ResNet family (praxis.layers.resnets), NHWC, BatchNorm state in the Context.

    cfg = resnet50()                                    # or ResNetConfig(blocks=..., channels=...)
    resnet, state = split_state(cfg.build(key, input_channels=3))    # module, BatchNorm state
    features, ctx = resnet(images, Context(state=state, mode=Mode.TRAIN))
    # images: [B, H, W, 3] -> features: [B, resnet.output_dims] (globally average-pooled)

`ResNetConfig(...).build(key, *, input_channels)` returns a `ResNet`; calling it on
`x: [batch, height, width, input_channels]` with a `Context` returns `(features [batch, F], ctx)`
where `F = resnet.output_dims = channels[-1]`. The classifier head is the model's, not the
trunk's, and so is casting the images to `ctx.dtype`: the trunk computes in its input's dtype
(float32 weights cast per layer; BatchNorm statistics in float32). Every BatchNorm reads and
updates its moving statistics through `ctx` (so TRAIN needs `ctx.state`; EVAL leaves it
unchanged) under Pax-like scopes `stage_{i}_block_{j}/conv_in/...`.

Layout (He et al. 2015, with the stride on the 3x3 convolution as Praxis and torchvision, a.k.a.
"v1.5"): a stem, then stages of blocks, then global average pooling.

- stem "imagenet": 7x7 stride-2 conv -> BN -> act -> 3x3 stride-2 max pool (224 -> 56 pixels);
  stem "small": 3x3 stride-1 conv -> BN -> act, no pooling, for tiny images (8x8 digits, CIFAR).
- `channels[i]` is stage i's *output* channels (Praxis' convention): a bottleneck block computes
  at `channels[i] // 4` and expands back; a basic block computes at `channels[i]`.
- The first block of a stage takes the stage's stride; a block whose shape changes (stride > 1
  or different channels) projects its shortcut with a 1x1 conv + BN.

Convolutions have no bias (a BatchNorm follows each) and He-normal weights with fan-out
(std = sqrt(2 / (kh * kw * out_channels)), Praxis' `GaussianSqrtFanOut(1.414)` and torchvision's
`kaiming_normal_(mode="fan_out")`): the ReLU halves the variance, the 2 restores it.

Presets `resnet18/34/50/101/152()` give the published networks: with a 1000-class linear head
ResNet-50 has 25,557,032 parameters and ResNet-18 11,689,512 (each BatchNorm's gamma and beta
count; moving statistics are state, not parameters).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import equinox as eqx
import jax
from jaxtyping import Array, Float, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, check_range, config, require_positive
from pax_eqx.layers.activations import Activation, ActivationConfig
from pax_eqx.layers.base import Context, call
from pax_eqx.layers.batch_norm import BatchNorm, BatchNormConfig
from pax_eqx.layers.convolutions import Conv2D, Conv2DConfig
from pax_eqx.layers.initializers import gaussian
from pax_eqx.layers.poolings import Pooling, PoolingConfig, global_average_pool
from pax_eqx.layers.stochastics import drop_path

BOTTLENECK_EXPANSION = 4
"""A bottleneck block's output channels over its inner width (ResNet-50: 256 = 4 x 64)."""


class ConvBN(eqx.Module):
    """conv (no bias) -> BatchNorm -> optional activation (Praxis' ConvBNAct); built by the blocks."""

    conv: Conv2D
    norm: BatchNorm
    activation: Activation | None

    def __init__(
        self,
        *,
        key: PRNGKeyArray,
        input_channels: int,
        output_channels: int,
        kernel: int,
        stride: int,
        batch_norm: BatchNormConfig,
        activation: ActivationConfig | None,
    ):
        fan_out = kernel * kernel * output_channels
        # Praxis' ConvBNAct padding (tf_equivalent_padding=False), also torchvision's: (k - 1) // 2
        # before, whatever the stride. TensorFlow's "SAME" pads a stride-2 conv of an even image
        # one pixel less before, which shifts every strided block and ResNet-50's 7x7 stem.
        pad = ((kernel - 1) // 2, kernel // 2)
        self.conv = Conv2DConfig(
            input_channels=input_channels, output_channels=output_channels, kernel_size=(kernel, kernel),
            strides=(stride, stride), padding=(pad, pad), init=gaussian(math.sqrt(2.0 / fan_out)),
        ).build(key)  # fmt: skip
        self.norm = batch_norm.build()
        self.activation = None if activation is None else activation.build()

    def __call__(
        self, x: Float[Array, "batch height width in_channels"], ctx: Context
    ) -> tuple[Float[Array, "batch out_height out_width out_channels"], Context]:
        y = self.conv(x)
        y, ctx = call(self.norm, y, ctx, "bn")
        if self.activation is not None:
            y = self.activation(y)
        return y, ctx


@config
class ResNetBlockConfig(Config):
    """One residual block; its channels and stride are build arguments (the ResNet decides them).

    bottleneck: 1x1 (reduce to out/4) -> kxk (stride) -> 1x1 (expand) convs, as ResNet-50+;
      otherwise the basic block's two kxk convs (ResNet-18/34).
    kernel_size: k of the spatial convolution(s).
    zero_init_residual: start the last BatchNorm's scale at 0, so each block is initially its
      shortcut (Goyal et al. 2017, "ImageNet in 1 hour"); helps large-batch training.
    activation: after each inner BN and after the residual sum (ReLU in the paper).
    batch_norm_decay / batch_norm_epsilon: every BatchNorm's (Praxis' ResNet uses decay 0.9).
    residual_droppath_prob: stochastic depth (Praxis' ResNetBlock field): in training each
      example's residual branch (the body, before the sum) is dropped with this probability and
      otherwise divided by its survival probability (`stochastics.drop_path`); the same in every
      block, as Praxis' ResNet gives its blocks one template.
    """

    bottleneck: bool = False
    kernel_size: int = 3
    zero_init_residual: bool = False
    activation: ActivationConfig = ActivationConfig(name="relu")
    batch_norm_decay: float = 0.9
    batch_norm_epsilon: float = 1e-3
    residual_droppath_prob: float = 0.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        require_positive(self, ("kernel_size",))
        if self.activation.gated:
            raise ConfigError(
                "ResNetBlockConfig.activation.gated=True is not supported: a convolution block has no gate "
                "projection; use an ungated activation."
            )
        check_range(self, "batch_norm_decay", ge=0, le=1)
        check_range(self, "batch_norm_epsilon", ge=0)
        check_range(self, "residual_droppath_prob", ge=0, lt=1)

    def batch_norm(self, dims: int, scale_init: float = 1.0) -> BatchNormConfig:
        return BatchNormConfig(
            dims=dims, decay=self.batch_norm_decay, epsilon=self.batch_norm_epsilon, scale_init=scale_init
        )

    def build(self, key: PRNGKeyArray, *, input_channels: int, output_channels: int, stride: int = 1) -> ResNetBlock:
        """A block mapping [B, H, W, input_channels] to [B, ceil(H/stride), ceil(W/stride), output_channels]."""
        for name, value in (("input_channels", input_channels), ("output_channels", output_channels)):
            if value <= 0:
                raise ConfigError(f"ResNet block {name} must be > 0, got {value}.")
        if stride <= 0:
            raise ConfigError(f"ResNet block stride must be > 0, got {stride}.")
        if self.bottleneck and output_channels % BOTTLENECK_EXPANSION:
            raise ConfigError(
                f"a bottleneck block's output channels ({output_channels}) must be divisible by "
                f"{BOTTLENECK_EXPANSION} (its inner width is a quarter of them); change the ResNet's channels."
            )
        return ResNetBlock(self, key=key, input_channels=input_channels, output_channels=output_channels, stride=stride)


class ResNetBlock(eqx.Module):
    """Residual block: act(body(x) + shortcut(x)); the shortcut is the identity unless the
    shape changes, then a 1x1 strided conv + BN ("projection shortcut", option B of the paper)."""

    body: tuple[ConvBN, ...]
    shortcut: ConvBN | None
    activation: Activation
    residual_droppath_prob: float = eqx.field(static=True)

    def __init__(
        self, cfg: ResNetBlockConfig, *, key: PRNGKeyArray, input_channels: int, output_channels: int, stride: int
    ):
        k_body, k_short = jax.random.split(key)
        k, act = cfg.kernel_size, cfg.activation
        last_scale = 0.0 if cfg.zero_init_residual else 1.0
        if cfg.bottleneck:
            width = output_channels // BOTTLENECK_EXPANSION
            # (in, out, kernel, stride, activation, BN scale_init) of each convolution.
            specs = [
                (input_channels, width, 1, 1, act, 1.0),
                (width, width, k, stride, act, 1.0),
                (width, output_channels, 1, 1, None, last_scale),
            ]
        else:
            specs = [
                (input_channels, output_channels, k, stride, act, 1.0),
                (output_channels, output_channels, k, 1, None, last_scale),
            ]
        keys = jax.random.split(k_body, len(specs))
        self.body = tuple(
            ConvBN(
                key=kk, input_channels=i, output_channels=o, kernel=kern, stride=s,
                batch_norm=cfg.batch_norm(o, scale), activation=a,
            )
            for kk, (i, o, kern, s, a, scale) in zip(keys, specs)
        )  # fmt: skip
        if stride == 1 and input_channels == output_channels:
            self.shortcut = None
        else:
            self.shortcut = ConvBN(
                key=k_short, input_channels=input_channels, output_channels=output_channels, kernel=1,
                stride=stride, batch_norm=cfg.batch_norm(output_channels), activation=None,
            )  # fmt: skip
        self.activation = act.build()
        self.residual_droppath_prob = cfg.residual_droppath_prob

    def __call__(
        self, x: Float[Array, "batch height width in_channels"], ctx: Context
    ) -> tuple[Float[Array, "batch out_height out_width out_channels"], Context]:
        y = x
        for name, layer in zip(_BODY_NAMES[len(self.body)], self.body):
            y, ctx = call(layer, y, ctx, name)
        y, ctx = drop_path(y, 1.0 - self.residual_droppath_prob, ctx)
        residual = x
        if self.shortcut is not None:
            residual, ctx = call(self.shortcut, x, ctx, "shortcut")
        return self.activation(y + residual), ctx


_BODY_NAMES = {2: ("conv_in", "conv_mid"), 3: ("conv_in", "conv_mid", "conv_out")}  # Praxis' names

Stem = Literal["imagenet", "small"]


@config
class ResNetConfig(Config):
    """A ResNet trunk: stem, stages of residual blocks, global average pooling -> [B, channels[-1]].

    blocks: blocks per stage (ResNet-50: (3, 4, 6, 3)).
    channels: each stage's output channels (ResNet-50: (256, 512, 1024, 2048); ResNet-18:
      (64, 128, 256, 512)); with bottleneck blocks each must be divisible by 4.
    strides: each stage's stride, taken by its first block (ImageNet: (1, 2, 2, 2)).
    block: the residual block template (bottleneck or basic, zero-init, activation, BN).
    stem: "imagenet" (7x7/2 conv + 3x3/2 max pool) or "small" (3x3/1 conv, no pooling).
    stem_channels: the stem convolution's output channels (64 in every published ResNet).
    """

    blocks: tuple[int, ...] = (3, 4, 6, 3)
    channels: tuple[int, ...] = (256, 512, 1024, 2048)
    strides: tuple[int, ...] = (1, 2, 2, 2)
    block: ResNetBlockConfig = ResNetBlockConfig(bottleneck=True)
    stem: Stem = "imagenet"
    stem_channels: int = 64

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        require_positive(self, ("stem_channels",))
        if self.stem not in ("imagenet", "small"):
            raise ConfigError(f"ResNetConfig.stem={self.stem!r} is unknown: use 'imagenet' or 'small'.")
        if not self.blocks:
            raise ConfigError("ResNetConfig.blocks is empty: give the number of blocks of each stage, e.g. (2, 2).")
        for name in ("blocks", "channels", "strides"):
            values = getattr(self, name)
            if len(values) != len(self.blocks):
                raise ConfigError(
                    f"ResNetConfig.{name}={tuple(values)} has {len(values)} entries but blocks={tuple(self.blocks)} "
                    f"has {len(self.blocks)}: give one per stage."
                )
            if not all(v > 0 for v in values):
                raise ConfigError(f"ResNetConfig.{name}={tuple(values)}: every entry must be > 0.")
            check_range(self, name, gt=0)  # ints, within int32
        if self.block.bottleneck:
            bad = [c for c in self.channels if c % BOTTLENECK_EXPANSION]
            if bad:
                raise ConfigError(
                    f"ResNetConfig.channels={tuple(self.channels)}: with bottleneck blocks every stage's channels "
                    f"must be divisible by {BOTTLENECK_EXPANSION} (the inner width is a quarter), not {bad}."
                )

    @property
    def output_dims(self) -> int:
        """F, the width of the pooled features (`channels[-1]`)."""
        return self.channels[-1]

    def build(self, key: PRNGKeyArray, *, input_channels: int) -> ResNet:
        """The trunk for images with `input_channels` channels (3 for RGB, 1 for digits)."""
        if input_channels <= 0:
            raise ConfigError(f"ResNet input_channels must be > 0, got {input_channels}.")
        return ResNet(self, key=key, input_channels=input_channels)


class ResNet(eqx.Module):
    stem: ConvBN
    stem_pool: Pooling | None
    stages: tuple[tuple[ResNetBlock, ...], ...]
    output_dims: int = eqx.field(static=True)

    def __init__(self, cfg: ResNetConfig, *, key: PRNGKeyArray, input_channels: int):
        k_stem, k_blocks = jax.random.split(key)
        imagenet = cfg.stem == "imagenet"
        self.stem = ConvBN(
            key=k_stem, input_channels=input_channels, output_channels=cfg.stem_channels,
            kernel=7 if imagenet else 3, stride=2 if imagenet else 1,
            batch_norm=cfg.block.batch_norm(cfg.stem_channels), activation=cfg.block.activation,
        )  # fmt: skip
        self.stem_pool = PoolingConfig(kind="max", window=(3, 3), strides=(2, 2)).build() if imagenet else None
        keys = iter(jax.random.split(k_blocks, sum(cfg.blocks)))
        stages, channels_in = [], cfg.stem_channels
        for num_blocks, channels, stride in zip(cfg.blocks, cfg.channels, cfg.strides):
            stage = []
            for j in range(num_blocks):
                stage.append(
                    cfg.block.build(
                        next(keys), input_channels=channels_in, output_channels=channels, stride=stride if j == 0 else 1
                    )
                )
                channels_in = channels
            stages.append(tuple(stage))
        self.stages = tuple(stages)
        self.output_dims = cfg.output_dims

    def __call__(
        self, x: Float[Array, "batch height width channels"], ctx: Context
    ) -> tuple[Float[Array, "batch features"], Context]:
        """Images (NHWC) -> globally average-pooled features [batch, output_dims]."""
        y, ctx = call(self.stem, x, ctx, "stem")
        if self.stem_pool is not None:
            y = self.stem_pool(y)
        for i, stage in enumerate(self.stages):
            for j, block in enumerate(stage):
                y, ctx = call(block, y, ctx, f"stage_{i}_block_{j}")
        return global_average_pool(y), ctx


def _preset(blocks: tuple[int, ...], bottleneck: bool, changes: dict[str, Any]) -> ResNetConfig:
    channels = (256, 512, 1024, 2048) if bottleneck else (64, 128, 256, 512)
    cfg = ResNetConfig(blocks=blocks, channels=channels, block=ResNetBlockConfig(bottleneck=bottleneck))
    return cfg.replace(**changes)


def resnet18(**changes: Any) -> ResNetConfig:
    """ResNet-18: basic blocks (2, 2, 2, 2), channels (64, 128, 256, 512). `changes` replace fields."""
    return _preset((2, 2, 2, 2), False, changes)


def resnet34(**changes: Any) -> ResNetConfig:
    """ResNet-34: basic blocks (3, 4, 6, 3), channels (64, 128, 256, 512)."""
    return _preset((3, 4, 6, 3), False, changes)


def resnet50(**changes: Any) -> ResNetConfig:
    """ResNet-50: bottleneck blocks (3, 4, 6, 3), channels (256, 512, 1024, 2048)."""
    return _preset((3, 4, 6, 3), True, changes)


def resnet101(**changes: Any) -> ResNetConfig:
    """ResNet-101: bottleneck blocks (3, 4, 23, 3)."""
    return _preset((3, 4, 23, 3), True, changes)


def resnet152(**changes: Any) -> ResNetConfig:
    """ResNet-152: bottleneck blocks (3, 8, 36, 3)."""
    return _preset((3, 8, 36, 3), True, changes)
