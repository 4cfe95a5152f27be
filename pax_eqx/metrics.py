"""Weighted metrics: every metric is a `(value, weight)` pair (Pax's WeightedScalars).

A model reports each metric as the mean over what it measured and how much that was:

    {"avg_xent": Weighted(value=sum(xent * w) / sum(w), weight=sum(w)), ...}

so that combining pieces of a step -- microbatches, eval batches, hosts -- is exact:

    merged.value = sum(value_i * weight_i) / sum(weight_i),   merged.weight = sum(weight_i)

An average of averages with equal weights is not the full-batch mean when the pieces hold
different numbers of real examples (padded rows weigh 0); this is. A metric that is not an
average over examples (a learning rate, a gradient norm) has weight 1.

`Weighted` is a NamedTuple, hence a pytree: it passes through `jit`, `lax.scan` and
`device_get` unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

Metrics = dict[str, "Weighted"]


class Weighted(NamedTuple):
    """A mean `value` over `weight` units (tokens, examples; 1 for a plain scalar)."""

    value: Float[ArrayLike, "*stack"]
    weight: Float[ArrayLike, "*stack"]


def weighted(value: ArrayLike, weight: ArrayLike = 1.0) -> Weighted:
    """A float32 Weighted pair (the weight broadcast to the value's shape)."""
    value = jnp.asarray(value, jnp.float32)
    return Weighted(value, jnp.broadcast_to(jnp.asarray(weight, jnp.float32), value.shape))


def weighted_mean(total: ArrayLike, weight: ArrayLike) -> Weighted:
    """The pair for a sum of per-example values over `weight` examples: mean = total / weight
    (0 when nothing was measured, rather than NaN)."""
    weight = jnp.asarray(weight, jnp.float32)
    return weighted(jnp.asarray(total, jnp.float32) / jnp.maximum(weight, 1e-30), weight)


def merge_stacked(stacked: Mapping[str, Weighted], axis: int = 0) -> Metrics:
    """Merges metrics stacked along `axis` (e.g. by `lax.scan` over microbatches)."""
    return {name: _merge(m.value, m.weight, axis) for name, m in stacked.items()}


def _merge(value: Array, weight: Array, axis: int) -> Weighted:
    total = jnp.sum(weight, axis)
    mean = jnp.sum(value * weight, axis) / jnp.maximum(total, 1e-30)
    # Metrics nothing measured (all weights 0) stay 0 rather than 0/0.
    return Weighted(jnp.where(total > 0, mean, 0.0), total)


class HostAccumulator:
    """Merges metrics fetched to the host batch by batch (an eval run), in float64.

    acc = HostAccumulator()
    for batch in ...: acc.add(jax.device_get(eval_step(state, batch)))
    acc.result()   # {name: Weighted(mean, total weight)}
    """

    def __init__(self):
        self._sums: dict[str, float] = {}
        self._weights: dict[str, float] = {}

    def add(self, metrics: Mapping[str, Weighted]) -> None:
        for name, m in metrics.items():
            w = float(np.asarray(m.weight, np.float64))
            self._sums[name] = self._sums.get(name, 0.0) + float(np.asarray(m.value, np.float64)) * w
            self._weights[name] = self._weights.get(name, 0.0) + w

    def result(self) -> dict[str, Weighted]:
        return {name: Weighted(self._sums[name] / w if w > 0 else 0.0, w) for name, w in self._weights.items()}
