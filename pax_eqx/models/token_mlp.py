"""Praxis' ClassificationMLPModel: a token-level MLP classifier, what Paxml's lm_cloud LargeMlp and
SmallMlp (model_params.ClassificationModelAdam) train to test SPMD data parallelism.

Every token id is looked up in a tied table, goes through an MLP, and is projected back onto the
table to predict its own id; the loss is Praxis' there, the accuracy (TokenMlpConfig says why).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from pax_eqx.config import config, require_positive
from pax_eqx.layers import MLP, ActivationConfig, MLPConfig, SharedEmbeddingSoftmax, SharedEmbeddingSoftmaxConfig
from pax_eqx.layers.base import Context, call
from pax_eqx.layers.initializers import WeightInit, xavier
from pax_eqx.metrics import Metrics, weighted_mean
from pax_eqx.models.model import Batch, Model, ModelConfig


@config
class TokenMlpConfig(ModelConfig):
    """Praxis' ClassificationMLPModel as Paxml's ClassificationModelAdam builds it (lm_cloud's
    LargeMlp and SmallMlp, tests of Pax's SPMD data parallelism): every token id is looked up in
    a tied SharedEmbeddingSoftmax of `input_dims` classes and width (no sqrt(d) scale), goes
    through an MLPBlock of `num_layers` ReLU FeedForwards with biases (input_dims -> hidden_dims,
    hidden -> hidden, hidden -> input_dims, the last activated too: activate_final), and is
    projected back onto the table (with its bias) to predict its own id. Every weight is Praxis'
    default Xavier(1.000001).

    The loss is Praxis' `total_loss` there: the weighted accuracy of the argmax against the
    labels, whose gradient is zero, so training only decays the weights (Adam's update of a zero
    gradient is 0, the decoupled weight decay is not). Praxis computes the softmax's
    cross-entropy too and reports none of it. Pax weighs that metric by its own value
    (`total_loss=(mean_acc, mean_acc)`) when it averages eval batches; here by the predictions
    counted, as every metric.
    """

    input_dims: int = 0
    hidden_dims: int = 0
    num_layers: int = 8
    init: WeightInit = xavier(1.000001)  # Praxis' default init

    def validate(self) -> None:
        require_positive(self, ("input_dims", "hidden_dims", "num_layers"), "model")

    def tokens_per_example(self, data: Any) -> int:
        return data.seq_len

    def token_vocab_size(self) -> int | None:
        return self.input_dims

    def build(self, key: PRNGKeyArray) -> TokenMlp:
        self.ensure_valid()
        return TokenMlp(self, key=key)


class TokenMlp(Model):
    softmax: SharedEmbeddingSoftmax
    mlp: MLP

    input_keys = ("ids", "labels", "weights")
    loss_name = "total_loss"

    def __init__(self, cfg: TokenMlpConfig, *, key: PRNGKeyArray):
        k_softmax, k_mlp = jax.random.split(key)
        d = cfg.input_dims
        self.softmax = SharedEmbeddingSoftmaxConfig(num_classes=d, input_dims=d, init=cfg.init, use_bias=True).build(
            k_softmax
        )
        widths = (cfg.hidden_dims,) * (cfg.num_layers - 1) + (d,)
        mlp = MLPConfig(hidden_dims=widths, activation=ActivationConfig(name="relu"), init=cfg.init)
        self.mlp = mlp.build(k_mlp, input_dims=d)

    def compute_predictions(self, batch: Batch, ctx: Context) -> tuple[Array, Context]:
        ids = jnp.asarray(batch["ids"])
        x = self.softmax.lookup(ids).astype(ctx.dtype or jnp.float32)
        y, ctx = call(self.mlp, x.reshape(-1, x.shape[-1]), ctx, "mlp_layers_0")
        return self.softmax.logits(y).reshape(*ids.shape, -1), ctx

    def compute_loss(self, predictions: Array, batch: Batch) -> Metrics:
        weights = jnp.asarray(batch["weights"], jnp.float32)
        correct = (jnp.argmax(predictions, axis=-1) == jnp.asarray(batch["labels"])) * weights
        return {"total_loss": weighted_mean(jnp.sum(correct), jnp.sum(weights))}
