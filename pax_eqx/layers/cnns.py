"""CNN: convolutions, each followed by pooling, then hidden layers over the flattened map (the
`CNN` of Paxml's MNIST example, paxml/tasks/vision/params/mnist.py), NHWC.

    cnn = CNNConfig().build(key, image_shape=(28, 28, 1))
    features, ctx = cnn(images, ctx)     # [B, 28, 28, 1] -> [B, cnn.output_dims] (256)

For each of `channels`: a `kernel_size` x `kernel_size` convolution (stride 1, "SAME", with a
bias), the activation, and `pooling` over `pool_size` x `pool_size` windows at stride
`pool_size` ("SAME": ceil(H / pool_size)). Then the map is flattened in (row, column, channel)
order, as Paxml's `jnp.reshape(outputs, [batch_size, -1])`, and goes through the MLP's hidden
layers of `hidden_dims` (weight, bias, activation; no BatchNorm, no dropout). With Paxml's
numbers: 3x3 convolutions to 32 and 64 channels, 2x2 average pooling (28 -> 14 -> 7), 7 * 7 * 64
= 3136 features, one hidden layer of 256 with ReLU.

Paxml's last two layers, a Linear to the classes and a Bias, are the ClassificationModel's
softmax head (weight and bias), so the trunk ends at the last hidden layer, as the ResNet and
ViT trunks end at their pooled features. Paxml's convolutions have no BatchNorm
(`batch_norm_tpl=None`), so the CNN has no state. Weights take `init` (Praxis' default, Xavier,
with the receptive field in a convolution's fans), biases start at zero.
"""

from __future__ import annotations

import math
import typing

import equinox as eqx
import jax
from jaxtyping import Array, Float, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, check_range, config
from pax_eqx.layers.activations import Activation, ActivationConfig
from pax_eqx.layers.base import Context, call
from pax_eqx.layers.convolutions import Conv2D, Conv2DConfig
from pax_eqx.layers.initializers import WeightInit
from pax_eqx.layers.mlps import MLP, MLPConfig
from pax_eqx.layers.poolings import Pooling, PoolingConfig, PoolingKind


@config
class CNNConfig(Config):
    """channels: each convolution's output channels (Paxml's MNIST CNN: (32, 64)).
    kernel_size: k of every k x k convolution.
    pooling: "avg" or "max", after each convolution's activation; pool_size: its window and stride.
    hidden_dims: the hidden layers over the flattened map (() = the flattened map is the features).
    activation: after every convolution and hidden layer (Paxml's single activation_tpl).
    init: every weight's initialiser.
    """

    channels: tuple[int, ...] = (32, 64)
    kernel_size: int = 3
    pooling: PoolingKind = "avg"
    pool_size: int = 2
    hidden_dims: tuple[int, ...] = (256,)
    activation: ActivationConfig = ActivationConfig(name="relu")
    init: WeightInit = WeightInit()

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        if not self.channels:
            raise ConfigError("CNNConfig.channels is empty: give each convolution's output channels, e.g. (32, 64).")
        check_range(self, ("channels", "kernel_size", "pool_size", "hidden_dims"), gt=0)
        if self.pooling not in typing.get_args(PoolingKind):
            raise ConfigError(f"CNNConfig.pooling={self.pooling!r} is unknown: use 'avg' or 'max'.")
        if self.activation.gated:
            raise ConfigError(
                "CNNConfig.activation.gated=True is not supported: a convolution has no gate projection; use an "
                "ungated activation."
            )

    def build(self, key: PRNGKeyArray, *, image_shape: tuple[int, ...]) -> CNN:
        """The CNN for images of `image_shape` = (height, width, channels), decided by the model."""
        if len(image_shape) != 3 or not all(d > 0 for d in image_shape):
            raise ConfigError(f"CNN image_shape must be (height, width, channels) > 0, got {tuple(image_shape)}.")
        return CNN(self, tuple(image_shape), key=key)


class CNN(eqx.Module):
    convs: tuple[Conv2D, ...]
    pool: Pooling
    activation: Activation
    mlp: MLP
    output_dims: int = eqx.field(static=True)

    def __init__(self, cfg: CNNConfig, image_shape: tuple[int, int, int], *, key: PRNGKeyArray):
        k_convs, k_mlp = jax.random.split(key)
        height, width, channels_in = image_shape
        convs = []
        for out, k in zip(cfg.channels, jax.random.split(k_convs, len(cfg.channels))):
            convs.append(
                Conv2DConfig(
                    input_channels=channels_in, output_channels=out, kernel_size=(cfg.kernel_size,) * 2,
                    padding="SAME", use_bias=True, init=cfg.init,
                ).build(k)
            )  # fmt: skip
            channels_in = out
            height, width = math.ceil(height / cfg.pool_size), math.ceil(width / cfg.pool_size)
        self.convs = tuple(convs)
        size = (cfg.pool_size,) * 2
        self.pool = PoolingConfig(kind=cfg.pooling, window=size, strides=size, padding="SAME").build()
        self.activation = cfg.activation.build()
        mlp = MLPConfig(hidden_dims=cfg.hidden_dims, activation=cfg.activation, init=cfg.init)
        self.mlp = mlp.build(k_mlp, input_dims=height * width * channels_in)
        self.output_dims = self.mlp.output_dims

    def __call__(
        self, x: Float[Array, "batch height width channels"], ctx: Context
    ) -> tuple[Float[Array, "batch features"], Context]:
        """Images (NHWC) -> features [batch, output_dims], in the images' dtype."""
        for conv in self.convs:
            x = self.pool(self.activation(conv(x)))
        return call(self.mlp, x, ctx, "mlp")  # the MLP flattens [B, h, w, c] in row-major order
