"""SequenceModel: a T5-style encoder-decoder transformer (Praxis TransformerEncoderDecoder +
Paxml SequenceModel).

    inputs [B, S] -> embed -> encoder stack (bidirectional) -> norm -> memory [B, S, D]
    target_ids [B, T] -> embed -> decoder stack (causal self-attention, cross-attention to
        memory, input paddings masked) -> norm -> logits [B, T, V]

The batch is Pax's `(src, tgt)` flattened: `inputs`, `input_paddings`, `target_ids` (the decoder's
inputs: the targets shifted right behind bos), `targets`, `target_paddings` (data/seq2seq_examples).
The loss and metrics are the LM's (avg_xent, log_pplx, accuracy), weighted by 1 - target_paddings.

Positions: T5's relative position bias (one learned bias per stack, shared by its layers: the
encoder's bidirectional, the decoder's causal), or the LM's absolute options. Embeddings: one
table for both inputs and the softmax (tied, T5 1.0), or `separate_embedding` (T5 1.1: the
encoder and decoder share an input table, the softmax has its own).

Decoding (`SequenceModelDecoder`): the encoder runs once, every decoder layer's cross-attention
keys/values are projected from its output once, then the decoder extends one token at a time
against its self-attention KV cache. It is an `IncrementalDecoder`, so sampling, greedy and beam
search (`models/decoding.py`, `models/beam_search.py`) work on it unchanged.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from pax_eqx.config import ConfigError, check_range, config, require_positive
from pax_eqx.data import target_length
from pax_eqx.layers.attentions import KVCache
from pax_eqx.layers.base import Context, Mode, call
from pax_eqx.layers.embedding_softmax import EmbeddingConfig, SharedEmbeddingSoftmaxConfig, SoftmaxConfig
from pax_eqx.layers.initializers import WeightInit, gaussian
from pax_eqx.layers.normalizations import LayerNormConfig, NormConfig
from pax_eqx.layers.position_embeddings import TrainablePositionalEmbeddingConfig, sinusoidal_position_embedding
from pax_eqx.layers.relative_position_bias import RelativePositionBiasConfig
from pax_eqx.layers.remat import RematPolicy
from pax_eqx.layers.repeats import StackedTransformerConfig
from pax_eqx.layers.transformers import TransformerConfig
from pax_eqx.metrics import Metrics
from pax_eqx.models.incremental import IncrementalDecoder
from pax_eqx.models.language_model import lm_metrics
from pax_eqx.models.model import Batch, Model, ModelConfig
from pax_eqx.models.stack_checks import check_stack_fields
from pax_eqx.models.token_data import check_token_data

SequencePositions = Literal["relative_bias", "trainable", "sinusoidal", "rotary"]

Cache = KVCache | tuple[KVCache, ...]


@config
class SequenceModelConfig(ModelConfig):
    """An encoder-decoder transformer.

    vocab_size: tokens (the tokenizer's, plus any sentinels the data adds).
    max_seq_len: the longest input or target sequence (the trainable position table's size, and
      the longest decode).
    num_encoder_layers / num_decoder_layers / model_dims / hidden_dims / num_heads: the stacks'
      sizes (T5's num_layers, d_model, d_ff, num_heads). dim_per_head: 0 = model_dims //
      num_heads (T5's d_kv). num_kv_heads: 0 = num_heads.
    position_embedding: "relative_bias" (T5), "trainable", "sinusoidal" or "rotary".
    relative_bias: T5's bucketing (only with position_embedding="relative_bias").
    separate_embedding: False = one table for the encoder and decoder inputs and the softmax;
      True = the inputs share one table, the softmax has its own (T5 1.1).
    repeat / remat_policy / unroll: how each stack is applied (see layers.repeats).
    share_layers: each stack is one layer's weights applied num_*_layers times (ALBERT's
      cross-layer sharing, layers.shared_stack); the encoder and decoder keep their own layer.
    block: the layer template of both stacks. Whether attention is causal is the model's
      decision (the encoder is bidirectional, the decoder causal), so `block.attention.causal`
      stays at its default.
    final_norm: the norm after each stack.
    scale_embedding_sqrt_depth / softmax_bias / label_smoothing_prob / init / embedding_init: as
      LanguageModelConfig (T5 has no softmax bias).
    """

    decodes: ClassVar[bool] = True
    decodes_inputs: ClassVar[bool] = True

    vocab_size: int = 0
    max_seq_len: int = 0
    num_encoder_layers: int = 0
    num_decoder_layers: int = 0
    model_dims: int = 0
    hidden_dims: int = 0
    num_heads: int = 0
    dim_per_head: int = 0
    num_kv_heads: int = 0
    position_embedding: SequencePositions = "relative_bias"
    relative_bias: RelativePositionBiasConfig = RelativePositionBiasConfig()
    separate_embedding: bool = True
    repeat: bool = True
    share_layers: bool = False
    remat_policy: RematPolicy = "none"
    unroll: int = 1
    block: TransformerConfig = TransformerConfig()
    final_norm: NormConfig = LayerNormConfig()
    scale_embedding_sqrt_depth: bool = False
    softmax_bias: bool = False
    label_smoothing_prob: float = 0.0
    init: WeightInit = gaussian(0.02)
    embedding_init: WeightInit = gaussian(0.02)

    def validate(self) -> None:
        """Every check of the model's own fields; ConfigError names the field, the value and the fix."""
        require_positive(
            self,
            ("vocab_size", "max_seq_len", "num_encoder_layers", "num_decoder_layers", "model_dims", "hidden_dims",
             "num_heads"),
            "model",
        )  # fmt: skip
        check_range(self, ("dim_per_head", "num_kv_heads"), ge=0, prefix="model", note="0 = its default")
        check_range(self, "unroll", ge=1, prefix="model")
        check_range(self, "label_smoothing_prob", ge=0, lt=1, prefix="model")
        check_stack_fields(self, num_layers=min(self.num_encoder_layers, self.num_decoder_layers))
        if not self.block.attention.causal:
            raise ConfigError(
                "model.block.attention.causal=False does nothing in a SequenceModel: its encoder is always "
                "bidirectional and its decoder always causal; leave model.block.attention.causal at its default."
            )
        if self.position_embedding != "relative_bias" and self.relative_bias != RelativePositionBiasConfig():
            raise ConfigError(
                f"model.relative_bias is set but model.position_embedding={self.position_embedding!r}; it applies "
                "only with position_embedding='relative_bias'. Remove the model.relative_bias flags."
            )

    def stack_config(self, *, decoder: bool) -> StackedTransformerConfig:
        """The encoder's (bidirectional) or the decoder's (causal, with cross-attention) stack."""
        block = self.block if decoder else self.block.replace(attention=self.block.attention.replace(causal=False))
        return StackedTransformerConfig(
            num_layers=self.num_decoder_layers if decoder else self.num_encoder_layers,
            model_dims=self.model_dims, hidden_dims=self.hidden_dims, num_heads=self.num_heads,
            dim_per_head=self.dim_per_head, num_kv_heads=self.num_kv_heads,
            use_rotary=self.position_embedding == "rotary", init=self.init, block=block, repeat=self.repeat,
            remat_policy=self.remat_policy, unroll=self.unroll, cross_attention=decoder,
            share_layers=self.share_layers,
        )  # fmt: skip

    def check_data(self, data: Any) -> None:
        check_token_data(self, data, pairs=True)

    def tokens_per_example(self, data: Any) -> int:
        return data.seq_len + target_length(data)  # input and target tokens

    def token_vocab_size(self) -> int | None:
        return self.vocab_size

    def with_token_vocab_size(self, vocab_size: int):
        return self.replace(vocab_size=vocab_size)

    def build(self, key: PRNGKeyArray) -> SequenceModel:
        self.ensure_valid()
        return SequenceModel(self, key=key)


class SequenceModel(Model):
    """See the module docstring. Batch: `inputs`, `input_paddings` [batch, S]; `target_ids`,
    `targets`, `target_paddings` [batch, T]."""

    input_keys: ClassVar[tuple[str, ...]] = ("inputs", "input_paddings", "target_ids", "targets", "target_paddings")
    loss_name: ClassVar[str] = "avg_xent"

    embedding: eqx.Module  # SharedEmbeddingSoftmax (tied), or Embedding when separate
    softmax: eqx.Module | None  # FullSoftmax when separate_embedding
    position: eqx.Module | None  # the trainable table, shared by encoder and decoder
    encoder_bias: eqx.Module | None  # RelativePositionBias, bidirectional
    decoder_bias: eqx.Module | None  # RelativePositionBias, causal
    encoder: eqx.Module
    encoder_norm: eqx.Module
    decoder: eqx.Module
    decoder_norm: eqx.Module
    position_embedding: str = eqx.field(static=True)
    max_seq_len: int = eqx.field(static=True)

    def incremental_decoder(self, prompts: list[list[int]], max_new_tokens: int, pad_id: int, bos_id: int = 0) -> Any:
        """A `SequenceModelDecoder` of `prompts` as inputs (right-padded), decoding from `bos_id`."""
        import numpy as np

        longest = max(len(r) for r in prompts)
        if longest > self.max_seq_len or max_new_tokens + 1 > self.max_seq_len:
            raise ConfigError(
                f"an input of {longest} tokens or decode.max_new_tokens={max_new_tokens} (+1 for the start "
                f"token) is longer than model.max_seq_len={self.max_seq_len}; shorten them."
            )
        inputs = np.full((len(prompts), longest), pad_id, np.int32)
        paddings = np.ones((len(prompts), longest), np.float32)
        for i, r in enumerate(prompts):
            inputs[i, : len(r)], paddings[i, : len(r)] = r, 0.0
        return SequenceModelDecoder(
            self, jnp.asarray(inputs), jnp.asarray(paddings), max_new_tokens=max_new_tokens, start_id=bos_id
        )

    def __init__(self, cfg: SequenceModelConfig, *, key: PRNGKeyArray):
        k_emb, k_soft, k_pos, k_enc_bias, k_dec_bias, k_enc, k_dec = jax.random.split(key, 7)
        v, d = cfg.vocab_size, cfg.model_dims
        if cfg.separate_embedding:
            self.embedding = EmbeddingConfig(
                num_classes=v, input_dims=d, init=cfg.embedding_init, scale_sqrt_depth=cfg.scale_embedding_sqrt_depth
            ).build(k_emb)
            self.softmax = SoftmaxConfig(
                input_dims=d, num_classes=v, init=cfg.init, use_bias=cfg.softmax_bias,
                label_smoothing_prob=cfg.label_smoothing_prob,
            ).build(k_soft)  # fmt: skip
        else:
            self.embedding = SharedEmbeddingSoftmaxConfig(
                num_classes=v, input_dims=d, init=cfg.embedding_init,
                scale_sqrt_depth=cfg.scale_embedding_sqrt_depth, use_bias=cfg.softmax_bias,
                label_smoothing_prob=cfg.label_smoothing_prob,
            ).build(k_emb)  # fmt: skip
            self.softmax = None
        self.position = None
        if cfg.position_embedding == "trainable":
            self.position = TrainablePositionalEmbeddingConfig(
                max_seq_length=cfg.max_seq_len, embedding_dims=d, init=cfg.embedding_init
            ).build(k_pos)
        self.encoder_bias = self.decoder_bias = None
        if cfg.position_embedding == "relative_bias":
            build_bias = cfg.relative_bias.build
            self.encoder_bias = build_bias(k_enc_bias, num_heads=cfg.num_heads, bidirectional=True, init=cfg.init)
            self.decoder_bias = build_bias(k_dec_bias, num_heads=cfg.num_heads, bidirectional=False, init=cfg.init)
        self.encoder = cfg.stack_config(decoder=False).build(k_enc)
        self.encoder_norm = cfg.final_norm.build(d)
        self.decoder = cfg.stack_config(decoder=True).build(k_dec)
        self.decoder_norm = cfg.final_norm.build(d)
        self.position_embedding = cfg.position_embedding
        self.max_seq_len = cfg.max_seq_len

    # Pieces shared by training and decoding ---------------------------------------------------
    def embed(
        self, ids: Int[Array, "batch time"], positions: Int[Array, "batch time"]
    ) -> Float[Array, "batch time embed"]:
        """Token (plus absolute position) embeddings; the same table for encoder and decoder."""
        x = self.embedding.lookup(ids) if self.softmax is None else self.embedding(ids)
        if self.position is not None:
            x = x + self.position(positions)
        elif self.position_embedding == "sinusoidal":
            x = x + sinusoidal_position_embedding(positions, x.shape[-1])
        return x

    def logits(self, x: Float[Array, "batch time embed"]) -> Float[Array, "batch time vocab"]:
        """Logits of the decoder's last layer output (the final norm applied here)."""
        return (self.embedding if self.softmax is None else self.softmax).logits(self.decoder_norm(x))

    def _check_length(self, length: int, what: str) -> None:
        if length > self.max_seq_len:
            raise ConfigError(
                f"{what} length {length} is longer than model.max_seq_len={self.max_seq_len}; raise "
                "model.max_seq_len or shorten data.seq_len / data.target_seq_len."
            )

    def encode(
        self, inputs: Int[Array, "batch src"], input_paddings: Float[Array, "batch src"], ctx: Context
    ) -> tuple[Float[Array, "batch src embed"], Context]:
        """The encoder's output (normalised): the memory every decoder layer attends to."""
        b, s = inputs.shape
        self._check_length(s, "input")
        positions = jnp.broadcast_to(jnp.arange(s), (b, s))
        x = self.embed(inputs, positions)
        if ctx.dtype is not None:
            x = x.astype(ctx.dtype)
        bias = None if self.encoder_bias is None else self.encoder_bias(positions[:1], positions[:1])
        x, ctx = call(
            self.encoder, x, ctx, "encoder", segment_pos=positions, paddings=input_paddings, bias=bias
        )  # fmt: skip
        return self.encoder_norm(x), ctx

    # The model contract (pax_eqx.models.model) -----------------------------------------------
    def compute_predictions(self, batch: Batch, ctx: Context) -> tuple[Float[Array, "batch tgt embed"], Context]:
        """The decoder's last layer output for `target_ids`, attending to the encoded `inputs`."""
        batch = {k: jnp.asarray(v) for k, v in batch.items()}
        input_paddings = batch["input_paddings"].astype(jnp.float32)
        memory, ctx = self.encode(batch["inputs"], input_paddings, ctx)
        target_ids = batch["target_ids"]
        b, t = target_ids.shape
        self._check_length(t, "target")
        positions = jnp.broadcast_to(jnp.arange(t), (b, t))
        x = self.embed(target_ids, positions).astype(memory.dtype)
        bias = None if self.decoder_bias is None else self.decoder_bias(positions[:1], positions[:1])
        return call(
            self.decoder, x, ctx, "decoder", segment_pos=positions,
            paddings=batch["target_paddings"].astype(jnp.float32), bias=bias, memory=memory,
            memory_paddings=input_paddings,
        )  # fmt: skip

    def compute_loss(self, predictions: Float[Array, "batch tgt embed"], batch: Batch) -> Metrics:
        """avg_xent (= log_pplx) and accuracy of the next-token predictions against `targets`,
        over the non-padded target positions."""
        targets = jnp.asarray(batch["targets"])
        weights = 1.0 - jnp.asarray(batch["target_paddings"], jnp.float32)
        logits = self.logits(predictions)
        xent = (self.embedding if self.softmax is None else self.softmax).xent(logits, targets)
        correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
        return lm_metrics(jnp.sum(xent * weights), jnp.sum(correct * weights), jnp.sum(weights))

    def __call__(self, batch: Batch, ctx: Context) -> tuple[Float[Array, "batch tgt vocab"], Context]:
        """Logits for every target position (teacher forcing)."""
        x, ctx = self.compute_predictions(batch, ctx)
        return self.logits(x), ctx

    # Decoding ---------------------------------------------------------------------------------
    def extend_step(
        self,
        ids: Int[Array, "batch new"],
        cache: Cache,
        start: Int[Array, ""],
        memory_kv: Cache,
        memory_valid: Bool[Array, "batch src"],
    ) -> tuple[Float[Array, "batch new vocab"], Cache]:
        """Logits for decoder tokens `ids` at positions [start, start + new), written to the
        self-attention cache there, attending to the encoder through `memory_kv`."""
        b, new = ids.shape
        max_len = _cache_length(cache)
        positions = jnp.broadcast_to(start + jnp.arange(new, dtype=jnp.int32), (b, new))
        x = self.embed(ids, positions).astype(_cache_dtype(cache))
        bias = None
        if self.decoder_bias is not None:
            bias = self.decoder_bias(positions[:1], jnp.arange(max_len, dtype=jnp.int32)[None])
        key_valid = jnp.ones((b, max_len), bool)  # slots past the new tokens are masked causally
        x, cache = self.decoder.decode(
            x, cache, start, positions, key_valid, bias=bias, memory_kv=memory_kv, memory_valid=memory_valid
        )
        return self.logits(x), cache


def _cache_length(cache: Cache) -> int:
    first = cache if isinstance(cache, KVCache) else cache[0]
    return first.k.shape[-3]


def _cache_dtype(cache: Cache) -> Any:
    return (cache if isinstance(cache, KVCache) else cache[0]).k.dtype


class SequenceModelDecoder(IncrementalDecoder):
    """Decodes `inputs` with a SequenceModel: the encoder runs once in `start`, the decoder one
    token per `extend` (slot 0 holds `start_id`, the t-th new token goes to slot t + 1).

    inputs / input_paddings: [batch, src]. max_new_tokens: the decoder cache's length is one more.
    """

    model: SequenceModel
    inputs: Int[Array, "batch src"]
    input_paddings: Float[Array, "batch src"]
    max_new_tokens: int = eqx.field(static=True)
    start_id: int = eqx.field(static=True)

    def start(self) -> tuple[Float[Array, "batch vocab"], tuple[Cache, Cache, Bool[Array, "batch src"]]]:
        model = self.model
        dtype = jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array))[0].dtype
        ctx = Context(mode=Mode.DECODE)
        memory, _ = model.encode(jnp.asarray(self.inputs), jnp.asarray(self.input_paddings, jnp.float32), ctx)
        memory_kv = model.decoder.project_memory(memory.astype(dtype))
        memory_valid = jnp.asarray(self.input_paddings) < 0.5
        b = self.inputs.shape[0]
        cache = model.decoder.init_cache(b, self.max_new_tokens + 1, dtype)
        first = jnp.full((b, 1), self.start_id, jnp.int32)
        logits, cache = model.extend_step(first, cache, jnp.int32(0), memory_kv, memory_valid)
        return logits[:, -1], (cache, memory_kv, memory_valid)

    def extend(self, tokens: Int[Array, " rows"], carry, t: Int[Array, ""]):
        cache, memory_kv, memory_valid = carry
        logits, cache = self.model.extend_step(tokens[:, None], cache, t + 1, memory_kv, memory_valid)
        return logits[:, -1], (cache, memory_kv, memory_valid)

    def select(self, carry, rows: Int[Array, " n"]):
        cache, memory_kv, memory_valid = carry
        stack = self.model.decoder
        return stack.select_cache(cache, rows), stack.select_cache(memory_kv, rows), memory_valid[rows]
