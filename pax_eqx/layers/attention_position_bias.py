"""Relative position terms of self-attention's logits: none, ALiBi, or Transformer-XL's.

A choice of configs (`--model.block.attention.position-bias alibi`), each holding only what it
reads; every term depends on the distance t - s from a query at token index t to a key at s, so
the same function serves the whole-sequence forward, decoding against a cache, and a rolling
cache whose slots hold keys out of order (their indices are passed, not assumed):

  none   no term (positions come from elsewhere: a position table, rotary, a T5 relative bias).
  alibi  ALiBi (Press et al., arXiv 2108.12409; Praxis' LocalSelfAttentionAlibi): head n adds
         m_n * (s - t), a fixed slope per head: -m_n * distance for keys before the query. The
         slopes are the paper's geometric sequence 2^(-8 i / n) (i = 1..n) for n a power of two;
         other head counts take those of the nearest lower power of two and then every other
         slope of the next one (the paper's reference code: Praxis' `_get_slopes` means to, but
         its array has too many entries then and its layer fails on a shape). Keys after the
         query (a bidirectional window's right context) get +m_n * distance, as Praxis' layer
         does: its term is the same linear function of s - t on both sides.
  xl     Transformer-XL (Dai et al., arXiv 1901.02860, section 3.3; Praxis' DotProductAttentionXL
         and LocalSelfAttentionXL): with R_d = sinusoid(d) @ w_pos (Praxis' PositionalEmbedding
         of rel_pos_emb_dim dims, then its `pos_proj`, [dims, heads, head_dim], no bias) the
         logit of query t and key s is (q_t + u) . k_s + (q_t + v) . R_{t-s}, where q is the
         already scaled query (Praxis adds u and v after its query scale) and u, v ([heads,
         head_dim], zeros at init as Praxis') are the content and position biases (Praxis
         creates them with the attention's use_bias; here `content_bias`).

The terms are added to the logits before the logit cap, as Praxis' `_atten_logits` are.

Praxis' LocalSelfAttentionRelativeBias (DIET-REL, arXiv 2104.08698: a learned scalar per head
and relative distance inside the window) is not a choice here: it is the T5 relative bias
(`layers.relative_position_bias`, the attention's `relative_bias`) with the sliding window,
once the bias has a bucket of its own for every distance the window lets through (causal:
num_buckets / 2 >= left_context; bidirectional: num_buckets / 4 >= max(left_context,
right_context + 1)). Praxis stores its table as [heads, left + right + 2 (block - 1)] with
entries that depend on its block size; only the left + right that the window sees are ever
used, and those are the T5 table's exact buckets (tests/praxis/test_praxis_local_attention.py
maps one onto the other).
"""

from __future__ import annotations

import math
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

from pax_eqx.config import Variant, check_range, config
from pax_eqx.layers.initializers import WeightInit
from pax_eqx.layers.position_embeddings import sinusoidal_position_embedding


def alibi_slopes(num_heads: int) -> np.ndarray:
    """[num_heads] float32: ALiBi's slope of each head (the module doc), computed in float64."""
    closest = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = [2.0 ** (-8.0 * i / closest) for i in range(1, closest + 1)]
    # The next power of two's odd-numbered slopes, 2^(-4 i / closest) for i = 1, 3, 5, ...
    slopes += [2.0 ** (-4.0 * i / closest) for i in range(1, 2 * (num_heads - closest), 2)]
    return np.asarray(slopes, np.float64).astype(np.float32)


class Alibi(eqx.Module):
    """ALiBi's fixed per-head slopes (no weights)."""

    slopes: tuple[float, ...] = eqx.field(static=True)

    def __call__(
        self,
        q: Float[Array, "batch q heads head_dim"],
        k: Float[Array, "batch k kv_heads head_dim"],
        query_index: Int[Array, "#batch q"],
        key_index: Int[Array, "#batch k"],
        distances: tuple[int, int],
    ) -> Float[Array, "#batch heads q k"]:
        """m_n * (s - t) for every query t and key s, float32 (q, k and distances unused)."""
        del q, k, distances
        relative = (key_index[:, None, :] - query_index[:, :, None]).astype(jnp.float32)  # [#B, q, k]
        return jnp.asarray(self.slopes, jnp.float32)[None, :, None, None] * relative[:, None]


