"""Softmax cross-entropy of a linear layer's logits, a chunk of positions at a time, gradients fused in.

A language model's last matmul makes `[batch, time, vocab]` logits: 6.6 GB in float32 for
GPT3-XL at batch 16 x 2048, and as much again for their gradient. `chunked_softmax_xent`
never makes them whole. It walks the positions `chunk` at a time (every row's positions
t..t+chunk: the batch axis, and so its sharding, stays whole) and, for each chunk,

    z = h_c @ w.T + b          (float32)   [batch, chunk, vocab]
    xent = logsumexp(z) - z[label]         (with label smoothing / soft cap when asked)
    dz = (softmax(z) - target) * weight    the loss's gradient w.r.t. z, right away
    dh_c = dz @ w ;  dw += dz.T @ h_c ;  db += sum(dz)

keeping only the sums and `dh`, `dw`, `db` for the backward pass, which then just scales them
by the incoming cotangent. So the logits' matmul runs once and its two gradient matmuls once,
as without chunking (a `jax.checkpoint` per chunk would run the logits matmul a second time in
the backward), and memory holds one chunk's logits instead of the sequence's. Levanter's
blockwise cross-entropy and Liger's fused linear cross-entropy are the same idea.

The price of computing gradients in the forward: `eval` pays nothing (jax calls the plain
function when nothing is differentiated), but the weight gradient is reduced over the batch
once per chunk, which on a data-parallel mesh is one all-reduce of `[vocab, embed]` per chunk:
prefer few, large chunks there. Being a `custom_vjp`, it has reverse-mode derivatives only
(grad of grad works; `jax.jvp` / `jacfwd` do not).

The time axis is cut into ceil(T / chunk) pieces of equal size (at most `chunk`), so a chunk
longer than the sequence costs no more than the sequence.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int


def chunked_softmax_xent(
    h: Float[Array, "batch time embed"],
    w: Float[Array, "vocab embed"],
    b: Float[Array, " vocab"] | None,
    labels: Int[Array, "batch time"],
    weights: Float[Array, "batch time"],
    *,
    chunk: int,
    soft_cap: float = 0.0,
    label_smoothing: float = 0.0,
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """(sum of weight x cross-entropy, sum of weight x [argmax == label]), float32 scalars.

    h: the final-normed activations (any float dtype: the matmuls run in h's dtype with float32
      results). w, b: the softmax weight as `[vocab, embed]` and its bias (None: none); both are
      cast to h's dtype where used, and their gradients come back in their own dtype.
    soft_cap: 0 = off, else z = cap * tanh(z / cap). label_smoothing: the target is
      (1 - p) * onehot + p / vocab (`optax.smooth_labels`).
    Differentiable w.r.t. h, w, b and weights; the accuracy sum has no gradient.
    """
    if chunk <= 0:
        raise ValueError(f"chunked_softmax_xent: chunk must be > 0, got {chunk}.")
    options = (chunk, float(soft_cap), float(label_smoothing))
    dtypes = (h.dtype.name, w.dtype.name, None if b is None else b.dtype.name)  # of the gradients
    return _xent_sums(h, w, b, labels, weights.astype(jnp.float32), options, dtypes)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _xent_sums(h, w, b, labels, weights, options, dtypes):
    sums, _ = _sweep(h, w, b, labels, weights, *options, with_grads=False)
    return sums


def _xent_sums_fwd(h, w, b, labels, weights, options, dtypes):
    return _sweep(h, w, b, labels, weights, *options, with_grads=True)


def _xent_sums_bwd(options, dtypes, residuals, cotangents):
    dh, dw, db, xent = residuals
    g = cotangents[0]  # d(loss) / d(xent sum); the accuracy sum is not differentiable
    h_dtype, w_dtype, b_dtype = dtypes
    return (
        (dh * g).astype(h_dtype),
        (dw * g).astype(w_dtype),
        None if db is None else (db * g).astype(b_dtype),
        None,  # labels: integers
        xent * g,  # d(sum of weight x xent) / d(weight) = xent
    )


_xent_sums.defvjp(_xent_sums_fwd, _xent_sums_bwd)


def _chunks(a: Array, n: int, c: int, pad: int) -> Array:
    """[b, t, ...] -> [n, b, c, ...], the time axis padded by `pad` (zeros) first."""
    a = jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2))
    return jnp.moveaxis(a.reshape(a.shape[0], n, c, *a.shape[2:]), 1, 0)


def _sweep(h, w, b, labels, weights, chunk, soft_cap, label_smoothing, *, with_grads: bool):
    """One pass over the chunks: the two sums and, with_grads, (dh, dw, db, per-position xent)."""
    batch, t, _ = h.shape
    vocab = w.shape[0]
    n = -(-t // chunk)
    chunk = -(-t // n)  # n chunks of at most `chunk` positions, as even as they go: least padding
    pad = n * chunk - t  # padded positions have weight 0: they add nothing to sums or gradients
    w_c = w.astype(h.dtype)
    b32 = None if b is None else b.astype(jnp.float32)

    def body(carry, xs):
        xent_sum, correct_sum, dw, db = carry
        h_i, labels_i, weights_i = xs
        z = jnp.einsum("bcd,vd->bcv", h_i, w_c, preferred_element_type=jnp.float32)
        if b32 is not None:
            z = z + b32
        if soft_cap > 0.0:
            capped = jnp.tanh(z / soft_cap)
            z = soft_cap * capped
        lse = jax.nn.logsumexp(z, axis=-1)
        label_z = jnp.take_along_axis(z, labels_i[..., None], axis=-1)[..., 0]
        xent = lse - (1.0 - label_smoothing) * label_z
        if label_smoothing > 0.0:
            xent = xent - label_smoothing * jnp.mean(z, axis=-1)
        correct = (jnp.argmax(z, axis=-1) == labels_i).astype(jnp.float32)
        carry = (xent_sum + jnp.sum(xent * weights_i), correct_sum + jnp.sum(correct * weights_i), dw, db)
        if not with_grads:
            return carry, None
        # softmax - target, target = (1 - p) onehot + p / V; an iota compare, not a one-hot array
        is_label = jax.lax.broadcasted_iota(jnp.int32, z.shape, 2) == labels_i[..., None]
        dz = jnp.exp(z - lse[..., None]) - label_smoothing / vocab
        dz = jnp.where(is_label, dz - (1.0 - label_smoothing), dz) * weights_i[..., None]
        if soft_cap > 0.0:
            dz = dz * (1.0 - capped * capped)
        dz_c = dz.astype(h.dtype)
        dh_i = jnp.einsum("bcv,vd->bcd", dz_c, w_c)
        dw = dw + jnp.einsum("bcv,bcd->vd", dz_c, h_i, preferred_element_type=jnp.float32)
        if db is not None:
            db = db + jnp.sum(dz, axis=(0, 1))
        return (carry[0], carry[1], dw, db), (dh_i, xent)

    zero = jnp.zeros((), jnp.float32)
    dw0 = jnp.zeros(w.shape, jnp.float32) if with_grads else None
    db0 = jnp.zeros((vocab,), jnp.float32) if with_grads and b is not None else None
    xs = (_chunks(h, n, chunk, pad), _chunks(labels, n, chunk, pad), _chunks(weights, n, chunk, pad))
    (xent_sum, correct_sum, dw, db), per_chunk = jax.lax.scan(body, (zero, zero, dw0, db0), xs)
    if not with_grads:
        return (xent_sum, correct_sum), None

    def unchunk(a):  # [n, b, c, ...] -> [b, t, ...]
        return jnp.moveaxis(a, 0, 1).reshape(batch, n * chunk, *a.shape[3:])[:, :t]

    dh, xent = per_chunk
    return (xent_sum, correct_sum), (unchunk(dh), dw, db, unchunk(xent))
