"""ClassificationModel: a classifier of feature vectors (Praxis' ClassificationModel, MLP network).

    inputs [B, F] -> (Linear -> [BatchNorm] -> activation -> [dropout]) x len(hidden_dims)
                  -> Softmax -> logits [B, C]

Batch: `inputs` [batch, features] (float), `labels` [batch] (int), `weights` [batch] (0 for
padded rows). Metrics: `avg_xent` (the loss), `accuracy`, `error_rate` -- each a mean over the
weighted examples, with their count as its weight.

The second model family of the contract (`pax_eqx.models.model`): it trains through the same
Task, CLI, checkpoints and summaries as the language model, and with `batch_norm` it carries
non-trainable state (moving statistics, mean-synced over microbatches).
"""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from pax_eqx.config import ConfigError, config, require_positive
from pax_eqx.layers.activations import ActivationConfig
from pax_eqx.layers.base import Context, call
from pax_eqx.layers.batch_norm import BatchNormConfig
from pax_eqx.layers.embedding_softmax import SoftmaxConfig
from pax_eqx.layers.initializers import WeightInit
from pax_eqx.layers.linears import FeedForwardConfig
from pax_eqx.layers.stochastics import DropoutConfig
from pax_eqx.metrics import Metrics, weighted_mean
from pax_eqx.models.model import Batch, Model, ModelConfig


@config
class ClassificationModelConfig(ModelConfig):
    """input_dims: features per example; num_classes: classes.
    hidden_dims: the width of each hidden layer (() = a linear classifier).
    activation: after each hidden projection (a gated one doubles its projection).
    batch_norm: BatchNorm after each hidden projection, before the activation.
    batch_norm_decay: the moving statistics' decay (Praxis' default 0.999 suits long runs; a
      short run's eval needs its moving averages to have forgotten their initial values).
    dropout_prob: dropout after each hidden activation (training only).
    label_smoothing_prob: label smoothing of the cross-entropy (0 = off).
    init: weight init of every projection.
    """

    input_dims: int = 0
    num_classes: int = 0
    hidden_dims: tuple[int, ...] = (128,)
    activation: ActivationConfig = ActivationConfig(name="relu")
    batch_norm: bool = False
    batch_norm_decay: float = 0.999
    dropout_prob: float = 0.0
    label_smoothing_prob: float = 0.0
    init: WeightInit = WeightInit()

    def validate(self) -> None:
        require_positive(self, ("input_dims", "num_classes"), "model")
        if any(h <= 0 for h in self.hidden_dims):
            raise ConfigError(f"model.hidden_dims must all be > 0, got {list(self.hidden_dims)}.")
        if self.batch_norm and self.activation.gated:
            raise ConfigError(
                "model.activation.gated=True with model.batch_norm=True: the norm sits between the projection "
                "and the activation, where a gate has no projection of its own; set one of them to false."
            )
        if not 0.0 <= self.batch_norm_decay < 1.0:
            raise ConfigError(f"model.batch_norm_decay must be in [0, 1), got {self.batch_norm_decay}.")
        if not self.batch_norm and self.batch_norm_decay != 0.999:
            raise ConfigError(
                f"model.batch_norm_decay={self.batch_norm_decay} has no effect with model.batch_norm=False; "
                "pass --model.batch-norm, or leave the decay at its default."
            )
        if not 0.0 <= self.dropout_prob < 1.0:
            raise ConfigError(f"model.dropout_prob must be in [0, 1), got {self.dropout_prob}.")
        if not 0.0 <= self.label_smoothing_prob < 1.0:
            raise ConfigError(f"model.label_smoothing_prob must be in [0, 1), got {self.label_smoothing_prob}.")

    def build(self, key: PRNGKeyArray) -> ClassificationModel:
        self.validate()
        return ClassificationModel(self, key=key)


class _Hidden(eqx.Module):
    """One hidden layer: projection, optional BatchNorm, activation, dropout."""

    projection: eqx.Module  # FeedForward without activation when batch norm comes between
    norm: eqx.Module | None
    activation: eqx.Module | None
    dropout: eqx.Module

    def __call__(self, x: Float[Array, "batch features"], ctx: Context) -> tuple[Array, Context]:
        x = self.projection(x)
        if self.norm is not None:
            x, ctx = call(self.norm, x, ctx, "batch_norm")
            x = self.activation(x)
        return self.dropout(x, ctx)


class ClassificationModel(Model):
    hidden: tuple[_Hidden, ...]
    softmax: eqx.Module

    input_keys: ClassVar[tuple[str, ...]] = ("inputs", "labels", "weights")
    loss_name: ClassVar[str] = "avg_xent"

    def __init__(self, cfg: ClassificationModelConfig, *, key: PRNGKeyArray):
        keys = jax.random.split(key, len(cfg.hidden_dims) + 1)
        layers = []
        dims = cfg.input_dims
        for i, (width, k) in enumerate(zip(cfg.hidden_dims, keys)):
            # Alternate the logical names so no weight names one mesh axis twice.
            axes = ("embed", "mlp") if i % 2 == 0 else ("mlp", "embed")
            # With batch norm the activation comes after the norm, so the projection is linear.
            act = ActivationConfig(name="identity") if cfg.batch_norm else cfg.activation
            projection = FeedForwardConfig(
                input_dims=dims, output_dims=width, activation=act, init=cfg.init, axes=axes
            ).build(k)
            norm = BatchNormConfig(dims=width, decay=cfg.batch_norm_decay).build() if cfg.batch_norm else None
            activation = cfg.activation.build() if cfg.batch_norm else None
            layers.append(_Hidden(projection, norm, activation, DropoutConfig(rate=cfg.dropout_prob).build()))
            dims = width
        self.hidden = tuple(layers)
        self.softmax = SoftmaxConfig(
            input_dims=dims, num_classes=cfg.num_classes, init=cfg.init,
            label_smoothing_prob=cfg.label_smoothing_prob,
        ).build(keys[-1])  # fmt: skip

    def compute_predictions(self, batch: Batch, ctx: Context) -> tuple[Float[Array, "batch classes"], Context]:
        """Logits [batch, classes] of `batch["inputs"]`."""
        x = jnp.asarray(batch["inputs"], ctx.dtype)
        for i, layer in enumerate(self.hidden):
            x, ctx = call(layer, x, ctx, f"hidden_{i}")
        return self.softmax.logits(x), ctx

    def compute_loss(self, predictions: Float[Array, "batch classes"], batch: Batch) -> Metrics:
        labels: Int[Array, " batch"] = jnp.asarray(batch["labels"])
        weights = jnp.asarray(batch["weights"], jnp.float32)
        logits = predictions.astype(jnp.float32)
        xent = self.softmax.xent(logits, labels)
        correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
        num = jnp.sum(weights)
        return {
            "avg_xent": weighted_mean(jnp.sum(xent * weights), num),
            "accuracy": weighted_mean(jnp.sum(correct * weights), num),
            "error_rate": weighted_mean(jnp.sum((1.0 - correct) * weights), num),
        }
