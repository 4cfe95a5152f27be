"""Multi-head, multi-query and grouped-query dot-product attention (praxis.layers.attentions).

Projections are stored per head: `w_q: [embed, heads, head_dim]`, `w_k/w_v: [embed, kv_heads,
head_dim]`, `w_o: [heads, head_dim, embed]`, so tensor parallelism shards the `heads` axis
(Megatron style) without reshapes. With `combine_qkv` (multi-head only, as Praxis'
CombinedQKVProjectionLayer) one `[3, embed, heads, head_dim]` weight makes a single matmul.

`__call__` is the training/eval forward over whole sequences. `decode` runs queries against a
key/value cache: prefill (many tokens at once) and `extend_step` (one token) are the same
function, which is why extend_step agrees with the full forward pass by construction (and a
test checks it numerically).
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from pax_eqx.config import Config, config
from pax_eqx.layers import attention_kernels as kernels
from pax_eqx.layers.base import Context
from pax_eqx.layers.initializers import WeightInit
from pax_eqx.layers.position_embeddings import apply_rotary


@config
class AttentionConfig(Config):
    """Dot-product attention.

    input_dims: model dims (set by the parent layer); num_heads: query heads;
    dim_per_head: 0 = input_dims // num_heads; num_kv_heads: 0 = num_heads (multi-head),
      1 = multi-query, otherwise grouped-query (must divide num_heads).
    combine_qkv: one fused QKV weight (multi-head only).
    use_bias: biases on the q/k/v and output projections.
    causal: each position attends only to itself and earlier positions.
    use_rotary: rotary position embedding on q and k (from `segment_pos`).
    per_dim_scale: Praxis PerDimScale, a learned per-dimension query scale.
    logit_cap: 0 = off, else logits = cap * tanh(logits / cap).
    dropout_prob: dropout on attention probabilities (TRAIN mode only).
    implementation: "auto" (cuDNN on GPU when it qualifies, else XLA), "xla" or "cudnn".
    """

    input_dims: int = 0
    num_heads: int = 0
    dim_per_head: int = 0
    num_kv_heads: int = 0
    combine_qkv: bool = False
    use_bias: bool = False
    causal: bool = True
    use_rotary: bool = False
    rotary_max_timescale: float = 10_000.0
    per_dim_scale: bool = False
    logit_cap: float = 0.0
    dropout_prob: float = 0.0
    implementation: kernels.Implementation = "auto"
    init: WeightInit = WeightInit()

    @property
    def head_dim(self) -> int:
        return self.dim_per_head or self.input_dims // max(self.num_heads, 1)

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    def build(self, key: PRNGKeyArray) -> Attention:
        return Attention(self, key=key)


class KVCache(eqx.Module):
    """Keys and values of every position decoded so far: [batch, max_len, kv_heads, head_dim]
    (with a leading [num_layers] axis for a repeated stack)."""

    k: Float[Array, "*layers batch max_len kv_heads head_dim"]
    v: Float[Array, "*layers batch max_len kv_heads head_dim"]


def _project(
    x: Float[Array, "batch time embed"], w: Float[Array, "embed heads head_dim"]
) -> Float[Array, "batch time heads head_dim"]:
    """x @ w per head, in x's dtype. A function of both arrays so the shape check ties x's
    embed to the weight's (jaxtyping does not relate arguments to field annotations)."""
    return jnp.einsum("btd,dnh->btnh", x, w.astype(x.dtype))


