"""The attention computation itself: masks, an XLA path and the cuDNN path.

Layout is BTNH (batch, time, heads, head_dim), what cuDNN wants. Grouped-query attention is
computed without replicating key/value heads: queries are viewed as [B, T, K, G, H] (K kv
heads, G = N / K query heads per kv head). The XLA path is plain einsums with a float32
softmax; it supports everything (logit capping, arbitrary masks, dropout on probabilities)
and is what runs on CPU. On GPU, `jax.nn.dot_product_attention(implementation="cudnn")` is
used when the call qualifies (no logit cap, no probability dropout, bf16/fp16, head_dim a
multiple of 8 and <= 256); `implementation=None` would silently mean XLA there.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

# A large negative logit rather than -inf: a fully masked row (a padding query) then gives a
# uniform distribution instead of NaN, as Praxis' does.
_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)

Implementation = Literal["auto", "xla", "cudnn"]


def make_mask(
    q_len: int,
    k_len: int,
    *,
    causal: bool,
    q_offset: Int[Array, ""] | Int[Array, " batch"] | int = 0,
    segment_ids_q: Int[Array, "batch q"] | None = None,
    segment_ids_k: Int[Array, "batch k"] | None = None,
    key_valid: Bool[Array, "batch k"] | None = None,
    window: tuple[int, int] = (0, 0),
    key_index: Int[Array, "#batch k"] | None = None,
) -> Bool[Array, "batch_or_1 1 q k"] | None:
    """True where query t may attend to key s.

    causal: key index <= query index + q_offset (q_offset = where the queries start in the
      key sequence, for decoding against a cache: a scalar, or one per row [batch]).
    segment ids: packed documents attend only within themselves.
    key_valid: False for padded / not-yet-written keys.
    window: (left, right) of a sliding window (layers.attention_window): query t sees keys s with
      t - left < s <= t + right; 0 = unbounded on that side.
    key_index: each key's index in the sequence, where it is not its slot (a rolling cache whose
      slots are reused); default: the slot.
    """
    mask = None

    def both(a, b):
        return b if a is None else a & b

    per_row = jnp.ndim(q_offset) == 1  # a query offset per row (continuous batching)
    q_idx = jnp.arange(q_len)[None, :, None] + (jnp.asarray(q_offset)[:, None, None] if per_row else q_offset)
    k_idx = jnp.arange(k_len)[None, None, :] if key_index is None else key_index[:, None, :]
    left, right = window
    if causal:
        mask = both(mask, (k_idx <= q_idx)[:, None])
    if left:
        mask = both(mask, (k_idx > q_idx - left)[:, None])
    if right and not causal:
        mask = both(mask, (k_idx <= q_idx + right)[:, None])
    if segment_ids_q is not None:
        same = segment_ids_q[:, :, None] == segment_ids_k[:, None, :]
        mask = both(mask, same[:, None])
    if key_valid is not None:
        mask = both(mask, key_valid[:, None, None, :])
    return mask


def scaled_logits(
    q: Float[Array, "batch q heads dim"], k: Float[Array, "batch k kv_heads dim"], scale: float
) -> Float[Array, "batch heads q k"]:
    """q k^T * scale in float32, each query head against its group's kv head (no kv replication)."""
    b, t, n, h = q.shape
    kv_heads = k.shape[2]
    qg = q.reshape(b, t, kv_heads, n // kv_heads, h)
    logits = jnp.einsum("btkgh,bskh->bkgts", qg, k, preferred_element_type=jnp.float32) * scale
    return logits.reshape(b, n, t, k.shape[1])


def masked_max(logits: Float[Array, "batch heads q k"], mask: Bool[Array, "#batch 1 #q k"] | None) -> Float[Array, ""]:
    """The largest logit attention may use (masked-out pairs excluded): the number a logit cap or
    a softmax in low precision has to withstand, recorded as the `logit_max` summary."""
    if mask is not None:
        logits = jnp.where(mask, logits, -jnp.inf)
    return jnp.max(logits)


def rows_with_a_key(mask: Bool[Array, "#batch 1 #q k"]) -> Bool[Array, "#batch 1 #q 1"]:
    """False for a query row whose keys are all masked (a padded query under Praxis' masks, a
    left-padded query at position 0): its softmax is uniform whatever its logits are."""
    # A float max, not `jnp.any`: a boolean reduction over a sharded key axis becomes an all-reduce
    # of predicates, which aborted XLA:CPU (8 fake devices, two test processes) in the SPMD tests.
    return jnp.max(mask.astype(jnp.float32), axis=-1, keepdims=True) > 0


@jax.custom_vjp
def _no_gradient_through_dead_rows(
    logits: Float[Array, "batch heads q k"], live: Bool[Array, "#batch 1 #q 1"]
) -> Float[Array, "batch heads q k"]:
    """The identity, whose backward zeroes the cotangent of rows without a key.

    Praxis replaces masked logits with a large negative number, so a fully masked row's softmax
    (uniform) depends on nothing and passes no gradient to its queries, keys or biases. Adding the
    mask (what `xla_attention` does, see there) gives the same forward, but the add passes the
    uniform softmax's gradient on. This stops it, keeping only `live` ([batch, 1, q, 1]) for the
    backward, where a select would keep its condition broadcast to [batch, heads, q, k].
    """
    return logits


def _dead_rows_fwd(logits, live):
    return logits, live


def _dead_rows_bwd(live, g):
    return g * live.astype(g.dtype), None


_no_gradient_through_dead_rows.defvjp(_dead_rows_fwd, _dead_rows_bwd)


@jax.custom_vjp
def _uniform_where_dead(
    out: Float[Array, "batch q heads dim"],
    uniform: Float[Array, "batch 1 heads dim"],
    live: Bool[Array, "#batch #q 1 1"],
) -> Float[Array, "batch q heads dim"]:
    """`out` at rows with a key, `uniform` (the values' mean: a uniform softmax) at the others; the
    backward sends a dead row's cotangent to `uniform` only, keeping just `live` (a select would
    keep its condition broadcast to `out`'s shape)."""
    return jnp.where(live, out, uniform)


def _uniform_where_dead_fwd(out, uniform, live):
    return _uniform_where_dead(out, uniform, live), live


def _uniform_where_dead_bwd(live, g):
    keep = live.astype(g.dtype)
    return g * keep, jnp.sum(g * (1 - keep), axis=1, keepdims=True), None


_uniform_where_dead.defvjp(_uniform_where_dead_fwd, _uniform_where_dead_bwd)


def fill_rows_without_a_key(
    out: Float[Array, "batch q heads dim"], v: Float[Array, "batch k kv_heads dim"], mask: Bool[Array, "#batch 1 #q k"]
) -> Float[Array, "batch q heads dim"]:
    """A kernel's output with Praxis' rows without a key put back around it: the mean of the
    values (the uniform softmax `xla_attention` gives there), and no gradient from those rows into
    the kernel, hence none to their queries and keys. For a kernel that cannot be changed (cuDNN),
    whatever it computes for such a row (its own masked softmax, maybe NaN) is discarded."""
    b, t, n, h = out.shape
    group = n // v.shape[2]
    uniform = jnp.repeat(jnp.mean(v.astype(jnp.float32), axis=1), group, axis=1)[:, None].astype(out.dtype)
    live = rows_with_a_key(mask)[:, 0, :, :, None]
    return _uniform_where_dead(out, uniform, live)


def xla_attention(
    q: Float[Array, "batch q heads dim"],
    k: Float[Array, "batch k kv_heads dim"],
    v: Float[Array, "batch k kv_heads dim"],
    mask: Bool[Array, "#batch 1 #q k"] | None,
    *,
    scale: float,
    logit_cap: float = 0.0,
    bias: Float[Array, "#batch #heads q k"] | None = None,
    dropout_keep: Float[Array, "batch heads q k"] | None = None,
    return_probs: bool = False,
) -> Float[Array, "batch q heads dim"] | tuple[Float[Array, "batch q heads dim"], Float[Array, "batch heads q k"]]:
    """softmax(cap(q k^T * scale + bias), masked) v, with grouped kv heads (cap: logit_cap *
    tanh(. / logit_cap) when logit_cap > 0); return_probs: also the probabilities [batch, heads,
    q, k] that multiplied v (after dropout, in v's dtype)."""
    b, t, n, h = q.shape
    kv_heads = k.shape[2]
    logits = scaled_logits(q, k, scale)
    if bias is not None:  # before the cap, as Praxis adds its relative bias and position terms
        logits = logits + bias.astype(jnp.float32)
    if logit_cap > 0.0:
        logits = logit_cap * jnp.tanh(logits / logit_cap)
    if mask is not None:
        logits = _no_gradient_through_dead_rows(logits, rows_with_a_key(mask))
        # An additive bias of the mask's own (broadcastable) shape rather than a select: the
        # backward of an add needs no residual, while a select's keeps the mask broadcast to
        # [batch, heads, q, k] (stacked over layers in a scanned stack). Same numbers as Praxis'
        # replacement: a logit plus _MASKED rounds to _MASKED, and + 0.0 changes nothing; the
        # gradients of rows without a key are Praxis' (zero) by the line above.
        logits = logits + jnp.where(mask, 0.0, _MASKED).astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    if dropout_keep is not None:
        probs = probs * dropout_keep
    probs = probs.astype(v.dtype)
    grouped = probs.reshape(b, kv_heads, n // kv_heads, t, k.shape[1])
    out = jnp.einsum("bkgts,bskh->btkgh", grouped, v).reshape(b, t, n, h)
    return (out, probs) if return_probs else out


def cudnn_qualifies(q: Array, logit_cap: float, has_dropout: bool) -> bool:
    return (
        jax.default_backend() == "gpu"
        and logit_cap == 0.0
        and not has_dropout
        and q.dtype in (jnp.bfloat16, jnp.float16)
        and q.shape[-1] % 8 == 0
        and q.shape[-1] <= 256
    )


def one_segment_per_row(
    segment_ids: Int[Array, "batch time"] | None, key_valid: Bool[Array, "batch time"] | None
) -> Bool[Array, ""]:
    """True when every row is one segment with no padding: then the causal mask is the whole
    mask, whatever the segment ids say (unpacked rows, the usual benchmark and eval batch)."""
    one = jnp.bool_(True)
    if segment_ids is not None:
        one = one & jnp.all(segment_ids == segment_ids[:, :1])
    if key_valid is not None:
        one = one & jnp.all(key_valid)
    return one


def cudnn_attention(
    q: Float[Array, "batch q heads dim"],
    k: Float[Array, "batch k kv_heads dim"],
    v: Float[Array, "batch k kv_heads dim"],
    mask: Bool[Array, "#batch 1 #q k"] | None,
    *,
    scale: float,
    causal_only: bool,
    bias: Array | None = None,
    implementation: Literal["cudnn", "xla"] = "cudnn",
) -> Float[Array, "batch q heads dim"]:
    """cuDNN flash attention; a plain causal mask is passed as `is_causal` (no mask tensor).
    cuDNN takes a mask or bias only with its query and key lengths whole (a [B, 1, 1, K]
    padding mask fails its layout check), so both are broadcast to [., ., q, k] first. Rows
    whose keys are all masked are Praxis' (`fill_rows_without_a_key`), outside the kernel.
    implementation="xla": the same call through JAX's XLA reference of it (what the tests
    without a GPU run)."""
    full = lambda a: None if a is None else jnp.broadcast_to(a, (*a.shape[:2], q.shape[1], k.shape[1]))
    out = jax.nn.dot_product_attention(
        q,
        k,
        v,
        bias=full(bias),
        mask=None if causal_only else full(mask),
        scale=scale,
        is_causal=causal_only,
        implementation=implementation,
    )
    return out if causal_only or mask is None else fill_rows_without_a_key(out, v, mask)
