"""MLP: a feature network of hidden layers (projection, optional BatchNorm, activation, dropout).

    net = MLPConfig(hidden_dims=(128, 128), batch_norm=True).build(key, input_dims=64)
    features, ctx = net(x, ctx)        # x [batch, ...] is flattened to [batch, input_dims]
    net.output_dims                    # the last hidden width (input_dims with no hidden layer)

The network of a ClassificationModel over feature vectors (Praxis' MLP networks). With
`batch_norm`, the norm sits between each projection and its activation, and its moving
statistics are non-trainable state (mean-synced), threaded through the Context.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
from jaxtyping import Array, Float, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, check_range, config
from pax_eqx.layers.activations import Activation, ActivationConfig
from pax_eqx.layers.base import Context, call
from pax_eqx.layers.batch_norm import BatchNorm, BatchNormConfig
from pax_eqx.layers.initializers import WeightInit
from pax_eqx.layers.linears import FeedForward, FeedForwardConfig
from pax_eqx.layers.stochastics import Dropout, DropoutConfig

_DEFAULT_DECAY = 0.999


@config
class MLPConfig(Config):
    """hidden_dims: the width of each hidden layer (() = no hidden layer: the input itself).
    activation: after each hidden projection.
    batch_norm: BatchNorm after each projection, before the activation.
    batch_norm_decay: the moving statistics' decay (Praxis' 0.999 suits long runs; a short
      run's eval needs averages that have forgotten their initial values).
    dropout_prob: dropout after each hidden activation (training only).
    init: weight init of every projection.
    """

    hidden_dims: tuple[int, ...] = (128,)
    activation: ActivationConfig = ActivationConfig(name="relu")
    batch_norm: bool = False
    batch_norm_decay: float = _DEFAULT_DECAY
    dropout_prob: float = 0.0
    init: WeightInit = WeightInit()

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_range(self, "hidden_dims", gt=0)
        if self.batch_norm and self.activation.gated:
            raise ConfigError(
                "MLPConfig.activation.gated=True with batch_norm=True: the norm sits between the projection and "
                "the activation, where a gate has no projection of its own; turn one of them off."
            )
        check_range(self, "batch_norm_decay", ge=0, lt=1)
        if not self.batch_norm and self.batch_norm_decay != _DEFAULT_DECAY:
            raise ConfigError(
                f"MLPConfig.batch_norm_decay={self.batch_norm_decay} has no effect with batch_norm=False; "
                "turn batch_norm on, or leave the decay at its default."
            )
        check_range(self, "dropout_prob", ge=0, lt=1)
        if not self.hidden_dims and (self.batch_norm or self.dropout_prob):
            raise ConfigError(
                "MLPConfig.batch_norm / dropout_prob apply to hidden layers, and hidden_dims is empty; "
                "give hidden_dims or turn them off."
            )

    def build(self, key: PRNGKeyArray, *, input_dims: int) -> MLP:
        """`input_dims`: features per example (the product of its shape), decided by the model."""
        if not input_dims > 0:
            raise ConfigError(f"MLPConfig.build: input_dims must be > 0, got {input_dims}.")
        return MLP(self, input_dims, key=key)


class HiddenLayer(eqx.Module):
    """projection -> [BatchNorm -> activation] -> dropout (without BatchNorm the activation is
    the projection's own)."""

    projection: FeedForward
    norm: BatchNorm | None
    activation: Activation | None
    dropout: Dropout

    def __call__(self, x: Float[Array, "batch features"], ctx: Context) -> tuple[Float[Array, "batch hidden"], Context]:
        x = self.projection(x)
        if self.norm is not None:
            x, ctx = call(self.norm, x, ctx, "batch_norm")
            x = self.activation(x)
        return self.dropout(x, ctx)


class MLP(eqx.Module):
    layers: tuple[HiddenLayer, ...]
    output_dims: int = eqx.field(static=True)

    def __init__(self, cfg: MLPConfig, input_dims: int, *, key: PRNGKeyArray):
        keys = jax.random.split(key, max(len(cfg.hidden_dims), 1))
        layers, dims = [], input_dims
        for i, (width, k) in enumerate(zip(cfg.hidden_dims, keys)):
            # Alternate the logical names so no weight names one mesh axis twice.
            axes = ("embed", "mlp") if i % 2 == 0 else ("mlp", "embed")
            act = ActivationConfig(name="identity") if cfg.batch_norm else cfg.activation
            projection = FeedForwardConfig(input_dims=dims, output_dims=width, activation=act, init=cfg.init, axes=axes)
            norm = BatchNormConfig(dims=width, decay=cfg.batch_norm_decay).build() if cfg.batch_norm else None
            activation = cfg.activation.build() if cfg.batch_norm else None
            dropout = DropoutConfig(rate=cfg.dropout_prob).build()
            layers.append(HiddenLayer(projection.build(k), norm, activation, dropout))
            dims = width
        self.layers = tuple(layers)
        self.output_dims = dims

    def __call__(self, x: Float[Array, "batch ..."], ctx: Context) -> tuple[Float[Array, "batch out"], Context]:
        x = x.reshape(x.shape[0], math.prod(x.shape[1:]))
        for i, layer in enumerate(self.layers):
            x, ctx = call(layer, x, ctx, f"hidden_{i}")
        return x, ctx
