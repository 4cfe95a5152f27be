"""Mixtures of sources with weights, with SeqIO's `Mixture` semantics.

SeqIO samples each example of a mixture from task i with probability rate_i / sum(rates)
(`tf.data.Dataset.sample_from_datasets`), and every task's dataset repeats on its own: a small
task runs through many epochs while a large one is still in its first. That is `SampledMix`:

    mixed = SampledMix([docs_a, docs_b], weights=[0.7, 0.3], seed=1234)   # IterDatasets

Element k comes from the source drawn by uniform number k % 4096 of a generator seeded with
(seed, k // 4096) (drawn a block at a time: one generator per element would cost more than the
element): the draw does not depend on what was read before, so the iterator's state is just k
and each source's own state. That state is grain's usual JSON dict, saved in every checkpoint,
and a resumed run continues with exactly the next element. grain's own `mix` interleaves by
fixed proportions: deterministic too, but not SeqIO's random sampling, whose observed rates
vary around the weights as a sample does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grain
import numpy as np

from pax_eqx.config import ConfigError


def mixture_probabilities(weights: Sequence[float], where: str = "data.mixture_weights") -> np.ndarray:
    """The weights normalised to probabilities; every weight must be a positive number."""
    w = np.asarray(weights, np.float64)
    if w.ndim != 1 or len(w) == 0 or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise ConfigError(f"{where}={list(weights)} must be positive numbers, one per source.")
    return w / w.sum()


class SampledMix(grain.IterDataset):
    """Each element from source i with probability weights[i] / sum(weights) (module doc).
    The sources should repeat (training): a finite one ends the mixture when it runs out."""

    def __init__(self, parents: Sequence[grain.IterDataset], weights: Sequence[float], seed: int):
        super().__init__(list(parents))
        if len(parents) != len(weights):
            raise ConfigError(f"a mixture of {len(parents)} sources needs {len(parents)} weights, got {list(weights)}.")
        self._cumulative = np.cumsum(mixture_probabilities(weights))
        self._seed = seed

    def __iter__(self) -> grain.DatasetIterator:
        return _SampledMixIterator([iter(p) for p in self._parents], self._cumulative, self._seed)

    def __str__(self) -> str:
        return f"SampledMix({len(self._parents)} sources, probabilities={np.diff(self._cumulative, prepend=0)})"


_BLOCK = 4096


def block_sources(block: int, cumulative: np.ndarray, seed: int) -> np.ndarray:
    """[4096] the sources of elements block * 4096 ... (block + 1) * 4096 - 1 of a mixture with
    these cumulative probabilities."""
    u = np.random.default_rng([seed, block]).random(_BLOCK)
    return np.minimum(np.searchsorted(cumulative, u, side="right"), len(cumulative) - 1)


class _SampledMixIterator(grain.DatasetIterator):
    def __init__(self, parents: list[grain.DatasetIterator], cumulative: np.ndarray, seed: int):
        super().__init__(parents)
        self._cumulative = cumulative
        self._seed = seed
        self._index = 0
        self._block = (-1, np.zeros(0, np.int64))  # (block number, its sources)

    def __next__(self) -> Any:
        block, offset = divmod(self._index, _BLOCK)
        if self._block[0] != block:
            self._block = (block, block_sources(block, self._cumulative, self._seed))
        source = int(self._block[1][offset])
        self._index += 1
        return next(self._parents[source])

    def get_state(self) -> dict[str, Any]:
        return {"index": self._index, "sources": [p.get_state() for p in self._parents]}

    def set_state(self, state: dict[str, Any]) -> None:
        self._index = int(state["index"])
        for parent, parent_state in zip(self._parents, state["sources"], strict=True):
            parent.set_state(parent_state)

    def __str__(self) -> str:
        return f"SampledMixIterator({len(self._parents)} sources, at element {self._index})"