class TransformerXLPositions(eqx.Module):
    """Transformer-XL's position projection and content/position biases (the module doc)."""

    w_pos: Float[Array, "pos_embed heads head_dim"]  # Praxis' pos_proj.w
    u: Float[Array, "heads head_dim"] | None  # the content bias; None: content_bias=False
    v: Float[Array, "heads head_dim"] | None  # the position bias

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        # The embedding's dims are few and every head reads them: never sharded; heads as attention's.
        return {"w_pos": (None, "heads", "kv"), "u": ("heads", "kv"), "v": ("heads", "kv")}

    def embeddings(self, lo: int, hi: int, dtype) -> Float[Array, "distances heads head_dim"]:
        """R_d for d = lo..hi: the sinusoid of each distance through w_pos."""
        sinusoid = sinusoidal_position_embedding(jnp.arange(lo, hi + 1), self.w_pos.shape[0])
        return jnp.einsum("de,enh->dnh", sinusoid, self.w_pos.astype(jnp.float32)).astype(dtype)

    def __call__(
        self,
        q: Float[Array, "batch q heads head_dim"],
        k: Float[Array, "batch k kv_heads head_dim"],
        query_index: Int[Array, "#batch q"],
        key_index: Int[Array, "#batch k"],
        distances: tuple[int, int],
    ) -> Float[Array, "batch heads q k"]:
        """u . k_s + (q_t + v) . R_{t-s} for every query t and key s, float32.

        q: the scaled queries; k: the keys (grouped kv heads: query head n reads kv head n // G).
        distances: (lo, hi), the static range of t - s the mask lets through; R is computed for
        those only (hi - lo + 1 rows, the window's length or the sequence's), each pair's term
        gathered from the [batch, heads, q, hi - lo + 1] products by its distance (pairs outside
        the range are masked: they read the nearest end)."""
        b, t, n, h = q.shape
        lo, hi = distances
        r = self.embeddings(lo, hi, q.dtype)
        qv = q if self.v is None else q + self.v.astype(q.dtype)
        by_distance = jnp.einsum("bqnh,dnh->bnqd", qv, r, preferred_element_type=jnp.float32)
        relative = query_index[:, :, None] - key_index[:, None, :]  # [#B, q, k]
        which = jnp.clip(relative - lo, 0, hi - lo)[:, None]  # broadcast over the heads
        out = jnp.take_along_axis(by_distance, which, axis=-1)
        if self.u is not None:
            kv_heads = k.shape[2]
            u = self.u.astype(k.dtype).reshape(kv_heads, n // kv_heads, h)
            content = jnp.einsum("kgh,bskh->bkgs", u, k, preferred_element_type=jnp.float32)
            out = out + content.reshape(b, n, 1, k.shape[1])
        return out


@config
class NoPositionBiasConfig(Variant):
    """No relative position term."""

    kind: ClassVar[str] = "none"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Nothing to check: no fields."""

    def build(self, key: PRNGKeyArray, *, input_dims: int, num_heads: int, head_dim: int, init: WeightInit) -> None:
        """None: no module."""
        return None


@config
class AlibiConfig(Variant):
    """ALiBi's linear distance penalty, a fixed slope per head (no fields: the slopes follow from
    the head count)."""

    kind: ClassVar[str] = "alibi"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Nothing to check: no fields."""

    def build(self, key: PRNGKeyArray, *, input_dims: int, num_heads: int, head_dim: int, init: WeightInit) -> Alibi:
        """The slopes of `num_heads` heads."""
        del key, input_dims, head_dim, init
        return Alibi(tuple(float(m) for m in alibi_slopes(num_heads)))


@config
class TransformerXLConfig(Variant):
    """Transformer-XL's relative attention (the module doc).

    embedding_dims: the sinusoidal relative embedding's width (Praxis' rel_pos_emb_dim); 0 = the
      attention's input width (Transformer-XL's d_model).
    content_bias: the learned content and position biases u and v ([heads, head_dim] each, zeros
      at init); Praxis has them when its attention has use_bias.
    """

    kind: ClassVar[str] = "xl"
    embedding_dims: int = 0
    content_bias: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        check_range(self, "embedding_dims", ge=0, prefix="position_bias xl", note="0 = the attention's input width")

    def build(
        self, key: PRNGKeyArray, *, input_dims: int, num_heads: int, head_dim: int, init: WeightInit
    ) -> TransformerXLPositions:
        """w_pos [embedding_dims, heads, head_dim] by `init` (fan-in the embedding's width, fan-out
        heads x head_dim, as the attention's own projections), u and v zeros."""
        dims = self.embedding_dims or input_dims
        w_pos = init(key, (dims, num_heads * head_dim)).reshape(dims, num_heads, head_dim)
        zeros = jnp.zeros((num_heads, head_dim), jnp.float32) if self.content_bias else None
        return TransformerXLPositions(w_pos, zeros, zeros)


PositionBiasConfig = NoPositionBiasConfig | AlibiConfig | TransformerXLConfig
"""The choice of a relative position term (`--model.block.attention.position-bias xl`)."""

PositionBias = Alibi | TransformerXLPositions
