"""Gradient accumulation: one step's gradient computed a microbatch at a time, exactly.

    grads, outputs, nt_state = accumulate_gradients(loss_fn, params, nt_state, batch, key, n, MeanSync(markers))

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

Non-trainable variables marked mean_sync start every microbatch from the step's value and are
averaged over microbatches; the others are threaded and keep the last microbatch's value
(`MeanSync`). The reported metrics are merged by weight, summaries averaged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, PRNGKeyArray, PyTree

from pax_eqx.layers.base import copy_state
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
    batch: dict[str, ArrayLike],
    key: PRNGKeyArray,
    num_microbatches: int,
    mean_sync: MeanSync,
) -> tuple[PyTree[Array], Any, Any]:
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
        g, (terms, out) = grad_fn(params, mean_sync.start(state, nt_state), mb, k)
        return (jax.tree.map(jnp.add, grads, g), out.nt_state), (terms, out)

    zeros = jax.tree.map(jnp.zeros_like, params)
    (grads, last_state), (terms, outputs) = jax.lax.scan(body, (zeros, nt_state), (micro, keys))
    if simple:
        denom = jnp.maximum(jnp.sum(terms[0].weight), 1e-30)
        grads = jax.tree.map(lambda g: g / denom, grads)
    return grads, outputs, mean_sync.merge(last_state, outputs.nt_state)


def _total_weights(loss_fn: LossFn, params, nt_state, micro, keys) -> tuple[Array, ...]:
    """D_i: each term's weight summed over the microbatches, from a forward-only pass."""

    def weights_of(xs):
        mb, k = xs
        terms, _, _ = loss_fn(params, nt_state, mb, k)
        return tuple(t.weight for t in terms)

    per_micro = jax.lax.map(weights_of, (micro, keys))
    return tuple(jnp.maximum(jnp.sum(jax.lax.stop_gradient(w)), 1e-30) for w in per_micro)


class MeanSync:
    """How non-trainable state crosses microbatches. Variables whose marker is in `markers`
    (Pax's REQUIRES_MEAN_SYNC: batch statistics) start every microbatch from the step's
    initial value and end as the mean of the microbatches' new values -- for a moving average
    of batch means that is exactly the full batch's update; the others are threaded from one
    microbatch to the next (a counter counts every microbatch) and keep the last value."""

    def __init__(self, markers: frozenset[str]):
        self.markers = markers

    def start(self, carried: eqx.nn.State | None, initial: eqx.nn.State | None) -> eqx.nn.State | None:
        if carried is None or not self.markers:
            return carried
        values, markers = initial.tree_flatten()
        return _set(carried, {m: v for m, v in zip(markers, values) if m in self.markers})

    def merge(self, last: eqx.nn.State | None, stacked: eqx.nn.State | None) -> eqx.nn.State | None:
        if last is None or not self.markers:
            return last
        values, markers = stacked.tree_flatten()
        return _set(last, {m: jnp.mean(v, axis=0) for m, v in zip(markers, values) if m in self.markers})


def _set(state: eqx.nn.State, new: dict[str, Array]) -> eqx.nn.State:
    for marker, value in new.items():
        index = eqx.nn.StateIndex(value)
        object.__setattr__(index, "marker", marker)
        state = copy_state(state).set(index, value)
    return state
