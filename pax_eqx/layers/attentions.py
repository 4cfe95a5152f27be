"""Multi-head, multi-query and grouped-query dot-product attention (praxis.layers.attentions).

Projections are stored per head: `w_q: [embed, heads, head_dim]`, `w_k/w_v: [embed, kv_heads,
head_dim]`, `w_o: [heads, head_dim, embed]`, so tensor parallelism shards the `heads` axis
(Megatron style) without reshapes. With `combine_qkv` (multi-head only, as Praxis'
CombinedQKVProjectionLayer) one `[3, embed, heads, head_dim]` weight makes a single matmul.
The layer is made by `AttentionConfig.build` (layers.attention_config), which holds what a
user chooses and checks the sizes before any weight is made.

`__call__` is the training/eval forward over whole sequences. `decode` runs queries against a
key/value cache: prefill (many tokens at once) and `extend_step` (one token) are the same
function, which is why extend_step agrees with the full forward pass by construction (and a
test checks it numerically).

`cross` is encoder-decoder attention (Praxis' cross-attention in a Transformer with
`use_cross_attention`): queries from `x`, keys and values from another sequence (`memory`, the
encoder's output), never causal, no rotary positions, padded memory never attended to. For
decoding, `project_memory` computes the memory's keys/values once and `decode_cross` attends
to them. Every path projects with the same `project_q` / `project_kv` (self-attention with
`combine_qkv` uses the fused weight in one matmul) and attends with the same kernels.

At summary verbosity 4 (`LAYER_STATISTICS_VERBOSITY`) the forward records `logit_max`, the
largest scaled logit q.k^T any query may use, computed from q and k whichever kernel runs.

`mask_mode` chooses what self-attention's `paddings` mask. "pax_eqx": the padded keys only (no
query attends to padding; a padded query attends to the real keys it may see). "praxis": Praxis'
`merge_masks`, which, when the padding mask is merged with a [T, T] one (causal or segments),
also masks every padded query's row, so its softmax is uniform over all keys; a non-causal
layer without segments masks the keys only, as Praxis does. Outputs at real positions are the
same either way; padded positions, and so gradients through them, differ. (A TransformerLm's
folding of padding into the segment mask is the stack's, `fold_padding_with_segment_mask`.)

Relative positions. Self-attention's logits may get this layer's own T5 relative bias
(`relative_bias`) and a position term (`position_bias`: ALiBi or Transformer-XL's,
layers.attention_position_bias); all are functions of the query's and the key's token indices,
so the forward, decoding against a cache and a rolling cache compute them alike. A sliding
window (`window`, layers.attention_window) is one more term of the mask.

Rolling caches. With a causal sliding window shorter than the cache, `init_cache` gives
left_context slots, each holding its token's index (`KVCache.index`): memory is bounded by the
window, not by the sequence. `decode` then attends to [the slots ++ the new keys] by token index
and keeps each slot's last real token (see `decode`).

`with_probs` / `cross_with_probs` are the forwards that also return the attention
probabilities `[batch, heads, q, k]`, as Praxis' DotProductAttention returns
`(encoded, atten_probs)`: they always take the XLA path (cuDNN's kernel never forms them).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from pax_eqx.layers import attention_kernels as kernels
from pax_eqx.layers.attention_position_bias import PositionBias
from pax_eqx.layers.base import LAYER_STATISTICS_VERBOSITY, Context
from pax_eqx.layers.fp8 import Fp8Scales
from pax_eqx.layers.initializers import WeightInit, gaussian
from pax_eqx.layers.linears import dense
from pax_eqx.layers.low_rank import LowRankAdapted
from pax_eqx.layers.position_embeddings import apply_rotary
from pax_eqx.layers.relative_position_bias import RelativePositionBias
from pax_eqx.quantization.quantized_weight import QuantizedWeight
from pax_eqx.sharding.activations import constrain, is_split

if TYPE_CHECKING:  # the config builds this layer (layers.attention_config imports this module)
    from pax_eqx.layers.attention_config import AttentionConfig
    from pax_eqx.layers.relative_position_bias import RelativePositionBiasConfig


class KVCache(eqx.Module):
    """Keys and values of every position decoded so far: [batch, max_len, kv_heads, head_dim]
    (with a leading [num_layers] axis for a repeated stack). Also the cross-attention keys and
    values of an encoder's output (`Attention.project_memory`), where max_len is its length.

    A rolling cache (a sliding window's: `empty_cache`) has `index`, each slot's token index (-1:
    empty), and only `window` slots: token p lives in slot p % window, and the slots hold the last
    `window` real tokens written (see `Attention.decode`). None: slot i holds token i."""

    k: Float[Array, "*layers batch max_len kv_heads head_dim"]
    v: Float[Array, "*layers batch max_len kv_heads head_dim"]
    index: Int[Array, "*layers batch max_len"] | None = None

    @property
    def rolling(self) -> bool:
        return self.index is not None


def empty_cache(
    lead: tuple[int, ...], batch: int, max_len: int, kv_heads: int, head_dim: int, dtype, window: tuple[int, int]
) -> KVCache:
    """A zero cache for sequences of up to `max_len` tokens, with leading axes `lead` (a stack's
    [num_layers]). A causal sliding window of left_context < max_len (window = (left, right))
    makes it a rolling cache of `left` slots: a query never sees a key further back, so memory is
    bounded by the window, not by the sequence."""
    left = window[0]
    rolling = 0 < left < max_len
    slots = left if rolling else max_len
    shape = (*lead, batch, slots, kv_heads, head_dim)
    index = jnp.full((*lead, batch, slots), -1, jnp.int32) if rolling else None
    return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), index)


def write_at(
    cache: Float[Array, "batch max_len kv_heads head_dim"],
    new: Float[Array, "batch new kv_heads head_dim"],
    start: Int[Array, ""] | Int[Array, " batch"],
) -> Float[Array, "batch max_len kv_heads head_dim"]:
    """`new` written into `cache` at slots [start, start + new): one start for every row, or a
    start per row (each row of a continuous batch is at its own position)."""
    new = new.astype(cache.dtype)
    zero = jnp.zeros((), jnp.int32)
    if jnp.ndim(start) == 0:
        return jax.lax.dynamic_update_slice(cache, new, (zero, start, zero, zero))
    row = lambda c, n, s: jax.lax.dynamic_update_slice(c, n, (s, zero, zero))
    return jax.vmap(row)(cache, new, start)


def take_rows(cache: Any, rows: Int[Array, " n"], axis: int) -> Any:
    """Batch rows `rows` of every array of a cache whose batch is on `axis` (a gather: rows may
    repeat, as beam search tiles and reorders hypotheses)."""
    return jax.tree.map(lambda a: jnp.take(a, rows, axis=axis), cache)


def put_rows(cache: Any, rows: Int[Array, " n"], values: Any, axis: int) -> Any:
    """`cache` with its batch rows `rows` (on `axis`) replaced by `values` (as `take_rows` gives
    them): a server's prefill of one request written into that request's decode slot."""
    index = (slice(None),) * axis
    return jax.tree.map(lambda a, v: a.at[(*index, rows)].set(v.astype(a.dtype)), cache, values)


def roll_in(
    cache: KVCache,
    k: Float[Array, "batch new kv_heads head_dim"],
    v: Float[Array, "batch new kv_heads head_dim"],
    index: Int[Array, "batch new"],
    valid: Bool[Array, "batch new"],
) -> KVCache:
    """A rolling cache with the new tokens (token indices `index`) written in slot index % window
    where they are real (`valid`) and no later real new token takes that slot: every slot then
    gets one write at most (a scatter's order among duplicates is not defined), and a slot no real
    new token reaches keeps what it held."""
    b, new = index.shape
    window = cache.k.shape[1]
    # later[j]: a real new token j + window, j + 2 window, ... exists (it takes j's slot instead).
    blocks = -(-new // window)
    padded = jnp.pad(valid, ((0, 0), (0, blocks * window - new))).reshape(b, blocks, window).astype(jnp.int32)
    from_here = jnp.flip(jax.lax.cummax(jnp.flip(padded, axis=1), axis=1), axis=1)  # a real token at j or later
    later = jnp.pad(from_here[:, 1:], ((0, 0), (0, 1), (0, 0))).reshape(b, -1)[:, :new] > 0
    slot = jnp.where(valid & ~later, index % window, window)  # window: out of range, dropped
    rows = jnp.arange(b)[:, None]
    put = lambda a, new_values: a.at[rows, slot].set(new_values.astype(a.dtype), mode="drop")
    return KVCache(put(cache.k, k), put(cache.v, v), put(cache.index, index))


def _project(
    x: Float[Array, "batch time embed"],
    w: Float[Array, "embed heads head_dim"] | LowRankAdapted | QuantizedWeight,  # layers.low_rank, quantization
    fp8: Fp8Scales | None,
) -> Float[Array, "batch time heads head_dim"]:
    """x @ w per head, in x's dtype. A function of both arrays so the shape check ties x's
    embed to the weight's (jaxtyping does not relate arguments to field annotations). One 2-D
    matmul (`linears.dense`: its weight gradient compiles without a transposing copy on CPU)."""
    d, n, h = w.shape
    return dense(x, w.reshape(d, n * h), fp8).reshape(*x.shape[:-1], n, h)


def _project_combined(
    x: Float[Array, "batch time embed"],
    w: Float[Array, "3 embed heads head_dim"] | QuantizedWeight,
    fp8: Fp8Scales | None,
) -> Float[Array, "batch time 3 heads head_dim"]:
    """q, k and v side by side, from one [embed, 3 * heads * head_dim] matmul (in the layout
    the matmul writes: taking q, k, v out of it is a split, and its gradient a concatenation
    rather than a transpose). A quantized weight (Praxis' INFERENCE; no gradient) is three
    products, one per slice, whose per-channel scales go with them: its integers never move."""
    c, d, n, h = w.shape
    if isinstance(w, QuantizedWeight):
        return jnp.stack([_project(x, w[i], fp8) for i in range(c)], axis=-3)
    return dense(x, jnp.moveaxis(w, 0, 1).reshape(d, c * n * h), fp8).reshape(*x.shape[:-1], c, n, h)


class Attention(eqx.Module):
    w_q: Float[Array, "embed heads head_dim"] | None
    w_k: Float[Array, "embed kv_heads head_dim"] | None
    w_v: Float[Array, "embed kv_heads head_dim"] | None
    w_qkv: Float[Array, "3 embed heads head_dim"] | None
    b_q: Float[Array, "heads head_dim"] | None
    b_k: Float[Array, "kv_heads head_dim"] | None
    b_v: Float[Array, "kv_heads head_dim"] | None
    w_o: Float[Array, "heads head_dim embed"]
    b_o: Float[Array, " embed"] | None
    per_dim_scale: Float[Array, " head_dim"] | None
    fp8: dict[str, Fp8Scales] | None  # per projection ("qkv" or "q", "k", "v"; "o"); None: not fp8
    relative_bias: RelativePositionBias | None  # this layer's own (Praxis' relative_bias_tpl); None: none
    position_bias: PositionBias | None  # ALiBi or Transformer-XL's terms (layers.attention_position_bias)
    num_heads: int = eqx.field(static=True)
    num_kv_heads: int = eqx.field(static=True)
    head_dim: int = eqx.field(static=True)
    causal: bool = eqx.field(static=True)
    rotary_max_timescale: float | None = eqx.field(static=True)  # None: no rotary positions
    rotary_inv_timescales: tuple[float, ...] | None = eqx.field(static=True)  # a scaled rotary's; None: unscaled
    logit_cap: float = eqx.field(static=True)
    dropout_prob: float = eqx.field(static=True)
    implementation: str = eqx.field(static=True)
    mask_mode: str = eqx.field(static=True)
    window: tuple[int, int] = eqx.field(static=True)  # self-attention's (left, right); 0 = unbounded
    query_scale_dims: float = eqx.field(static=True)  # 0: the head dim

    def __init__(
        self,
        cfg: AttentionConfig,
        *,
        key: PRNGKeyArray,
        input_dims: int,
        num_heads: int,
        head_dim: int,
        num_kv_heads: int,
        init: WeightInit,
        use_rotary: bool,
        fp8: bool = False,
        relative_bias: RelativePositionBiasConfig | None = None,
    ):
        """Made by `AttentionConfig.build`, which checks the sizes. fp8: the projections' matmuls
        in fp8 (`layers.fp8`). relative_bias: a relative position bias table of this layer's own,
        initialised as Praxis' RelativeBias (Gaussian, stddev (heads x buckets)^-1/2)."""
        d, n, kv, h = input_dims, num_heads, num_kv_heads, head_dim
        kq, kk, kv_, ko = jax.random.split(key, 4)
        # Praxis initialises per-head weights with fan_in = embed, fan_out = heads * head_dim.
        flat = lambda k, shape: init(k, (shape[0], math.prod(shape[1:]))).reshape(shape)
        if cfg.combine_qkv:
            self.w_qkv = jnp.stack([flat(k, (d, n, h)) for k in (kq, kk, kv_)])
            self.w_q = self.w_k = self.w_v = None
        else:
            self.w_qkv = None
            self.w_q, self.w_k, self.w_v = flat(kq, (d, n, h)), flat(kk, (d, kv, h)), flat(kv_, (d, kv, h))
        self.w_o = init(ko, (n * h, d)).reshape(n, h, d)
        zeros = lambda on, *s: jnp.zeros(s, jnp.float32) if on else None
        qkv = cfg.use_bias or cfg.qkv_bias  # qkv_bias: Qwen2's biases on q, k, v and none on the output
        self.b_q, self.b_k, self.b_v = zeros(qkv, n, h), zeros(qkv, kv, h), zeros(qkv, kv, h)
        self.b_o = zeros(cfg.use_bias, d)
        self.per_dim_scale = jnp.zeros((h,), jnp.float32) if cfg.per_dim_scale else None
        projections = ("qkv", "o") if cfg.combine_qkv else ("q", "k", "v", "o")
        self.fp8 = {name: Fp8Scales() for name in projections} if fp8 else None
        self.relative_bias = None
        if relative_bias is not None:
            stddev = (n * relative_bias.num_buckets) ** -0.5
            self.relative_bias = relative_bias.build(
                jax.random.fold_in(key, 1), num_heads=n, bidirectional=not cfg.causal, init=gaussian(stddev)
            )  # a key of its own: the projections' init is the same with or without it
        self.position_bias = cfg.position_bias.build(
            jax.random.fold_in(key, 2), input_dims=d, num_heads=n, head_dim=h, init=init
        )
        self.num_heads, self.num_kv_heads, self.head_dim = n, kv, h
        self.causal = cfg.causal
        self.rotary_max_timescale = cfg.rotary_max_timescale if use_rotary else None
        inv = cfg.rotary_scaling.inverse_timescales(h, cfg.rotary_max_timescale) if use_rotary else None
        self.rotary_inv_timescales = None if inv is None else tuple(float(f) for f in inv)
        self.logit_cap = cfg.logit_cap
        self.dropout_prob = cfg.dropout_prob
        self.implementation = cfg.implementation
        self.mask_mode = cfg.mask_mode
        self.window = cfg.window.bounds()
        self.query_scale_dims = cfg.query_scale_dims

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {
            "w_q": ("embed", "heads", "kv"),
            "w_k": ("embed", "kv_heads", "kv"),
            "w_v": ("embed", "kv_heads", "kv"),
            "w_qkv": (None, "embed", "heads", "kv"),
            "b_q": ("heads", "kv"),
            "b_k": ("kv_heads", "kv"),
            "b_v": ("kv_heads", "kv"),
            "w_o": ("heads", "kv", "embed"),
            "b_o": ("embed",),
            "per_dim_scale": ("kv",),
        }

    # Projections ----------------------------------------------------------------------------
    def project_q(
        self, x: Float[Array, "batch time embed"], positions: Int[Array, "batch time"] | None
    ) -> Float[Array, "batch time heads head_dim"]:
        """The queries of `x` (bias, rotary at `positions`, per-dim scale applied).

        positions: None only for a layer without rotary positions (cross-attention)."""
        w = self.w_q if self.w_q is not None else self.w_qkv[0]
        # Praxis' activation names, for the named remat policies (layers/remat.py).
        return self._finish_q(checkpoint_name(_project(x, w, self._fp8("q")), "query_proj"), positions)

    def project_kv(
        self, x: Float[Array, "batch time embed"], positions: Int[Array, "batch time"] | None
    ) -> tuple[Float[Array, "batch time kv_heads head_dim"], Float[Array, "batch time kv_heads head_dim"]]:
        """The keys and values of `x` (biases, rotary on the keys at `positions`, applied).

        positions: None only for a layer without rotary positions (cross-attention memory)."""
        w_k, w_v = (self.w_k, self.w_v) if self.w_k is not None else (self.w_qkv[1], self.w_qkv[2])
        k = checkpoint_name(_project(x, w_k, self._fp8("k")), "key_proj")
        v = checkpoint_name(_project(x, w_v, self._fp8("v")), "value_proj")
        return self._finish_kv(k, v, positions)

    def project_qkv(
        self, x: Float[Array, "batch time embed"], positions: Int[Array, "batch time"]
    ) -> tuple[Array, Array, Array]:
        """Self-attention's q: [B, T, N, H] (already scaled when per_dim_scale), k, v: [B, T, K, H];
        one fused matmul with `combine_qkv`."""
        if self.w_qkv is None:
            return self.project_q(x, positions), *self.project_kv(x, positions)
        qkv = checkpoint_name(_project_combined(x, self.w_qkv, self._fp8("qkv")), "combined_qkv_proj")
        # A split (not three slices), so the backward concatenates dq, dk, dv instead of adding
        # three zero-padded copies of the whole [.., 3, heads, head_dim] gradient.
        q, k, v = (a.squeeze(-3) for a in jnp.split(qkv, 3, axis=-3))
        return self._finish_q(q, positions), *self._finish_kv(k, v, positions)

    def _fp8(self, projection: str) -> Fp8Scales | None:
        """The fp8 state of one projection (None: that matmul in the activation dtype). A layer
        with combined weights has one state, "qkv", for the whole [q k v] matmul."""
        return None if self.fp8 is None else self.fp8.get(projection)

    def _finish_q(self, q: Array, positions: Array | None) -> Array:
        dt = q.dtype
        if self.b_q is not None:
            q = q + self.b_q.astype(dt)
        q = self._rotary(q, positions)
        if self.per_dim_scale is not None:
            # Praxis PerDimScale: 1/softplus(0) normalises the initial scale to 1/sqrt(H).
            r_softplus_0 = 1.442695041
            s = r_softplus_0 / math.sqrt(q.shape[-1]) * jax.nn.softplus(self.per_dim_scale)
            q = (q * s.astype(dt)).astype(dt)
        return q

    def _finish_kv(self, k: Array, v: Array, positions: Array | None) -> tuple[Array, Array]:
        if self.b_k is not None:
            k, v = k + self.b_k.astype(k.dtype), v + self.b_v.astype(v.dtype)
        return self._rotary(k, positions), v

    def _rotary(self, x: Array, positions: Array | None) -> Array:
        if self.rotary_max_timescale is None:
            return x
        if positions is None:
            raise ValueError("this attention layer has rotary positions: pass the tokens' positions.")
        inv = None if self.rotary_inv_timescales is None else jnp.asarray(self.rotary_inv_timescales, jnp.float32)
        return apply_rotary(x, positions, max_timescale=self.rotary_max_timescale, inv_timescales=inv)

    def _scale(self) -> float:
        if self.per_dim_scale is not None:
            return 1.0
        return 1.0 / math.sqrt(self.query_scale_dims or self.head_dim)

    def _output(self, o: Float[Array, "batch time heads head_dim"]) -> Float[Array, "batch time embed"]:
        o = checkpoint_name(constrain(o, ("batch", "seq", "heads", "kv")), "context")
        n, h, d = self.w_o.shape
        y = dense(o.reshape(*o.shape[:-2], n * h), self.w_o.reshape(n * h, d), self._fp8("o"))
        y = checkpoint_name(y, "out_proj")
        return y if self.b_o is None else y + self.b_o.astype(o.dtype)

    # Full-sequence forward -----------------------------------------------------------------
    def __call__(
        self,
        x: Float[Array, "batch time embed"],
        ctx: Context,
        *,
        segment_ids: Int[Array, "batch time"] | None = None,
        segment_pos: Int[Array, "batch time"] | None = None,
        paddings: Float[Array, "batch time"] | None = None,
        bias: Float[Array, "#batch #heads time time"] | None = None,
    ) -> tuple[Float[Array, "batch time embed"], Context]:
        """Self-attention over `x`.

        segment_ids: packed documents (0 = padding); attention never crosses documents.
        segment_pos: position of each token within its document (rotary); default arange.
        paddings: 1.0 at padded key positions, which no query attends to (mask_mode "praxis":
          padded query rows too, where Praxis masks them).
        bias: an additive bias on the attention logits.
        """
        return self._self_attention(x, ctx, segment_ids, segment_pos, paddings, bias, with_probs=False)

    def with_probs(
        self,
        x: Float[Array, "batch time embed"],
        ctx: Context,
        *,
        segment_ids: Int[Array, "batch time"] | None = None,
        segment_pos: Int[Array, "batch time"] | None = None,
        paddings: Float[Array, "batch time"] | None = None,
        bias: Float[Array, "#batch #heads time time"] | None = None,
    ) -> tuple[Float[Array, "batch time embed"], Float[Array, "batch heads time time"], Context]:
        """`__call__` that also returns the attention probabilities [batch, heads, query, key]
        (Praxis' `encoded, atten_probs = attention(...)`): after the mask and, in training, after
        the probability dropout, as Praxis returns them. Always the XLA kernel."""
        return self._self_attention(x, ctx, segment_ids, segment_pos, paddings, bias, with_probs=True)

    def _position_terms(
        self,
        bias: Array | None,
        q: Float[Array, "batch q heads head_dim"],
        k: Float[Array, "batch k kv_heads head_dim"],
        query_index: Int[Array, "#batch q"],
        key_index: Int[Array, "#batch k"],
        distances: tuple[int, int],
    ) -> Array | None:
        """`bias` plus this layer's relative position terms of queries at token indices
        `query_index` against keys at `key_index`, [#batch, heads, q, k]: the T5 relative bias and
        ALiBi or Transformer-XL's (of the scaled queries `q` and the keys `k`). distances: (lo,
        hi), the static range of t - s the mask lets through (XL computes its embeddings for
        those). Token indices stand for positions (Praxis' use_length_as_position): within a
        document, packed or left-padded, their differences are the positions' differences, and
        attention across documents is masked anyway."""
        terms = [] if bias is None else [bias]
        if self.relative_bias is not None:
            terms.append(self.relative_bias(query_index, key_index))
        if self.position_bias is not None:
            scaled = q if self.per_dim_scale is not None else q * jnp.asarray(self._scale(), q.dtype)
            terms.append(self.position_bias(scaled, k, query_index, key_index, distances))
        return None if not terms else sum(terms[1:], terms[0])

    def _distances(self, q_index_span: int, causal: bool) -> tuple[int, int]:
        """The static range (lo, hi) of query - key distances this layer's mask may let through
        when indices differ by less than `q_index_span`: clipped by the window."""
        left, right = self.window
        hi = (min(left, q_index_span) if left else q_index_span) - 1
        lo = 0 if causal else -((min(right, q_index_span - 1)) if right else q_index_span - 1)
        return lo, hi

    def _self_attention(self, x, ctx, segment_ids, segment_pos, paddings, bias, *, with_probs: bool):
        b, t, _ = x.shape
        positions = segment_pos if segment_pos is not None else jnp.broadcast_to(jnp.arange(t), (b, t))
        q, k, v = self.project_qkv(x, positions)
        index = jnp.arange(t, dtype=jnp.int32)[None]
        bias = self._position_terms(bias, q, k, index, index, self._distances(t, self.causal))
        q = constrain(q, ("batch", "seq", "heads", "kv"))  # sharding.activations: the heads over tensor
        # Keys and values whole along the sequence ("kv_seq", never mapped by default): with the
        # queries' `seq` over a context axis, each shard attends to every key (an all-gather).
        k, v = (constrain(a, ("batch", "kv_seq", "kv_heads", "kv")) for a in (k, v))
        key_valid = None if paddings is None else paddings < 0.5
        mask = kernels.make_mask(
            t, t, causal=self.causal, segment_ids_q=segment_ids, segment_ids_k=segment_ids, key_valid=key_valid,
            window=self.window,
        )  # fmt: skip
        if self.mask_mode == "praxis" and key_valid is not None and (self.causal or segment_ids is not None):
            # Praxis' merge_masks of the [B, 1, 1, T] padding mask with a [., 1, T, T] one:
            # min(query mask, key mask), so a padded query's whole row is masked.
            mask = mask & key_valid[:, None, :, None]
        windowed = self.window != (0, 0)
        causal_only = self.causal and segment_ids is None and key_valid is None and not windowed
        # Rows that are one unpadded segment each need only the causal mask: known at run time.
        plain_causal = None
        if self.causal and not causal_only and not windowed:
            plain_causal = kernels.one_segment_per_row(segment_ids, key_valid)
        return self._attend(
            q, k, v, mask, ctx, causal_only=causal_only, bias=bias, with_probs=with_probs, plain_causal=plain_causal
        )

    def cross(
        self,
        x: Float[Array, "batch time embed"],
        memory: Float[Array, "batch memory embed"],
        ctx: Context,
        *,
        memory_paddings: Float[Array, "batch memory"] | None = None,
        bias: Float[Array, "#batch #heads time memory"] | None = None,
    ) -> tuple[Float[Array, "batch time embed"], Context]:
        """Cross-attention: queries from `x`, keys and values from `memory` (the encoder's output).

        Every query may attend to every real memory position: no causal mask (the layer's
        `causal` is self-attention's), no rotary positions (queries and memory share no
        positions), no segments. memory_paddings: 1.0 at padded memory positions, which no query
        attends to. bias: an additive bias on the logits. Dropout, kernels and the `logit_max`
        summary are self-attention's.
        """
        return self._cross(x, memory, ctx, memory_paddings, bias, with_probs=False)

    def cross_with_probs(
        self,
        x: Float[Array, "batch time embed"],
        memory: Float[Array, "batch memory embed"],
        ctx: Context,
        *,
        memory_paddings: Float[Array, "batch memory"] | None = None,
        bias: Float[Array, "#batch #heads time memory"] | None = None,
    ) -> tuple[Float[Array, "batch time embed"], Float[Array, "batch heads time memory"], Context]:
        """`cross` that also returns the probabilities [batch, heads, query, memory] (see `with_probs`)."""
        return self._cross(x, memory, ctx, memory_paddings, bias, with_probs=True)

    def _cross(self, x, memory, ctx, memory_paddings, bias, *, with_probs: bool):
        if self.rotary_max_timescale is not None or self.position_bias is not None or self.relative_bias is not None:
            raise ValueError(
                "Attention.cross: this layer was built with positions (rotary, a relative bias or a position_bias), "
                "which cross-attention has no use for (queries and memory share no positions); build it with "
                "use_rotary=False, no relative_bias and position_bias none."
            )
        q = self.project_q(x, None)
        k, v = self.project_kv(memory, None)
        # Praxis masks cross-attention's padded memory only (no merge with a [T, S] mask), in
        # either mask mode.
        key_valid = None if memory_paddings is None else memory_paddings < 0.5
        mask = kernels.make_mask(x.shape[1], memory.shape[1], causal=False, key_valid=key_valid)
        return self._attend(q, k, v, mask, ctx, causal_only=False, bias=bias, with_probs=with_probs)

    def _attend(
        self,
        q: Float[Array, "batch q heads head_dim"],
        k: Float[Array, "batch k kv_heads head_dim"],
        v: Float[Array, "batch k kv_heads head_dim"],
        mask: Bool[Array, "#batch 1 #q k"] | None,
        ctx: Context,
        *,
        causal_only: bool,
        bias: Float[Array, "#batch #heads q k"] | None,
        with_probs: bool = False,
        plain_causal: Bool[Array, ""] | None = None,
    ) -> tuple:
        """The attention of projected q, k, v (self or cross), by the configured kernel, with
        probability dropout in training and the `logit_max` statistic; then the output projection:
        (output, ctx), or (output, probabilities, ctx) with_probs (the XLA kernel then).
        causal_only: `mask` is exactly the causal mask (cuDNN then takes `is_causal`, no tensor).
        plain_causal: a traced flag, True when this batch's `mask` equals the causal mask (every
        row one segment, no padding): cuDNN then runs the `is_causal` kernel, chosen at run time
        (`lax.cond`), since a mask tensor makes the fused kernel read a [batch, q, k] bias."""
        if ctx.records(LAYER_STATISTICS_VERBOSITY):
            # From q and k directly, so it is the same number whichever kernel runs below.
            logits = kernels.scaled_logits(q, k, self._scale())
            logits = logits if bias is None else logits + bias.astype(jnp.float32)
            ctx = ctx.add_summary("logit_max", kernels.masked_max(logits, mask), LAYER_STATISTICS_VERBOSITY)
        use_dropout = self.dropout_prob > 0.0 and ctx.is_training
        impl = self.implementation
        # A sequence split over a context axis is XLA's: cuDNN's partitioner refuses a sharded sequence.
        auto_cudnn = not is_split("seq") and kernels.cudnn_qualifies(q, self.logit_cap, use_dropout)
        cudnn = impl == "cudnn" or (impl == "auto" and auto_cudnn)
        if cudnn and not with_probs:
            attend = lambda m, causal: kernels.cudnn_attention(
                q, k, v, m, scale=self._scale(), causal_only=causal, bias=bias
            )  # fmt: skip
            if plain_causal is None:
                o = attend(mask, causal_only)
            else:
                o = jax.lax.cond(plain_causal, lambda: attend(None, True), lambda: attend(mask, False))
        else:
            keep = None
            if use_dropout:
                key, ctx = ctx.next_key()
                p = self.dropout_prob
                shape = (q.shape[0], self.num_heads, q.shape[1], k.shape[1])
                keep = jax.random.bernoulli(key, 1.0 - p, shape) / (1.0 - p)
            o = kernels.xla_attention(
                q, k, v, mask, scale=self._scale(), logit_cap=self.logit_cap, bias=bias, dropout_keep=keep,
                return_probs=with_probs,
            )  # fmt: skip
            if with_probs:
                o, probs = o
                return self._output(o), probs, ctx
        return self._output(o), ctx

    # Decoding against a cache ----------------------------------------------------------------
    def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> KVCache:
        """An empty cache for up to `max_len` tokens: rolling, of left_context slots, when this
        layer's sliding window is shorter (`empty_cache`)."""
        return empty_cache((), batch, max_len, self.num_kv_heads, self.head_dim, dtype, self.window)

    def decode(
        self,
        x: Float[Array, "batch new embed"],
        cache: KVCache,
        start: Int[Array, ""] | Int[Array, " batch"],
        positions: Int[Array, "batch new"],
        key_valid: Bool[Array, "batch max_len"],
        *,
        bias: Float[Array, "#batch #heads new max_len"] | None = None,
    ) -> tuple[Float[Array, "batch new embed"], KVCache]:
        """Attends the new tokens (token indices [start, start + new)) to the cache and to
        themselves, and returns the cache with their keys and values in it.

        start: one index for every row (a batch of left-padded prompts), or one per row [B]
        (continuous batching: each decode slot of a server is at its own position).

        key_valid marks the sequence's real tokens, [batch, max_len] by token index (False for
        left padding of shorter prompts, for a chunk's padding); keys after a query are excluded
        by the causal mask. bias: an additive bias on the logits against every cache slot (T5's
        relative position bias of the new tokens' positions against the slots'), as `bias` in
        `__call__`; a rolling cache takes none (its slots are not token indices).

        A full cache (slot i = token i) writes the new keys at [start, start + new) and attends to
        every slot. A rolling cache (`KVCache.index`) attends to [its slots ++ the new keys] by
        their token indices (a slot counts when it holds a real token before `start`: a server's
        reused row may hold a previous request's), then keeps, in slot p % window, the last real
        token p of each slot: a prefill longer than the window keeps its last `window` tokens.
        """
        q, k, v = self.project_qkv(x, positions)
        b, new = x.shape[:2]
        query_index = jnp.reshape(start, (-1, 1)).astype(jnp.int32) + jnp.arange(new, dtype=jnp.int32)  # [1|B, new]
        if cache.rolling:
            if bias is not None:
                raise ValueError(
                    "Attention.decode: a rolling cache (a sliding window shorter than the sequence) takes no bias "
                    "against cache slots, which do not hold token indices; give the layer its own relative_bias."
                )
            return self._decode_rolling(q, k, v, cache, jnp.broadcast_to(query_index, (b, new)), key_valid)
        k_all, v_all = write_at(cache.k, k, start), write_at(cache.v, v, start)
        slots = k_all.shape[1]
        key_index = jnp.arange(slots, dtype=jnp.int32)[None]
        distances = self._distances(slots, True)
        bias = self._position_terms(bias, q, k_all.astype(q.dtype), query_index, key_index, distances)
        mask = kernels.make_mask(new, slots, causal=True, q_offset=start, key_valid=key_valid, window=self.window)
        o = kernels.xla_attention(
            q, k_all.astype(q.dtype), v_all.astype(q.dtype), mask, scale=self._scale(),
            logit_cap=self.logit_cap, bias=bias,
        )  # fmt: skip
        return self._output(o), KVCache(k_all, v_all)

    def _decode_rolling(
        self,
        q: Float[Array, "batch new heads head_dim"],
        k: Float[Array, "batch new kv_heads head_dim"],
        v: Float[Array, "batch new kv_heads head_dim"],
        cache: KVCache,
        query_index: Int[Array, "batch new"],
        key_valid: Bool[Array, "batch max_len"],
    ) -> tuple[Float[Array, "batch new embed"], KVCache]:
        """`decode` against a rolling cache (see there)."""
        window = cache.k.shape[1]
        real = lambda index: (
            (index >= 0) & jnp.take_along_axis(key_valid, jnp.clip(index, 0, key_valid.shape[1] - 1), axis=1)
        )
        old_valid = real(cache.index) & (cache.index < query_index[:, :1])
        new_valid = real(query_index)
        key_index = jnp.concatenate([cache.index, query_index], axis=1)
        keys = jnp.concatenate([cache.k.astype(q.dtype), k.astype(q.dtype)], axis=1)
        values = jnp.concatenate([cache.v.astype(q.dtype), v.astype(q.dtype)], axis=1)
        mask = kernels.make_mask(
            q.shape[1], keys.shape[1], causal=True, q_offset=query_index[:, 0],
            key_valid=jnp.concatenate([old_valid, new_valid], axis=1), window=self.window, key_index=key_index,
        )  # fmt: skip
        bias = self._position_terms(None, q, keys, query_index, key_index, self._distances(window, True))
        o = kernels.xla_attention(q, keys, values, mask, scale=self._scale(), logit_cap=self.logit_cap, bias=bias)
        return self._output(o), roll_in(cache, k, v, query_index, new_valid)

    def project_memory(self, memory: Float[Array, "batch memory embed"]) -> KVCache:
        """Cross-attention's keys and values of `memory`, [B, S, kv_heads, head_dim] each: what
        `decode_cross` attends to, computed once per decoded sequence instead of every step."""
        return KVCache(*self.project_kv(memory, None))

    def decode_cross(
        self,
        x: Float[Array, "batch new embed"],
        memory_kv: KVCache,
        memory_valid: Bool[Array, "batch memory"] | None,
        *,
        bias: Float[Array, "#batch #heads new memory"] | None = None,
    ) -> Float[Array, "batch new embed"]:
        """`cross` for decoding: the new tokens' queries against keys/values from
        `project_memory`. memory_valid: False at padded memory positions (None: all real);
        bias: as `cross`'s. No dropout, no side outputs; numerically `cross` on the same inputs."""
        if self.rotary_max_timescale is not None or self.position_bias is not None or self.relative_bias is not None:
            raise ValueError(
                "Attention.decode_cross: build cross-attention with use_rotary=False, no relative_bias and "
                "position_bias none."
            )
        q = self.project_q(x, None)
        mask = kernels.make_mask(x.shape[1], memory_kv.k.shape[1], causal=False, key_valid=memory_valid)
        o = kernels.xla_attention(
            q, memory_kv.k.astype(q.dtype), memory_kv.v.astype(q.dtype), mask, scale=self._scale(),
            logit_cap=self.logit_cap, bias=bias,
        )  # fmt: skip
        return self._output(o)
