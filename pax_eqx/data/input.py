"""Input: Pax's BaseInput contract over a grain dataset of batches.

    inp = build_input(data_cfg, "train", tokenizer)     # or Input(dataset_of_batches, cfg, ...)
    batch = inp.get_next()        # dict of numpy arrays, batch leading; StopIteration at the end
    inp.reset()                   # back to the first batch (eval runs with reset_for_eval)
    state = inp.get_state()       # a small JSON-able dict (grain's iterator state) ...
    inp.set_state(state)          # ... so a resumed run continues with exactly the next batch
    inp.ids_to_strings(batch["ids"])   # decode rows with the input's tokenizer

Each host builds its own Input for its own shard (`shard`); see host_sharding.py.

Post-processing a batch (the seed's `MyInput`): subclass and override `get_next`, or, keeping
everything in grain (and so in the checkpointed iterator state), `inp.map(fn)`.
"""

from __future__ import annotations

import atexit
import copy
import weakref
from collections.abc import Callable
from typing import Any

import grain
import numpy as np
from jaxtyping import ArrayLike, Int

from pax_eqx.config import check_once
from pax_eqx.data.host_sharding import HostShard
from pax_eqx.data.input_config import InputConfig, Split
from pax_eqx.data.tokenizers import Tokenizer, decode_rows

Batch = dict[str, np.ndarray]


class Input:
    """One host's input for one split.

    Args:
      dataset: a grain dataset whose elements are batches (dicts of arrays, batch leading). A
        MapDataset is read through `to_iter_dataset` with `cfg.read_threads` threads.
      cfg: the split's InputConfig (batch size, workers, the eval table).
      split: "train" or "eval".
      shard: this host's shard (for reports; the dataset is already sharded).
      tokenizer: decodes ids in `ids_to_strings`; None for non-text inputs.
      num_batches_per_epoch: batches before StopIteration (finite inputs; None if repeating).
    """

    def __init__(
        self,
        dataset: grain.MapDataset | grain.IterDataset,
        cfg: InputConfig,
        *,
        split: Split = "train",
        shard: HostShard | None = None,
        tokenizer: Tokenizer | None = None,
        num_batches_per_epoch: int | None = None,
    ):
        check_once(cfg, split, lambda: cfg.validate(split))  # done already for a DataConfig's own inputs
        self.cfg = cfg
        self.split = split
        self.shard = shard if shard is not None else HostShard(count=1, index=0)
        self.tokenizer = tokenizer
        self.num_batches_per_epoch = num_batches_per_epoch
        self._source = dataset
        self.dataset = _to_iter_dataset(dataset, cfg)
        self._iterator: grain.DatasetIterator | None = None

    @property
    def iterator(self) -> grain.DatasetIterator:
        if self._iterator is None:
            self._iterator = iter(self.dataset)
            if self.cfg.num_workers > 0:
                _OPEN_WITH_WORKERS.add(self)
        return self._iterator

    def get_next(self) -> Batch:
        """The next batch; raises StopIteration at the end of a finite input."""
        batch = next(self.iterator)
        if self.cfg.num_workers > 0:
            # Workers hand over arrays in shared memory; copy them out so each block is released
            # as soon as the batch is (not at interpreter exit, where grain's cleanup is noisy).
            batch = _own_memory(batch)
        return batch

    def reset(self) -> None:
        """Restarts from the first batch (Pax calls this between eval runs, never on training data)."""
        self.close()

    def close(self) -> None:
        """Stops grain's worker processes and threads now (the next get_next starts over)."""
        if self._iterator is not None:
            self._iterator.close()
            self._iterator = None

    def get_state(self) -> dict[str, Any]:
        """grain's iterator state: a small JSON-serialisable dict; saved in every checkpoint."""
        return self.iterator.get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues exactly where the iterator that produced `state` was."""
        self.iterator.set_state(state)

    def ids_to_strings(
        self, ids: Int[ArrayLike, "*batch time"], lengths: Int[ArrayLike, " batch"] | None = None
    ) -> list[str]:
        """Decodes each row of ids [batch, time] (up to lengths[i] tokens) with this input's tokenizer."""
        if self.tokenizer is None:
            raise ValueError(f"this {self.split} input has no tokenizer, so its ids cannot be decoded.")
        return decode_rows(self.tokenizer, ids, lengths)

    def map(self, fn: Callable[[Batch], Batch]) -> Input:
        """A copy whose batches are `fn(batch)` (computed in grain, so state and workers still apply)."""
        new = copy.copy(self)
        new._source = self._source.map(fn)
        new.dataset = _to_iter_dataset(new._source, self.cfg)
        new._iterator = None
        return new

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        return self.get_next()

    def __repr__(self) -> str:
        epoch = "repeating" if self.num_batches_per_epoch is None else f"{self.num_batches_per_epoch} batches/epoch"
        return (
            f"{type(self).__name__}(split={self.split!r}, batch_size={self.cfg.batch_size}, "
            f"host {self.shard.index} of {self.shard.count}, {epoch})"
        )


def read_options(cfg: InputConfig) -> grain.ReadOptions:
    """grain's reading threads for a MapDataset: none by default (in-memory data is faster without)."""
    threads = cfg.read_threads
    return grain.ReadOptions(num_threads=threads, prefetch_buffer_size=4 * threads if threads else 1)


def _to_iter_dataset(dataset: grain.MapDataset | grain.IterDataset, cfg: InputConfig) -> grain.IterDataset:
    if isinstance(dataset, grain.MapDataset):
        dataset = dataset.to_iter_dataset(read_options(cfg))
    if cfg.num_workers > 0:
        _allow_workers_outside_absl()
        dataset = dataset.mp_prefetch(grain.MultiprocessingOptions(num_workers=cfg.num_workers))
    return dataset


def _own_memory(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _own_memory(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_own_memory(v) for v in tree)
    if isinstance(tree, np.ndarray) and type(tree) is not np.ndarray:
        return np.array(tree)
    return tree


_OPEN_WITH_WORKERS: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_worker_inputs() -> None:
    """Closes inputs with worker processes before the interpreter tears modules down (grain's
    own cleanup at that point prints tracebacks and leaks shared memory)."""
    for inp in list(_OPEN_WITH_WORKERS):
        inp.close()


def _allow_workers_outside_absl() -> None:
    """grain's worker processes read absl flags; a non-absl program must mark them parsed."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
