"""BertModel: a bidirectional transformer trained as a masked LM (Praxis' `layers.models.BertModel`).

    ids [B, T] -> masked_lm (15% chosen: 80% mask id, 10% random id, 10% kept) -> embed
      (+ positions) -> StackedTransformer, no causal mask -> final norm -> logits [B, T, V]
    loss: cross-entropy against the original ids at the chosen positions only

It is the language model with two differences, so it is one: `BertModelConfig` extends
`LanguageModelConfig` (every size, position, stack, remat, MoE and pipeline option means the same)
and `BertModel` extends `LanguageModel` (the same parameters under the same names, so a Paxml
BertModel checkpoint, whose TransformerLm is its child `lm` as a LanguageModel's is, imports with
`python -m pax_eqx.import_pax`). The differences:

- attention is bidirectional: `block.attention.causal` must be False (the default here);
- the model masks its own input, as Praxis' BertModel does, with `masked_lm`'s augmenter
  (layers.masked_lm): in training from the Context's key, in eval from fixed keys per row. A
  batch that carries `masked_ids` and `masked_pos` (masking done by the data, Paxml's MLPerf
  input; or a test injecting Praxis' decisions) is used as it is, as Praxis does.

The batch is the language model's rows (`ids`; `segment_ids` / `segment_pos` when packed): the
text is `ids` itself, its `labels` and `weights` (the next tokens) are not read. Padding (segment
0) is never chosen and is masked out of attention. Metrics (each weighted by the number of chosen
positions): `avg_xent` (= `log_pplx`), the masked-LM loss minimised, and `accuracy`, the fraction
of chosen positions whose argmax is the original token (Praxis' fraction_of_correct_preds).

Decoding fills masks: `python -m pax_eqx.decode --prompt "To be, or not to [MASK][MASK]"`. Each
literal `[MASK]` in the prompt becomes the mask id (any tokenizer: the text between masks is
encoded piece by piece), one forward runs with no masking, and every mask is replaced by the
argmax token; the whole text is printed. With the byte tokenizer one mask is one byte.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from pax_eqx.config import ConfigError, check_range, config
from pax_eqx.layers.attention_config import AttentionConfig
from pax_eqx.layers.base import Context, Mode, call
from pax_eqx.layers.masked_lm import MaskedLmAugmenter, MaskedLmConfig
from pax_eqx.layers.transformers import TransformerConfig
from pax_eqx.metrics import Metrics
from pax_eqx.models.language_model import LanguageModel, LanguageModelConfig, lm_metrics
from pax_eqx.models.model import Batch

MASK_TEXT = "[MASK]"
"""How a decode prompt writes a mask."""


@config
class BertModelConfig(LanguageModelConfig):
    """A BERT masked language model: LanguageModelConfig's fields (see there), with a
    bidirectional `block` (attention.causal False), and

    mask_token_id: the id a masked token becomes (Praxis' BertModel.mask_token_id); an id of the
      model's vocabulary. An id past the tokenizer's (the byte tokenizer's 260 with vocab_size 261)
      keeps the mask apart from every real token.
    masking: which fraction of the real tokens are predicted and what the model sees there
      (Praxis' MaskedLmDataAugmenter defaults: 12% mask, 1.5% random, 1.5% unchanged).
    """

    fills_prompts: ClassVar[bool] = True
    per_example_keys: ClassVar[tuple[str, ...]] = ()

    block: TransformerConfig = TransformerConfig(attention=AttentionConfig(causal=False))
    mask_token_id: int = 0
    masking: MaskedLmConfig = MaskedLmConfig()

    def validate(self) -> None:
        """The language model's checks, bidirectional attention, and a mask id of the vocabulary."""
        super().validate()
        if self.block.attention.causal:
            raise ConfigError(
                "model.block.attention.causal=True: a BERT model attends both ways (Praxis' BIDIRECTIONAL "
                "TransformerLm); pass --model.block.attention.no-causal, or train a LanguageModel for a causal LM."
            )
        check_range(self, "mask_token_id", ge=0, lt=self.vocab_size, prefix="model", note="an id of model.vocab_size")

    def with_token_vocab_size(self, vocab_size: int) -> BertModelConfig:
        """How the model follows a prepared corpus's tokenizer of `vocab_size` ids: a mask that is
        the last id (one of its own, past the tokenizer's) stays the last, one past the new ids;
        any other mask id is kept as it is."""
        if self.mask_token_id == self.vocab_size - 1:
            return self.replace(vocab_size=vocab_size + 1, mask_token_id=vocab_size)
        return self.replace(vocab_size=vocab_size)

    def build(self, key: PRNGKeyArray) -> BertModel:
        self.ensure_valid()
        return BertModel(self, key=key)


class BertPredictions(NamedTuple):
    """What the forward hands the loss: the last layer's output, the chosen positions (1.0 where
    the loss is taken) and the ids the model saw."""

    hidden: Float[Array, "batch time embed"]
    weights: Float[Array, "batch time"]
    masked_ids: Any


class BertModel(LanguageModel):
    """See the module docstring. Batch: `ids` [batch, time] (packed rows add `segment_ids` and
    `segment_pos`; pre-masked rows add `masked_ids` and `masked_pos`)."""

    input_keys: ClassVar[tuple[str, ...]] = ("ids",)
    loss_name: ClassVar[str] = "avg_xent"

    masked_lm: MaskedLmAugmenter
    mask_token_id: int = eqx.field(static=True)

    def __init__(self, cfg: BertModelConfig, *, key: PRNGKeyArray):
        super().__init__(cfg, key=key)
        self.masked_lm = cfg.masking.build(vocab_size=cfg.vocab_size, mask_token_id=cfg.mask_token_id)
        self.mask_token_id = cfg.mask_token_id

    # The model contract (pax_eqx.models.model) -----------------------------------------------
    def compute_predictions(self, batch: Batch, ctx: Context) -> tuple[BertPredictions, Context]:
        """Masks `ids` (or takes the batch's `masked_ids` / `masked_pos`) and runs the stack on them."""
        batch = {k: jnp.asarray(v) for k, v in batch.items()}
        ids = batch["ids"]
        segment_ids = batch.get("segment_ids")
        paddings = jnp.zeros(ids.shape, jnp.float32) if segment_ids is None else 1.0 - (segment_ids > 0)
        if "masked_ids" in batch:
            masked_ids, chosen = batch["masked_ids"].astype(ids.dtype), batch["masked_pos"] > 0
        else:
            (masked_ids, chosen), ctx = call(self.masked_lm, ids, ctx, "masked_lm", paddings=paddings)
        hidden, ctx = self.hidden(
            masked_ids, ctx, segment_ids=segment_ids, segment_pos=batch.get("segment_pos"),
            paddings=None if segment_ids is None else paddings,
        )  # fmt: skip
        return BertPredictions(hidden, chosen.astype(jnp.float32), masked_ids), ctx

    def compute_loss(self, predictions: BertPredictions, batch: Batch) -> Metrics:
        """avg_xent (= log_pplx) and accuracy at the chosen positions, against the original ids."""
        labels = jnp.asarray(batch["ids"])
        weights = predictions.weights
        if not self.loss_chunk_size:
            return self.metrics_from_logits(self.logits(predictions.hidden), labels, weights)
        softmax = self.embedding if self.softmax is None else self.softmax
        xent_sum, correct_sum = softmax.chunked_xent_sums(
            self.final_norm(predictions.hidden), labels, weights, self.loss_chunk_size
        )
        return lm_metrics(xent_sum, correct_sum, jnp.sum(weights))

    def per_example_outputs(self, predictions: BertPredictions, batch: Batch) -> dict[str, Array]:
        """None: the language model's (next-token labels for bits per byte) do not apply."""
        return {}

    # Decoding: filling masks -------------------------------------------------------------------
    def fill_prompt(self, prompt: str, tokenizer: Any) -> str:
        """`prompt` with every `[MASK]` replaced by the model's most likely token there."""
        ids: list[int] = []
        for i, piece in enumerate(prompt.split(MASK_TEXT)):
            if i:
                ids.append(self.mask_token_id)
            ids += tokenizer.encode(piece) if piece else []
        if not ids:
            return prompt
        if len(ids) > self.max_seq_len:
            raise ConfigError(
                f"decode.prompt is {len(ids)} tokens long, more than model.max_seq_len={self.max_seq_len}; shorten it."
            )
        filled = _fill(self, jnp.asarray([ids], jnp.int32))
        return tokenizer.decode(jax.device_get(filled)[0].tolist())

    def incremental_decoder(self, *args: Any, **kwargs: Any) -> Any:
        raise ConfigError(
            f"a BERT model fills masks; it does not continue prompts. Write {MASK_TEXT} where a token is missing."
        )

    def continue_prompts(self, *args: Any, **kwargs: Any) -> Any:
        return self.incremental_decoder()


@eqx.filter_jit
def _fill(model: BertModel, ids: Array) -> Array:
    """The ids with every mask id replaced by the argmax of the logits there (no masking)."""
    hidden, _ = model.hidden(ids, Context(mode=Mode.DECODE))
    best = jnp.argmax(model.logits(hidden), axis=-1).astype(ids.dtype)
    return jnp.where(ids == model.mask_token_id, best, ids)
