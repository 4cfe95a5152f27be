"""Multihost infeed: which examples a host reads, in which order, and how eval epochs end together.

In Pax every JAX process has its own input with its own `infeed_host_index`; the global batch
is `batch_size x num_infeed_hosts`. The rules (data-inputs seed):

- training: hosts never emit the same example. Each epoch is one shuffle of all N examples
  (seeded by `input_random_seed` and the epoch number, so every epoch has a fresh order and
  every host computes the same permutation without talking to the others); host i takes
  positions i, i + n, i + 2n, ... of it. The shards of one epoch are disjoint and their union
  is the epoch.
- a finite eval epoch: every host must raise StopIteration after the same number of batches.
  Host i again takes positions i::n, then pads its shard with padding examples (weights 0)
  up to `ceil(ceil(N / n) / batch_size) * batch_size`, a length every host computes from N
  alone. Padded rows never count in metrics because their weights are 0.

All of it is grain index arithmetic on a MapDataset (`seed().shuffle()[i::n].repeat()`):
grain's shuffle re-seeds per epoch and its slice passes the epoch on to the shuffle, so no
example list is ever materialised.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import grain

from pax_eqx.config import ConfigError
from pax_eqx.data.input_config import InputConfig


@dataclasses.dataclass(frozen=True)
class HostShard:
    """This host's place among the infeed hosts: shard `index` of `count`."""

    count: int
    index: int

    def __post_init__(self):
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ConfigError(
                f"infeed_host_index={self.index} is out of range for num_infeed_hosts={self.count}; "
                f"use 0..{max(self.count - 1, 0)}."
            )


def resolve_host_shard(
    cfg: InputConfig, num_infeed_hosts: int | None = None, infeed_host_index: int | None = None
) -> HostShard:
    """Explicit arguments, else the config, else jax.process_count() / jax.process_index()."""
    count = cfg.num_infeed_hosts if num_infeed_hosts is None else num_infeed_hosts
    index = cfg.infeed_host_index if infeed_host_index is None else infeed_host_index
    if count <= 0 or index < 0:
        import jax

        count = count if count > 0 else jax.process_count()
        index = index if index >= 0 else jax.process_index()
    return HostShard(count=count, index=index)


def shard_examples(examples: grain.MapDataset, cfg: InputConfig, shard: HostShard) -> grain.MapDataset:
    """This host's examples: shuffled per epoch (if cfg.shuffle), sliced [index::count], repeated
    forever if cfg.repeat. Not yet padded or batched."""
    if len(examples) == 0:
        raise ConfigError("the input has no examples; check the data source (data.source, data.path).")
    ds = examples
    if cfg.shuffle:
        ds = ds.seed(cfg.input_random_seed).shuffle()
    ds = ds[shard.index :: shard.count]
    if cfg.repeat:
        if len(ds) == 0:  # fewer examples than hosts: this host's shard is empty
            raise ConfigError(
                f"{len(examples)} example(s) cannot be shared by {shard.count} infeed hosts for a repeating "
                "input; use more data or fewer hosts."
            )
        ds = ds.repeat()
    return ds


def padded_shard_length(num_examples: int, batch_size: int, num_hosts: int) -> int:
    """Examples per host after padding a finite epoch: full batches, the same on every host."""
    per_host = math.ceil(num_examples / num_hosts)
    return math.ceil(per_host / batch_size) * batch_size


class PadToLength(grain.MapDataset):
    """`parent` followed by copies of `pad_example` up to `length` elements."""

    def __init__(self, parent: grain.MapDataset, length: int, pad_example: Any):
        super().__init__(parent)
        if length < len(parent):
            raise ValueError(f"cannot pad {len(parent)} elements down to {length}.")
        self._length = length
        self._num_real = len(parent)
        self._pad_example = pad_example

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        index = index % self._length
        if index < self._num_real:
            return self._parent[index]
        return self._pad_example

    def __str__(self) -> str:
        return f"PadToLength(length={self._length})"


def batch_host_examples(
    examples: grain.MapDataset,
    cfg: InputConfig,
    shard: HostShard,
    pad_example: Any,
) -> tuple[grain.MapDataset, int | None]:
    """Batches of this host's examples, and the batches per epoch (None if the input repeats).

    Repeating inputs drop nothing and pad nothing: batches run across epoch boundaries. Finite
    inputs are padded with `pad_example` so that every host has the same number of full
    batches (`padded_shard_length`).
    """
    ds = shard_examples(examples, cfg, shard)
    if cfg.repeat:
        return ds.batch(cfg.batch_size, drop_remainder=True), None
    length = padded_shard_length(len(examples), cfg.batch_size, shard.count)
    ds = PadToLength(ds, length, pad_example)
    return ds.batch(cfg.batch_size, drop_remainder=True), length // cfg.batch_size


def zeros_like_example(example: dict[str, Any]) -> dict[str, Any]:
    """A padding example: every field zero (ids = pad 0, weights 0, segment_ids 0)."""
    import numpy as np

    return {k: np.zeros_like(np.asarray(v)) for k, v in example.items()}


def shard_sizes(num_examples: int, num_hosts: int) -> Sequence[int]:
    """Real examples on each host for a finite epoch (for reports and tests)."""
    return [len(range(i, num_examples, num_hosts)) for i in range(num_hosts)]