def _project_combined(
    x: Float[Array, "batch time embed"], w: Float[Array, "3 embed heads head_dim"]
) -> Float[Array, "3 batch time heads head_dim"]:
    return jnp.einsum("btd,cdnh->cbtnh", x, w.astype(x.dtype))


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
    cfg: AttentionConfig = eqx.field(static=True)

    def __init__(self, cfg: AttentionConfig, *, key: PRNGKeyArray):
        d, n, kv, h = cfg.input_dims, cfg.num_heads, cfg.kv_heads, cfg.head_dim
        if d <= 0 or n <= 0 or h <= 0:
            raise ValueError(f"AttentionConfig needs input_dims, num_heads > 0; got {d}, {n}.")
        if n % kv:
            raise ValueError(f"AttentionConfig.num_kv_heads={kv} must divide num_heads={n}.")
        if cfg.combine_qkv and kv != n:
            raise ValueError(
                f"AttentionConfig.combine_qkv needs num_kv_heads == num_heads (got {kv} vs {n}); "
                "set combine_qkv=False for multi-query or grouped-query attention."
            )
        kq, kk, kv_, ko = jax.random.split(key, 4)
        init = cfg.init
        # Praxis initialises per-head weights with fan_in = embed, fan_out = heads * head_dim.
        flat = lambda k, shape: init(k, (shape[0], math.prod(shape[1:]))).reshape(shape)
        if cfg.combine_qkv:
            self.w_qkv = jnp.stack([flat(k, (d, n, h)) for k in (kq, kk, kv_)])
            self.w_q = self.w_k = self.w_v = None
        else:
            self.w_qkv = None
            self.w_q, self.w_k, self.w_v = flat(kq, (d, n, h)), flat(kk, (d, kv, h)), flat(kv_, (d, kv, h))
        self.w_o = init(ko, (n * h, d)).reshape(n, h, d)
        zeros = lambda *s: jnp.zeros(s, jnp.float32) if cfg.use_bias else None
        self.b_q, self.b_k, self.b_v, self.b_o = zeros(n, h), zeros(kv, h), zeros(kv, h), zeros(d)
        self.per_dim_scale = jnp.zeros((h,), jnp.float32) if cfg.per_dim_scale else None
        self.cfg = cfg

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
    def project_qkv(
        self, x: Float[Array, "batch time embed"], positions: Int[Array, "batch time"]
    ) -> tuple[Array, Array, Array]:
        """q: [B, T, N, H] (already scaled when per_dim_scale), k, v: [B, T, K, H]."""
        dt = x.dtype
        # Praxis' activation names, for the named remat policies (layers/repeats.py).
        if self.w_qkv is not None:
            q, k, v = checkpoint_name(_project_combined(x, self.w_qkv), "combined_qkv_proj")
        else:
            q = checkpoint_name(_project(x, self.w_q), "query_proj")
            k = checkpoint_name(_project(x, self.w_k), "key_proj")
            v = checkpoint_name(_project(x, self.w_v), "value_proj")
        if self.b_q is not None:
            q, k, v = q + self.b_q.astype(dt), k + self.b_k.astype(dt), v + self.b_v.astype(dt)
        if self.cfg.use_rotary:
            q = apply_rotary(q, positions, max_timescale=self.cfg.rotary_max_timescale)
            k = apply_rotary(k, positions, max_timescale=self.cfg.rotary_max_timescale)
        if self.per_dim_scale is not None:
            # Praxis PerDimScale: 1/softplus(0) normalises the initial scale to 1/sqrt(H).
            r_softplus_0 = 1.442695041
            s = r_softplus_0 / math.sqrt(q.shape[-1]) * jax.nn.softplus(self.per_dim_scale)
            q = (q * s.astype(dt)).astype(dt)
        return q, k, v

    def _scale(self) -> float:
        return 1.0 if self.per_dim_scale is not None else 1.0 / math.sqrt(self.cfg.head_dim)

    def _output(self, o: Float[Array, "batch time heads head_dim"]) -> Float[Array, "batch time embed"]:
        o = checkpoint_name(o, "context")
        y = checkpoint_name(jnp.einsum("btnh,nhd->btd", o, self.w_o.astype(o.dtype)), "out_proj")
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
        paddings: 1.0 at padded key positions, which no query attends to.
        bias: an additive bias on the attention logits.
        """
        b, t, _ = x.shape
        positions = segment_pos if segment_pos is not None else jnp.broadcast_to(jnp.arange(t), (b, t))
        q, k, v = self.project_qkv(x, positions)
        key_valid = None if paddings is None else paddings < 0.5
        mask = kernels.make_mask(
            t, t, causal=self.cfg.causal, segment_ids_q=segment_ids, segment_ids_k=segment_ids,
            key_valid=key_valid,
        )  # fmt: skip
        use_dropout = self.cfg.dropout_prob > 0.0 and ctx.is_training
        impl = self.cfg.implementation
        if impl == "cudnn" or (impl == "auto" and kernels.cudnn_qualifies(q, self.cfg.logit_cap, use_dropout)):
            causal_only = self.cfg.causal and segment_ids is None and key_valid is None
            o = kernels.cudnn_attention(q, k, v, mask, scale=self._scale(), causal_only=causal_only, bias=bias)
        else:
            keep = None
            if use_dropout:
                key, ctx = ctx.next_key()
                p = self.cfg.dropout_prob
                keep = jax.random.bernoulli(key, 1.0 - p, (b, self.cfg.num_heads, t, t)) / (1.0 - p)
            o = kernels.xla_attention(
                q, k, v, mask, scale=self._scale(), logit_cap=self.cfg.logit_cap, bias=bias,
                dropout_keep=keep,
            )  # fmt: skip
        return self._output(o), ctx

    # Decoding against a cache ----------------------------------------------------------------
    def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> KVCache:
        shape = (batch, max_len, self.cfg.kv_heads, self.cfg.head_dim)
        return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    def decode(
        self,
        x: Float[Array, "batch new embed"],
        cache: KVCache,
        start: Int[Array, ""],
        positions: Int[Array, "batch new"],
        key_valid: Bool[Array, "batch max_len"],
    ) -> tuple[Float[Array, "batch new embed"], KVCache]:
        """Writes the new tokens' k/v at [start, start + new) and attends to the cache.

        key_valid marks cache slots holding real tokens (False for left padding of shorter
        prompts); slots after the new tokens are excluded by the causal mask.
        """
        q, k, v = self.project_qkv(x, positions)
        zero = jnp.zeros((), jnp.int32)
        k_all = jax.lax.dynamic_update_slice(cache.k, k.astype(cache.k.dtype), (zero, start, zero, zero))
        v_all = jax.lax.dynamic_update_slice(cache.v, v.astype(cache.v.dtype), (zero, start, zero, zero))
        mask = kernels.make_mask(x.shape[1], cache.k.shape[1], causal=True, q_offset=start, key_valid=key_valid)
        o = kernels.xla_attention(
            q, k_all.astype(q.dtype), v_all.astype(q.dtype), mask, scale=self._scale(),
            logit_cap=self.cfg.logit_cap,
        )  # fmt: skip
        return self._output(o), KVCache(k_all, v_all)
