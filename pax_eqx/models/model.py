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
- Decoding is optional: `decodes = True` on the config when the model returns an
  `IncrementalDecoder` (`incremental_decoder`, pax_eqx.models.incremental) for its prompts;
  sampling and beam search are written once against that protocol. `decodes_inputs` marks a
  model that maps inputs to outputs (an encoder-decoder: with no prompt, decode reads eval
  examples). `decodes_examples` marks a model whose decode is one batch in, one record per
  example out (Pax's `decode` + `process_decode_out`: a classifier's predicted class): it
  answers `decode_examples(batch)`, and the decode program prints and writes the records.
  `fills_prompts` marks a model whose decode rewrites the prompt (a masked LM fills its
  `[MASK]`s): it answers `fill_prompt(text, tokenizer)`, and the decode program prints the text.

The programs (train, eval, decode, the dry run) ask a model's config what they need instead of
testing its class: which data it takes (`check_data`), what its throughput counts
(`tokens_per_example`), the vocabulary its tokens need (`token_vocab_size`), its share of a
train step's memory and layout (`step_plan`). A user's own model family subclasses `Model` and
`ModelConfig`, answers what applies, and gets every program.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar

import equinox as eqx
from jaxtyping import Array, ArrayLike, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, config
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

    def incremental_decoder(self, prompts: list[list[int]], max_new_tokens: int, pad_id: int, bos_id: int = 0) -> Any:
        """The `IncrementalDecoder` continuing `prompts` (token ids; a sequence-to-sequence model:
        its inputs, decoded from `bos_id`) by up to `max_new_tokens`: what sampling and beam search
        run. Models whose config `decodes` implement it."""
        raise ConfigError(f"{type(self).__name__} does not decode: it has no incremental_decoder.")

    def decode_examples(self, batch: Batch, ctx: Context) -> dict[str, Array]:
        """Pax's decode of a batch (`ctx` in eval mode, with the model's state): arrays with a
        leading batch axis, one record per example (the decode program writes row i of each as
        a JSON record). Models whose config `decodes_examples` implement it; `batch` may lack
        the labels (files to decode)."""
        raise ConfigError(f"{type(self).__name__} does not decode examples: it has no decode_examples.")

    def fill_prompt(self, prompt: str, tokenizer: Any) -> str:
        """The text `prompt` with its gaps filled (a masked LM: every `[MASK]` replaced by its
        most likely token). Models whose config `fills_prompts` implement it."""
        raise ConfigError(f"{type(self).__name__} does not fill prompts: it has no fill_prompt.")

    def continue_prompts(self, prompts: list[list[int]], cfg: Any, key: PRNGKeyArray, pad_id: int) -> list[list[int]]:
        """Continuations of `prompts` (token ids, each cut before `cfg.eos_id`; `cfg` a
        SampleConfig): the best output of its strategy, one pass of `incremental_decoder`. A model
        may do more (the language model slides a window past its max_seq_len)."""
        from pax_eqx.models.sampler import cut_at_eos

        decoder = self.incremental_decoder(prompts, cfg.max_new_tokens, pad_id)
        return cut_at_eos(cfg.strategy.best(decoder, cfg, key, pad_id).tolist(), cfg.eos_id)


@dataclass(frozen=True)
class StepShape:
    """What a plan of one train step (the dry run) knows beyond the model: the global batch
    (rows), the data's sequence length (0: no sequences), the activation dtype, gradient
    accumulation's microbatches, and the mesh: `mesh_shape` {mesh axis: size} and `rules`
    {logical axis: mesh axes} (pax_eqx.sharding)."""

    global_batch: int
    seq_len: int
    fprop_dtype: str
    num_microbatches: int
    mesh_shape: dict[str, int]
    rules: dict[str, tuple[str, ...]]

    def ways(self, logical: str) -> int:
        """The devices a logical axis (batch, mlp, heads, ...) is split over."""
        n = 1
        for axis in self.rules.get(logical, ()):
            n *= self.mesh_shape[axis]
        return n


