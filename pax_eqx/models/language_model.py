"""LanguageModel: a decoder-only transformer LM (Praxis TransformerLm + Paxml LanguageModel).

    ids [B, T] -> embed (+ positions) -> StackedTransformer -> final norm -> logits [B, T, V]

`compute_loss` gives Pax's LM metrics from logits; `loss` gives them from the last layer's output
(`hidden`), optionally a chunk of positions at a time (`loss_chunk_size`). Decoding uses the
same modules against a KV cache (`prefill` then `extend_step`); `pax_eqx.models.decoding`
builds sampling on top of them. When every layer attends through the same causal sliding window
(`block.attention.window sliding`, global_layer_interval 0), the caches roll: each holds the
window's left_context slots, not max_seq_len (layers.attentions).

Mixture-of-Experts: `moe_layer_interval` > 0 gives every moe_layer_interval-th layer (0, interval,
2 * interval, ...: GLaM's [MoE, dense] blocks with 2, every layer with 1) the feed-forward of
the `moe` template (experts `moe_hidden_dims` wide, 0 = hidden_dims); 0 is a dense model, and
then `moe` and `moe_hidden_dims` must stay at their defaults. The routers' aux losses
(load balancing, z-loss) reach the Task's loss through the Context, summed over the MoE layers.

The experiment-level numbers (num_layers, model_dims, ...) are top-level fields, as Pax
experiments set them as class constants; the `block` template carries everything else about
a layer and gets its dimensions from here.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from pax_eqx.config import ConfigError, check_range, config, require_positive
from pax_eqx.layers.attentions import KVCache
from pax_eqx.layers.base import Context, call
from pax_eqx.layers.embedding_softmax import (
    EmbeddingConfig,
    SharedEmbeddingSoftmaxConfig,
    SoftmaxConfig,
)
from pax_eqx.layers.initializers import WeightInit, gaussian
from pax_eqx.layers.moe import MoEFeedForwardConfig
from pax_eqx.layers.normalizations import LayerNormConfig, NormConfig
from pax_eqx.layers.pipeline import PipelineConfig
from pax_eqx.layers.position_embeddings import TrainablePositionalEmbeddingConfig, sinusoidal_position_embedding
from pax_eqx.layers.relative_position_bias import RelativePositionBiasConfig
from pax_eqx.layers.remat import RematPolicy
from pax_eqx.layers.repeats import StackedTransformerConfig
from pax_eqx.layers.transformers import TransformerConfig
from pax_eqx.metrics import Metrics, weighted_mean
from pax_eqx.models.decoding import generate
from pax_eqx.models.language_model_decoder import LanguageModelDecoder
from pax_eqx.models.model import Batch, Model, ModelConfig, StepPlan, StepShape
from pax_eqx.models.stack_checks import check_global_layers, check_moe_fields, check_stack_fields
from pax_eqx.models.token_data import check_token_data

PositionEmbedding = Literal["trainable", "sinusoidal", "rotary", "relative_bias", "none"]


@config
class LanguageModelConfig(ModelConfig):
    """A decoder-only transformer language model.

    vocab_size: the number of token ids (the embedding's and the softmax's rows).
    max_seq_len: the longest sequence the model takes (the trainable position table's size).
    num_layers: transformer layers (Pax's NUM_LAYERS).
    model_dims: the width of the residual stream (Pax's MODEL_DIMS).
    hidden_dims: the feed-forward's hidden width (Pax's HIDDEN_DIMS).
    num_heads: attention query heads (Pax's NUM_HEADS).
    dim_per_head: each head's width; 0 = model_dims // num_heads. num_kv_heads: key/value heads
      (grouped-query attention); 0 = num_heads.
    position_embedding: "trainable" (GPT), "sinusoidal", "rotary" (in attention), "relative_bias"
      (each layer's attention logits get a learned bias per head and bucket of key - query
      distance, Praxis' DotProductAttention.relative_bias_tpl with T5's causal bucketing) or "none"
      (e.g. with ALiBi or Transformer-XL's relative attention: `block.attention.position_bias`).
    relative_bias: the buckets of position_embedding="relative_bias" (only with it).
    separate_embedding: False ties input embedding and softmax (Pax's SharedEmbeddingSoftmax).
    repeat: True scans one stacked layer over num_layers (fast compile); False lists the layers.
    share_layers: every layer is one layer's weights (ALBERT's cross-layer sharing,
      layers.shared_stack): num_layers applications, stored and counted once.
    remat_policy: what the backward recomputes instead of storing ("none", "full", or a named
      policy of layers.remat).
    unroll: layers per scan step of a repeated stack (num_layers = unrolled fully).
    block: template for each layer (norm policy, activation, dropout, attention options). With
      `block.attention.mask_mode="praxis"` the model also folds padding into the segment mask,
      as Praxis' TransformerLm does (a padded token attends to the earlier padded tokens).
    final_norm: template of the norm after the last layer.
    soft_cap_logits: caps the logits at +-c with c * tanh(logits / c) (0 = off).
    label_smoothing_prob: the probability mass spread over the other tokens in the loss (0 = off).
    scale_embedding_sqrt_depth: multiply the input embedding by sqrt(model_dims) (Praxis'
      softmax scale_sqrt_depth, on in Pax's LM experiments). softmax_bias: a `[vocab]` bias on
      the output logits (Praxis' softmax has one).
    loss_chunk_size: > 0 computes logits, cross-entropy, accuracy and the loss's gradients that
      many positions of every row at a time (`layers.chunked_xent`), so the float32 [batch,
      time, vocab] logits (6.6 GB for GPT3-XL at batch 16) and their gradient never exist
      whole, at no extra matmul; 0 = all at once.
    init: weight init of the projections; embedding_init: of the embedding table(s).
    moe_layer_interval: 0 = dense; n > 0: layers 0, n, 2n, ... have a Mixture-of-Experts
      feed-forward (Praxis' moe_layers; GLaM: 2, MoELarge: 1); num_layers must be a multiple.
    moe: the MoE feed-forward template (experts, top-k, capacity, aux-loss weights, activation).
    moe_hidden_dims: each expert's width; 0 = hidden_dims.
    pipeline: pipeline parallelism of the layers over the mesh's `stage` axis (Pax's NUM_STAGES,
      NUM_MICROBATCHES, CIRCULAR_REPEAT; see layers.pipeline); needs repeat=True.
    global_layer_interval: with a sliding `block.attention.window`, layers n - 1, 2n - 1, ...
      attend globally and the rest through the window (Gemma 2: 2, Gemma 3: 6); 0 = every layer
      windowed. num_layers must be a multiple.
    """

    decodes: ClassVar[bool] = True
    per_example_keys: ClassVar[tuple[str, ...]] = ("labels", "token_weights", "weight")
    prices_step_time: ClassVar[bool] = True

    vocab_size: int = 0
    max_seq_len: int = 0
    num_layers: int = 0
    model_dims: int = 0
    hidden_dims: int = 0
    num_heads: int = 0
    dim_per_head: int = 0
    num_kv_heads: int = 0
    position_embedding: PositionEmbedding = "trainable"
    relative_bias: RelativePositionBiasConfig = RelativePositionBiasConfig()
    separate_embedding: bool = False
    repeat: bool = True
    share_layers: bool = False
    remat_policy: RematPolicy = "none"
    unroll: int = 1
    block: TransformerConfig = TransformerConfig()
    final_norm: NormConfig = LayerNormConfig()
    soft_cap_logits: float = 0.0
    label_smoothing_prob: float = 0.0
    scale_embedding_sqrt_depth: bool = False
    softmax_bias: bool = False
    loss_chunk_size: int = 0
    init: WeightInit = gaussian(0.02)
    embedding_init: WeightInit = gaussian(0.02)
    moe_layer_interval: int = 0
    moe: MoEFeedForwardConfig = MoEFeedForwardConfig()
    moe_hidden_dims: int = 0
    pipeline: PipelineConfig = PipelineConfig()
    global_layer_interval: int = 0

    @property
    def head_dim(self) -> int:
        """Each attention head's width: dim_per_head, or model_dims // num_heads when it is 0."""
        return self.dim_per_head or self.model_dims // max(self.num_heads, 1)

    def stack_config(self) -> StackedTransformerConfig:
        """The layer stack this model builds: the experiment-level sizes and init given to `block`."""
        return StackedTransformerConfig(
            num_layers=self.num_layers, model_dims=self.model_dims, hidden_dims=self.hidden_dims,
            num_heads=self.num_heads, dim_per_head=self.dim_per_head, num_kv_heads=self.num_kv_heads,
            use_rotary=self.position_embedding == "rotary", init=self.init, block=self.block, repeat=self.repeat,
            relative_bias=self.relative_bias if self.position_embedding == "relative_bias" else None,
            share_layers=self.share_layers,
            remat_policy=self.remat_policy, unroll=self.unroll,
            moe=self.moe if self.moe_layer_interval else None, moe_layer_interval=max(self.moe_layer_interval, 1),
            moe_hidden_dims=self.moe_hidden_dims, pipeline=self.pipeline,
            # Praxis' TransformerLm folds padding into the segment mask (block.attention.mask_mode).
            fold_padding_with_segment_mask=self.block.attention.mask_mode == "praxis",
            global_layer_interval=self.global_layer_interval,
        )  # fmt: skip

    def validate(self) -> None:
        """Every check of the model's own fields and of combinations where one makes another do
        nothing; ConfigError names the field, the value and the fix. The children (block,
        final_norm, inits) check their own fields when they are made."""
        require_positive(
            self, ("vocab_size", "max_seq_len", "num_layers", "model_dims", "hidden_dims", "num_heads"), "model"
        )
        check_range(self, "loss_chunk_size", ge=0, prefix="model", note="0 = all at once")
        check_range(self, ("dim_per_head", "num_kv_heads"), ge=0, prefix="model", note="0 = its default")
        check_range(self, "unroll", ge=1, prefix="model")
        check_range(self, "soft_cap_logits", ge=0, prefix="model", note="0 = off")
        check_range(self, "label_smoothing_prob", ge=0, lt=1, prefix="model")
        check_stack_fields(self, num_layers=self.num_layers)
        check_moe_fields(self, num_layers=self.num_layers)
        check_global_layers(self, num_layers=self.num_layers)
        if self.share_layers and (self.moe_layer_interval or self.pipeline.enabled):
            other = "model.moe_layer_interval" if self.moe_layer_interval else "model.pipeline.num_stages"
            raise ConfigError(
                f"model.share_layers=True with {other}: MoE blocks and pipeline stages are distinct layers, "
                f"which one shared layer cannot be; drop --model.share-layers or set {other} back to its default."
            )
        if self.position_embedding != "relative_bias" and self.relative_bias != RelativePositionBiasConfig():
            default = RelativePositionBiasConfig()
            changed = ", ".join(
                f"model.relative_bias.{f.name}={getattr(self.relative_bias, f.name)!r}"
                for f in dataclasses.fields(default)
                if getattr(self.relative_bias, f.name) != getattr(default, f.name)
            )
            raise ConfigError(
                f"{changed} has no effect with model.position_embedding={self.position_embedding!r}: the relative "
                "bias applies only with position_embedding='relative_bias'. Remove the flag or set "
                "--model.position-embedding relative_bias."
            )
        if self.pipeline.enabled:
            if not self.repeat:
                raise ConfigError(
                    "model.pipeline.num_stages > 1 needs model.repeat=True: the stages are slices of the stacked "
                    "[num_layers, ...] layer weights."
                )
            block = math.lcm(max(self.moe_layer_interval, 1), max(self.global_layer_interval, 1))
            units, chunks = self.num_layers // block, self.pipeline.num_chunks
            if units % chunks:
                raise ConfigError(
                    f"model.num_layers={self.num_layers} (model.moe_layer_interval={self.moe_layer_interval}: {units} "
                    f"scanned layers or blocks) cannot be cut into model.pipeline.num_stages x circular_repeat = "
                    f"{self.pipeline.num_stages} x {self.pipeline.circular_repeat} equal chunks; change the layers or "
                    "the pipeline."
                )
            if self.unroll > units // chunks:
                raise ConfigError(
                    f"model.unroll={self.unroll} is more than the {units // chunks} layers each pipeline stage scans "
                    f"(model.num_layers={self.num_layers} / (model.pipeline.num_stages={self.pipeline.num_stages} x "
                    f"circular_repeat={self.pipeline.circular_repeat})); lower unroll."
                )
            if self.pipeline.remat_stage and self.remat_policy == "none":
                raise ConfigError(
                    "model.pipeline.remat_stage=True has no effect with model.remat_policy='none' (nothing is "
                    "rematerialised); choose a remat_policy (e.g. full) or set remat_stage=False."
                )

    def check_data(self, data: Any) -> None:
        check_token_data(self, data, pairs=False)

    def tokens_per_example(self, data: Any) -> int:
        return data.seq_len

    def token_vocab_size(self) -> int | None:
        return self.vocab_size

    def with_token_vocab_size(self, vocab_size: int):
        return self.replace(vocab_size=vocab_size)

    def step_plan(self, step: StepShape) -> StepPlan:
        from pax_eqx.models.lm_plan import language_model_plan  # the dry run's arithmetic, kept apart

        return language_model_plan(self, step)

    def build(self, key: PRNGKeyArray) -> LanguageModel:
        self.ensure_valid()
        return LanguageModel(self, key=key)


class LanguageModel(Model):
    """See the module docstring. Batch: `ids`, `labels`, `weights` [batch, time]; packed rows add
    `segment_ids` and `segment_pos`."""

    input_keys: ClassVar[tuple[str, ...]] = ("ids", "labels", "weights")
    loss_name: ClassVar[str] = "avg_xent"

    embedding: eqx.Module  # SharedEmbeddingSoftmax, or Embedding when separate
    softmax: eqx.Module | None  # FullSoftmax when separate_embedding
    position: eqx.Module | None
    stack: eqx.Module
    final_norm: eqx.Module
    position_embedding: str = eqx.field(static=True)
    max_seq_len: int = eqx.field(static=True)
    loss_chunk_size: int = eqx.field(static=True)

    def __init__(self, cfg: LanguageModelConfig, *, key: PRNGKeyArray):
        k_emb, k_soft, k_pos, k_stack = jax.random.split(key, 4)
        v, d = cfg.vocab_size, cfg.model_dims
        if cfg.separate_embedding:
            self.embedding = EmbeddingConfig(
                num_classes=v, input_dims=d, init=cfg.embedding_init, scale_sqrt_depth=cfg.scale_embedding_sqrt_depth
            ).build(k_emb)
            self.softmax = SoftmaxConfig(
                input_dims=d, num_classes=v, init=cfg.init, use_bias=cfg.softmax_bias,
                soft_cap_logits=cfg.soft_cap_logits, label_smoothing_prob=cfg.label_smoothing_prob,
            ).build(k_soft)  # fmt: skip
        else:
            self.embedding = SharedEmbeddingSoftmaxConfig(
                num_classes=v, input_dims=d, init=cfg.embedding_init,
                scale_sqrt_depth=cfg.scale_embedding_sqrt_depth, use_bias=cfg.softmax_bias,
                soft_cap_logits=cfg.soft_cap_logits, label_smoothing_prob=cfg.label_smoothing_prob,
            ).build(k_emb)  # fmt: skip
            self.softmax = None
        self.position = None
        if cfg.position_embedding == "trainable":
            self.position = TrainablePositionalEmbeddingConfig(
                max_seq_length=cfg.max_seq_len, embedding_dims=d, init=cfg.embedding_init
            ).build(k_pos)
        self.stack = cfg.stack_config().build(k_stack)
        self.final_norm = cfg.final_norm.build(d)
        self.position_embedding = cfg.position_embedding
        self.max_seq_len = cfg.max_seq_len
        self.loss_chunk_size = cfg.loss_chunk_size

    def incremental_decoder(
        self, prompts: list[list[int]], max_new_tokens: int, pad_id: int, bos_id: int = 0, length: int | None = None
    ) -> LanguageModelDecoder:
        """Prompts left-padded to `length` (default: the longest); `bos_id` is unused: a prompt
        starts the continuation itself."""
        return LanguageModelDecoder.from_prompts(self, prompts, max_new_tokens, pad_id, length=length)

    def continue_prompts(self, prompts: list[list[int]], cfg: Any, key: PRNGKeyArray, pad_id: int) -> list[list[int]]:
        """As the contract's, sliding a window past max_seq_len (`decoding.generate`)."""
        return generate(self, prompts, cfg, key, pad_id=pad_id)

    @property
    def vocab_size(self) -> int:
        """Token ids the model reads: rows of its embedding table."""
        emb = self.embedding
        return (emb.emb_var if self.softmax is not None else emb.w).shape[0]

    # Pieces shared by training and decoding ---------------------------------------------------
    def embed(
        self, ids: Int[Array, "batch time"], positions: Int[Array, "batch time"], contiguous: bool = False
    ) -> Float[Array, "batch time embed"]:
        """Token plus position embeddings. contiguous: `positions` is arange(time) in every row."""
        emb = self.embedding
        x = emb.lookup(ids) if self.softmax is None else emb(ids)
        if self.position is not None:
            x = x + (self.position.first(ids.shape[1]) if contiguous else self.position(positions))
        elif self.position_embedding == "sinusoidal":
            x = x + sinusoidal_position_embedding(positions, x.shape[-1])
        return x

    def logits(self, x: Float[Array, "batch time embed"]) -> Float[Array, "batch time vocab"]:
        x = self.final_norm(x)
        return (self.embedding if self.softmax is None else self.softmax).logits(x)

    def xent(
        self, logits: Float[Array, "batch time vocab"], labels: Int[Array, "batch time"]
    ) -> Float[Array, "batch time"]:
        return (self.embedding if self.softmax is None else self.softmax).xent(logits, labels)

    # The model contract (pax_eqx.models.model) -----------------------------------------------
    def compute_predictions(self, batch: Batch, ctx: Context) -> tuple[Float[Array, "batch time embed"], Context]:
        """The last layer's output for `batch["ids"]` (packed rows: `segment_ids`, `segment_pos`).

        The predictions are the hidden states, not logits: `compute_loss` turns them into
        logits itself, `loss_chunk_size` positions at a time when set, so the whole
        [batch, time, vocab] logits need never exist.
        """
        batch = {k: jnp.asarray(v) for k, v in batch.items()}
        segment_ids = batch.get("segment_ids")
        paddings = None if segment_ids is None else 1.0 - (segment_ids > 0)
        return self.hidden(
            batch["ids"], ctx, segment_ids=segment_ids, segment_pos=batch.get("segment_pos"), paddings=paddings
        )

    def compute_loss(self, predictions: Float[Array, "batch time embed"], batch: Batch) -> Metrics:
        """Pax's LM metrics of the hidden states against `labels`, weighted by `weights`: each a
        mean over the weighted predictions, with their count as its weight."""
        labels, weights = jnp.asarray(batch["labels"]), jnp.asarray(batch["weights"], jnp.float32)
        if not self.loss_chunk_size:
            return self.metrics_from_logits(self.logits(predictions), labels, weights)
        softmax = self.embedding if self.softmax is None else self.softmax
        xent_sum, correct_sum = softmax.chunked_xent_sums(
            self.final_norm(predictions), labels, weights, self.loss_chunk_size
        )
        return lm_metrics(xent_sum, correct_sum, jnp.sum(weights))

    # Whole-sequence forward ------------------------------------------------------------------
    def __call__(
        self, ids: Int[Array, "batch time"], ctx: Context, **inputs
    ) -> tuple[Float[Array, "batch time vocab"], Context]:
        """Logits for every position; `inputs` are `hidden`'s (segment_ids, segment_pos, paddings)."""
        x, ctx = self.hidden(ids, ctx, **inputs)
        return self.logits(x), ctx

    def hidden(
        self,
        ids: Int[Array, "batch time"],
        ctx: Context,
        *,
        segment_ids: Int[Array, "batch time"] | None = None,
        segment_pos: Int[Array, "batch time"] | None = None,
        paddings: Float[Array, "batch time"] | None = None,
    ) -> tuple[Float[Array, "batch time embed"], Context]:
        """The last layer's output, before the final norm, in `ctx.dtype` when it is set."""
        b, t = ids.shape
        if t > self.max_seq_len:
            raise ConfigError(
                f"sequence length {t} is longer than model.max_seq_len={self.max_seq_len}; "
                "raise model.max_seq_len or shorten data.seq_len."
            )
        if segment_pos is None:
            positions = jnp.broadcast_to(jnp.arange(t), (b, t))
            x = self.embed(ids, positions, contiguous=True)
        else:
            positions = segment_pos
            if self.position is None:
                x = self.embed(ids, positions)
            else:  # unpacked rows (positions arange(t) in every row) take the table's slice, not a gather
                contiguous = jnp.all(positions == jnp.arange(t))
                x = jax.lax.cond(
                    contiguous, lambda: self.embed(ids, positions, contiguous=True), lambda: self.embed(ids, positions)
                )
        if ctx.dtype is not None:
            x = x.astype(ctx.dtype)
        x, ctx = call(
            self.stack, x, ctx, "transformer",
            segment_ids=segment_ids, segment_pos=positions, paddings=paddings,
        )  # fmt: skip
        return x, ctx

    def per_example_outputs(self, predictions: Float[Array, "batch time embed"], batch: Batch) -> dict[str, Array]:
        """The targets and their weights, [batch, time] (bits per byte counts their bytes), and
        each row's weight (0 for a padded row)."""
        weights = jnp.asarray(batch["weights"], jnp.float32)
        return {
            "labels": jnp.asarray(batch["labels"], jnp.int32),
            "token_weights": weights,
            "weight": (jnp.sum(weights, axis=-1) > 0).astype(jnp.float32),
        }

    def metrics_from_logits(
        self,
        logits: Float[Array, "batch time vocab"],
        labels: Int[Array, "batch time"],
        weights: Float[Array, "batch time"],
    ) -> Metrics:
        """Pax's LM metrics from whole logits (what `compute_loss` gives without chunking)."""
        weights = weights.astype(jnp.float32)
        xent = self.xent(logits, labels)
        correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
        return lm_metrics(jnp.sum(xent * weights), jnp.sum(correct * weights), jnp.sum(weights))

    # Decoding ---------------------------------------------------------------------------------
    def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> KVCache | tuple[KVCache, ...]:
        return self.stack.init_cache(batch, max_len, dtype)

    def extend_step(
        self,
        ids: Int[Array, "batch new"],
        cache: KVCache | tuple[KVCache, ...],
        start: Int[Array, ""] | Int[Array, " batch"],
        positions: Int[Array, "batch new"],
        key_valid: Bool[Array, "batch max_len"],
    ) -> tuple[Float[Array, "batch new vocab"], KVCache | tuple[KVCache, ...]]:
        """Logits for `ids` written at cache slots [start, start + new).

        Prefill is extend_step with all prompt tokens; generation is extend_step with one.
        """
        x = self.embed(ids, positions)
        x = x.astype(cache.k.dtype if isinstance(cache, KVCache) else cache[0].k.dtype)
        x, cache = self.stack.decode(x, cache, start, positions, key_valid)
        return self.logits(x), cache


def lm_metrics(xent_sum, correct_sum, num) -> Metrics:
    """avg_xent (= log_pplx, Pax reports both) and accuracy over `num` weighted predictions."""
    avg_xent = weighted_mean(xent_sum, num)
    return {"avg_xent": avg_xent, "log_pplx": avg_xent, "accuracy": weighted_mean(correct_sum, num)}
