"""The model contract (Pax's BaseModel, in pure form): what every model family answers.

    predictions, ctx = model.compute_predictions(batch, ctx)     # forward; ctx threads key,
                                                                 #   state, summaries, mode
    metrics = model.compute_loss(predictions, batch)             # {name: Weighted(value, weight)}

- `batch` is a dict of arrays, batch dimension leading, with the keys the model declares in
  `input_keys` (plus optional ones it reads with `.get`). The Task checks them and never reads
  a key itself: that is what lets one Task train a language model, a classifier or a user's
  own model.
- `predictions` is whatever the model wants to hand from its forward to its loss (logits, or
  the last hidden layer when the loss is computed a chunk at a time): the Task never looks
  inside.
- `compute_loss` returns weighted metrics (pax_eqx.metrics): every metric a mean with its
  weight, padded rows weighing 0, so averages over microbatches, eval batches and hosts are
  exact. `loss_name` names the metric training minimises by default; a TaskConfig may name
  several, with weights (Pax's LossAggregator).
- `per_example_outputs(predictions, batch)` (optional, Pax's per_example_out) gives host-side
  eval metrics (`data.eval.metrics`: a confusion matrix, ...) what they read.
- Decoding is optional (`decodes = True` on the config when the model has the decoding calls
  `pax_eqx.models.decoding` uses: `init_cache`, `extend_step`).

A model is built by its config, `ModelConfig.build(key)`. A user's own model family subclasses
both and plugs into the same Task, CLI, checkpoints and summaries.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import equinox as eqx
from jaxtyping import Array, ArrayLike, PRNGKeyArray

from pax_eqx.config import Config, config
from pax_eqx.layers.base import Context
from pax_eqx.metrics import Metrics

Batch = dict[str, ArrayLike]


class Model(eqx.Module):
    """Base of every model family; see the module docstring for the contract."""

    input_keys: ClassVar[tuple[str, ...]] = ()
    """The batch keys `compute_predictions` / `compute_loss` need (others are optional)."""
    loss_name: ClassVar[str] = "loss"
    """The metric minimised when the task names no other."""

    @abc.abstractmethod
    def compute_predictions(self, batch: Batch, ctx: Context) -> tuple[Any, Context]:
        """The forward pass: predictions, and the context with new state and side outputs.
        Inputs are cast to `ctx.dtype` (the activation dtype) when it is set."""

    @abc.abstractmethod
    def compute_loss(self, predictions: Any, batch: Batch) -> Metrics:
        """Weighted metrics of the predictions against the batch, including `loss_name`."""

    def per_example_outputs(self, predictions: Any, batch: Batch) -> dict[str, Array]:
        """Pax's per_example_out: arrays with a leading batch axis that host-side eval metrics
        (`data.eval.metrics`) read, with `weight` marking real rows. None by default."""
        return {}


@config
class ModelConfig(Config):
    """Base of every model config: the template `build(key)` turns into a `Model`."""

    decodes: ClassVar[bool] = False
    """True when the built model can decode (sample continuations of a prompt)."""

    def validate(self) -> None:
        """Every check of this config's own fields (ConfigError names the field); the default
        has none."""

    @abc.abstractmethod
    def build(self, key: PRNGKeyArray) -> Model:
        """The model, with freshly initialised parameters."""