@dataclass(frozen=True)
class StepPlan:
    """A model's share of the dry run: activation bytes per device (None: not estimated), what
    they assume (`activation_note`), and lines on its layout (pipeline stages, all-to-all)."""

    activation_bytes: int | None = None
    activation_note: str = ""
    lines: list[str] = field(default_factory=list)


@config
class ModelConfig(Config):
    """Base of every model config: the template `build(key)` turns into a `Model`."""

    decodes: ClassVar[bool] = False
    """True when the built model can decode (`Model.incremental_decoder`)."""
    decodes_inputs: ClassVar[bool] = False
    """True when decoding maps inputs to outputs (an encoder-decoder): with no prompt, the
    decode program reads eval examples' inputs and shows their targets."""
    decodes_examples: ClassVar[bool] = False
    """True when decode maps each example to a record (Model.decode_examples), e.g. a classifier."""
    fills_prompts: ClassVar[bool] = False
    """True when decoding rewrites the prompt instead of continuing it (a masked LM fills the
    prompt's masks: Model.fill_prompt); the decode strategy does not apply, only decode.prompt."""
    per_example_keys: ClassVar[tuple[str, ...]] = ()
    """The keys Model.per_example_outputs gives (what score metrics of data.eval.metrics can read)."""
    prices_step_time: ClassVar[bool] = False
    """True when `--dry-run --recommend` can price the model's step (programs/plan/recommend.py reads a
    decoder-only transformer's block, layers, heads and vocabulary)."""

    def validate(self) -> None:
        """Every check of this config's own fields (ConfigError names the field); the default has
        none. A model config is the one config not checked when it is made: its sizes have no
        default (0 = unset until an experiment sets them), so `LanguageModelConfig()` must exist.
        It is checked once, by `ensure_valid`, where it is used (the experiment's check, `build`)."""

    def ensure_valid(self) -> ModelConfig:
        """This config, `validate`d once: a second call on the same object (the experiment checked
        it, then the Task builds it) does not check it again."""
        if not getattr(self, "_valid", False):
            self.validate()
            object.__setattr__(self, "_valid", True)  # not a field: equality and JSON ignore it
        return self

    def check_data(self, data: Any) -> None:
        """ConfigError when `data` (a DataConfig) gives rows this model cannot take (the kind of
        rows, lengths that do not fit); the default takes any."""

    def tokens_per_example(self, data: Any) -> int:
        """Tokens one example of `data` carries: throughput is counted in tokens when > 1 (a
        language model: data.seq_len), else in examples (the default)."""
        return 1

    def token_vocab_size(self) -> int | None:
        """The vocabulary the model's token ids index (the tokenizer's, sentinels included, must
        fit in it); None when the model reads no tokens (the default)."""
        return None

    def with_num_classes(self, num_classes: int) -> ModelConfig:
        """This config predicting `num_classes` classes: how a classifier follows the classes of a
        prepared image corpus (command_line/data_files.py). Itself by default."""
        return self

    def with_token_vocab_size(self, vocab_size: int) -> ModelConfig:
        """This config with a vocabulary of `vocab_size` token ids: how a model follows the
        tokenizer of a prepared corpus (command_line/data_files.py). Itself by default (a model
        that reads no tokens); a family with `token_vocab_size` overrides both."""
        return self

    def step_plan(self, step: StepShape) -> StepPlan:
        """The dry run's estimate of the activations of one train step per device, and lines on
        the model's layout; the default estimates nothing (the dry run says so)."""
        return StepPlan(activation_note=f"not estimated for a {type(self).__name__}; leave headroom for them")

    @abc.abstractmethod
    def example_from_file(self, path: str, data: Any) -> dict[str, Any]:
        """One example (numpy arrays, no batch axis, no labels) read from a file the user names
        for decoding (`decode.inputs`), as `data` would give it. Models whose config
        `decodes_examples` and that take files implement it."""
        raise ConfigError(
            f"decode.inputs: the model ({type(self).__name__}) does not read examples from files; "
            "decode the eval split instead (drop --decode.inputs)."
        )

    def build(self, key: PRNGKeyArray) -> Model:
        """The model, with freshly initialised parameters."""
