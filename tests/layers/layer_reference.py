"""Helpers for the layer tests: numpy references written from the math, and cheap test inputs.

Why numpy for weights and inputs: on CPU every eager JAX op with a new shape is its own XLA
compile (~0.1-0.2 s each here), and random initialisation of a model is dozens of them. The
tests check the forward math for *given* weights, so they take the structure of
`cfg.build` from `eqx.filter_eval_shape` (no compile) and fill every array from numpy. The
initialisers themselves are tested where they matter (test_layer_linears, the stacks).
"""

import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

# The tests compile many small programs once each; XLA's LLVM optimisation makes each compile
# ~1.5-2x slower and buys nothing at these sizes. Numerics are the same (no fast-math either way).
_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}


def jit(fn: Callable) -> Callable:
    """`eqx.filter_jit` for the tests: arrays are traced, everything else is static, and the
    program is compiled with `_COMPILER_OPTIONS` (which eqx.filter_jit cannot pass on).
    Called inside another traced function, it simply calls `fn`."""
    compiled: dict = {}

    @functools.wraps(fn)
    def call(*args, **kwargs):
        dynamic, static = eqx.partition((args, kwargs), eqx.is_array)
        if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(dynamic)):
            return fn(*args, **kwargs)  # already inside a traced program: it is compiled with it
        leaves, treedef = jax.tree.flatten(static)
        signature = (treedef, tuple(leaves))
        if signature not in compiled:

            def run(dynamic):
                args, kwargs = eqx.combine(dynamic, static)
                return fn(*args, **kwargs)

            compiled[signature] = jax.jit(run, compiler_options=_COMPILER_OPTIONS)
        return compiled[signature](dynamic)

    return call


def random_normal(shape, seed: int = 0, scale: float = 1.0, dtype=jnp.float32) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) * scale, dtype)


def random_module(cfg: Any, seed: int = 0, scale: float = 0.5) -> Any:
    """`cfg.build(key)`'s module with every array drawn from N(0, scale^2) by numpy. `cfg` may
    also be a function key -> module, e.g. `functools.partial(att_cfg.build, input_dims=8, ...)`
    for a config whose sizes are build arguments."""
    build = cfg.build if hasattr(cfg, "build") else cfg
    abstract = eqx.filter_eval_shape(build, jax.random.key(0))
    rng = np.random.default_rng(seed)

    def fill(leaf):
        if isinstance(leaf, jax.ShapeDtypeStruct):
            return jnp.asarray(rng.standard_normal(leaf.shape) * scale, leaf.dtype)
        return leaf

    return jax.tree.map(fill, abstract)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def rotary(x, positions, max_timescale=10_000.0):
    """Praxis RotaryPositionalEmbedding on [B, T, N, H]: rotate each head's first half against its second."""
    dim = x.shape[-1]
    timescale = max_timescale ** (2 * np.arange(dim // 2) / dim)
    angle = np.asarray(positions, np.float64)[:, :, None, None] / timescale
    first, second = np.split(x, 2, axis=-1)
    sin, cos = np.sin(angle), np.cos(angle)
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def reference_attention(
    x,
    w_q,
    w_k,
    w_v,
    w_o,
    *,
    mask=None,
    scale=None,
    logit_cap=0.0,
    q_scale=None,
    bias=None,
    biases=None,
    rotary_positions=None,
):
    """softmax(Q K^T / sqrt(d) [+ bias], masked) V, one head at a time, in float64 numpy.

    x: [B, T, D]; w_q: [D, N, H]; w_k, w_v: [D, K, H] with K dividing N (query head n uses
    kv head n // (N // K)); w_o: [N, H, D]; mask: [B, T, T] booleans (True = may attend);
    q_scale: replaces 1/sqrt(H) by a per-dimension scale on q; biases: (b_q, b_k, b_v, b_o);
    rotary_positions: [B, T] positions for rotary embedding of q and k.
    """
    x = np.asarray(x, np.float64)
    w_q, w_k, w_v, w_o = (np.asarray(w, np.float64) for w in (w_q, w_k, w_v, w_o))
    b, t, _ = x.shape
    n, h, kv = w_q.shape[1], w_q.shape[2], w_k.shape[1]
    q = np.einsum("btd,dnh->btnh", x, w_q)
    k = np.einsum("btd,dkh->btkh", x, w_k)
    v = np.einsum("btd,dkh->btkh", x, w_v)
    if biases is not None:
        q, k, v = q + biases[0], k + biases[1], v + biases[2]
    if rotary_positions is not None:
        q, k = rotary(q, rotary_positions), rotary(k, rotary_positions)
    if q_scale is not None:
        q = q * np.asarray(q_scale, np.float64)
        scale = 1.0
    elif scale is None:
        scale = 1.0 / np.sqrt(h)
    out = np.zeros((b, t, n, h))
    for bi in range(b):
        for head in range(n):
            kh = head // (n // kv)
            logits = q[bi, :, head] @ k[bi, :, kh].T * scale  # [T, T]
            if bias is not None:
                logits = logits + np.asarray(bias)[bi % bias.shape[0], head % bias.shape[1]]
            if logit_cap:
                logits = logit_cap * np.tanh(logits / logit_cap)
            if mask is not None:
                logits = np.where(mask[bi], logits, -1e30)
            out[bi, :, head] = softmax(logits) @ v[bi, :, kh]
    y = np.einsum("btnh,nhd->btd", out, w_o)
    if biases is not None:
        y = y + biases[3]
    return y


def causal_mask(b: int, t: int) -> np.ndarray:
    return np.broadcast_to(np.tril(np.ones((t, t), bool)), (b, t, t))


def key(seed: int) -> jax.Array:
    """A PRNG key for layers that draw randomness in the tests.

    RBG rather than the default threefry: the layers accept any key type, and on CPU a
    threefry bernoulli/uniform costs ~1-2 s of XLA compile per shape against ~0.2 s for RBG.
    """
    return jax.random.key(seed, impl="rbg")
