"""Gradient accumulation: one step's gradient computed a microbatch at a time, exactly.

    grads, outputs, nt_state = accumulate_gradients(loss_fn, params, nt_state, batch, key, n, merge_state)

`loss_fn(params, nt_state, batch, key) -> (terms, aux, outputs)` gives the loss terms of one
(micro)batch as `Weighted` means (each already times its coefficient), the summed aux loss (or
None when the model adds none) and whatever else the step reports (`outputs`, with the new
non-trainable state at `outputs.nt_state`).

The full-batch objective is  sum_i mean_i + aux,  where mean_i = sum over the batch of
value x weight / total weight. A microbatch's mean_i is over *its* weight only, so averaging
microbatch gradients with equal weights is wrong as soon as microbatches hold different numbers
of real (non-padded) predictions. Exactly, with D_i the whole batch's weight of term i:

    grad = sum_k [ sum_i grad(mean_ki) x W_ki / D_i  +  grad(aux_k) / n ]

With one term and no aux loss (the common case) that is sum_k grad(mean_k x W_k) / D: the D
is known after the loop, so nothing extra runs. Otherwise the D_i are needed before the first
microbatch, and a forward-only pass over the microbatches computes them first (one extra
forward per step, only in that case).

Non-trainable variables marked mean_sync are averaged over microbatches, the others keep the
last microbatch's value; the reported metrics are merged by weight, summaries averaged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray, PyTree

from pax_eqx.metrics import Weighted

LossFn = Callable[[Any, Any, dict, PRNGKeyArray], tuple[tuple[Weighted, ...], Array | None, Any]]


def objective(terms: tuple[Weighted, ...], aux: Array | None) -> Array:
    """The scalar minimised on one whole batch: the sum of the terms' means, plus aux."""
    total = sum((t.value for t in terms), jnp.zeros((), jnp.float32))
    return total if aux is None else total + aux


def accumulate_gradients(
    loss_fn: LossFn,
    params: PyTree[Array],
    nt_state: Any,
    batch: dict[str, Array],
    key: PRNGKeyArray,
    num_microbatches: int,
    merge_state: Callable[[Any, Any], Any],
) -> tuple[PyTree[Array], list[Any], Any]:
    """(gradient of the full-batch objective, each microbatch's outputs stacked on a leading
    axis, the merged non-trainable state). See the module docstring."""
    n = num_microbatches
    micro = jax.tree.map(lambda x: x.reshape((n, x.shape[0] // n) + x.shape[1:]), batch)
    keys = jax.random.split(key, n)
    first = jax.tree.map(lambda x: x[0], micro)
    terms_shape, aux_shape, _ = jax.eval_shape(loss_fn, params, nt_state, first, keys[0])
    simple = len(terms_shape) == 1 and aux_shape is None

    if simple:
        # sum_k grad(mean_k * W_k), divided by D = sum_k W_k once the loop has seen every W_k.
        def scaled(p, s, mb, k):
            terms, aux, out = loss_fn(p, s, mb, k)
            return terms[0].value * jax.lax.stop_gradient(terms[0].weight), (terms, out)
    else:
        totals = _total_weights(loss_fn, params, nt_state, micro, keys)

        def scaled(p, s, mb, k):
            terms, aux, out = loss_fn(p, s, mb, k)
            obj = sum(t.value * jax.lax.stop_gradient(t.weight) / d for t, d in zip(terms, totals))
            if aux is not None:
                obj = obj + aux / n
            return obj, (terms, out)

    grad_fn = jax.grad(scaled, has_aux=True)

    def body(carry, xs):
        grads, state = carry
        mb, k = xs
        g, (terms, out) = grad_fn(params, state, mb, k)
        return (jax.tree.map(jnp.add, grads, g), out.nt_state), (terms, out)

    zeros = jax.tree.map(jnp.zeros_like, params)
    (grads, last_state), (terms, outputs) = jax.lax.scan(body, (zeros, nt_state), (micro, keys))
    if simple:
        denom = jnp.maximum(jnp.sum(terms[0].weight), 1e-30)
        grads = jax.tree.map(lambda g: g / denom, grads)
    return grads, outputs, merge_state(last_state, outputs.nt_state)


def _total_weights(loss_fn: LossFn, params, nt_state, micro, keys) -> tuple[Array, ...]:
    """D_i: each term's weight summed over the microbatches, from a forward-only pass."""

    def weights_of(xs):
        mb, k = xs
        terms, _, _ = loss_fn(params, nt_state, mb, k)
        return tuple(t.weight for t in terms)

    per_micro = jax.lax.map(weights_of, (micro, keys))
    return tuple(jnp.maximum(jnp.sum(jax.lax.stop_gradient(w)), 1e-30) for w in per_micro)


def merge_mean_sync(mean_sync: frozenset[str]) -> Callable[[Any, Any], Any]:
    """merge_state for `accumulate_gradients`: variables whose marker is in `mean_sync` (Pax's
    REQUIRES_MEAN_SYNC) get their mean over microbatches, the others the last microbatch's."""

    def merge(last: eqx.nn.State | None, stacked: eqx.nn.State | None) -> eqx.nn.State | None:
        if last is None or not mean_sync:
            return last
        values, markers = stacked.tree_flatten()
        for marker, value in zip(markers, values):
            if marker in mean_sync:
                index = eqx.nn.StateIndex(value[0])
                object.__setattr__(index, "marker", marker)
                last = last.set(index, jnp.mean(value, axis=0))
        return last

    return merge
