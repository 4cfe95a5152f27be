"""LM examples: the batch format the model consumes, and the two ways to cut text into rows.

Every LM example (and so every batch row) has five fields of length `seq_len`:

    ids          int32    input tokens
    labels       int32    next tokens (what the model predicts at each position)
    weights      float32  1 for a real prediction, 0 for padding (padded positions and rows)
    segment_ids  int32    1, 2, ... per document packed in the row; 0 = padding
    segment_pos  int32    position within its document (restarts at 0 in every segment)

Two layouts:

- "stream" (nanoGPT): all documents of a split, each followed by eos, form one token stream;
  a row is a window of seq_len + 1 consecutive tokens (ids = window[:-1], labels =
  window[1:]), one segment. Training windows start at `w * seq_len + shift`, with a shift in
  [0, seq_len) drawn per epoch from `input_random_seed`, so every epoch cuts the text
  differently while each host still reads disjoint windows. Eval windows cover the stream
  exactly once (the last one padded with weight 0), so an eval epoch predicts every token of
  the held-out text once.
- "packed" (Pax/T5): a document d becomes ids = [bos] + d, labels = d + [eos]; documents are
  concatenated into rows of seq_len and split at row ends by grain's ConcatThenSplit packer,
  which numbers the segments of a row and restarts positions in each; a document that
  continues in the next row becomes a new segment there. Attention must not cross segments
  (`segment_ids` go to the attention mask), and positions come from `segment_pos`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import grain
import numpy as np
from jaxtyping import Int

from pax_eqx.config import ConfigError
from pax_eqx.data.tokenizers import Tokenizer

FIELDS = ("ids", "labels", "weights", "segment_ids", "segment_pos")
Example = dict[str, np.ndarray]


def pad_example(seq_len: int) -> Example:
    """A padding row: pad ids (0), weight 0, segment 0."""
    zeros = np.zeros(seq_len, np.int32)
    return {
        "ids": zeros,
        "labels": zeros,
        "weights": np.zeros(seq_len, np.float32),
        "segment_ids": zeros,
        "segment_pos": zeros,
    }


def tokenize_stream(docs: Iterable[str], tokenizer: Tokenizer) -> Int[np.ndarray, " n"]:
    """Documents -> one int32 token stream, each document followed by eos."""
    encode = getattr(tokenizer, "encode_array", None)
    parts = []
    eos = np.asarray([tokenizer.eos_id], np.int32)
    for doc in docs:
        ids = encode(doc) if encode is not None else np.asarray(tokenizer.encode(doc), np.int32)
        parts += [ids.astype(np.int32), eos]
    if not parts:
        raise ConfigError("the text split is empty: no documents to tokenize.")
    return np.concatenate(parts)


class StreamWindows(grain.MapDataset):
    """Windows of a token stream as LM examples (the "stream" layout; see module doc).

    Index `epoch * len(self) + w` is window w of that epoch: grain's shuffle and slice pass the
    epoch in the index, which is how the per-epoch shift is known without any state.
    """

    def __init__(self, tokens: Int[np.ndarray, " n"], seq_len: int, *, shift_seed: int | None):
        super().__init__()
        self._tokens = np.array(tokens, np.int32)  # a private read-only copy: rows are views of it
        self._tokens.flags.writeable = False
        self._seq_len = seq_len
        self._shift_seed = shift_seed
        n = len(self._tokens)
        # Shared read-only fields of a full window (batching copies them into the batch).
        self._full = {
            "weights": np.ones(seq_len, np.float32),
            "segment_ids": np.ones(seq_len, np.int32),
            "segment_pos": np.arange(seq_len, dtype=np.int32),
        }
        for v in self._full.values():
            v.flags.writeable = False
        if shift_seed is None:  # eval: cover the n - 1 predictions exactly once
            self._num_windows = -(-(n - 1) // seq_len) if n > 1 else 0
        else:  # train: leave room for a shift of up to seq_len - 1
            self._num_windows = max(n // seq_len - 1, 0)
        if self._num_windows == 0:
            raise ConfigError(
                f"the text has {n} tokens, too few for one training window of data.seq_len={seq_len} + 1; "
                "use more text or a shorter data.seq_len."
            )

    def __len__(self) -> int:
        return self._num_windows

    def shift(self, epoch: int) -> int:
        """Where epoch `epoch`'s windows start (0 for eval)."""
        if self._shift_seed is None:
            return 0
        return _epoch_shift(self._shift_seed, epoch, self._seq_len)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        epoch, window = divmod(int(index), self._num_windows)
        start = window * self._seq_len + self.shift(epoch)
        chunk = self._tokens[start : start + self._seq_len + 1]
        s = self._seq_len
        if len(chunk) == s + 1:  # a full window (all but possibly the last eval window)
            return {
                "ids": chunk[:-1],
                "labels": chunk[1:],
                "weights": self._full["weights"],
                "segment_ids": self._full["segment_ids"],
                "segment_pos": self._full["segment_pos"],
            }
        real = len(chunk) - 1  # the last eval window: pad the missing predictions with weight 0
        mask = np.arange(s) < real
        return {
            "ids": np.pad(chunk[:-1], (0, s - real)),
            "labels": np.pad(chunk[1:], (0, s - real)),
            "weights": mask.astype(np.float32),
            "segment_ids": mask.astype(np.int32),
            "segment_pos": np.where(mask, np.arange(s, dtype=np.int32), 0).astype(np.int32),
        }

    def __str__(self) -> str:
        return f"StreamWindows(windows={self._num_windows}, seq_len={self._seq_len})"


@functools.lru_cache(maxsize=64)
def _epoch_shift(seed: int, epoch: int, seq_len: int) -> int:
    return int(np.random.default_rng([seed, epoch]).integers(seq_len))


def document_example(text: str, tokenizer: Tokenizer) -> Example:
    """One document before packing: ids = [bos] + tokens, labels = tokens + [eos]."""
    tokens = np.asarray(tokenizer.encode(text), np.int32)
    return {
        "ids": np.concatenate([[tokenizer.bos_id], tokens]).astype(np.int32),
        "labels": np.concatenate([tokens, [tokenizer.eos_id]]).astype(np.int32),
        "weights": np.ones(len(tokens) + 1, np.float32),
    }


def pack_documents(documents: grain.IterDataset, seq_len: int) -> grain.IterDataset:
    """Document examples -> packed rows of `seq_len` in the five-field format (module doc)."""
    packed = grain.experimental.ConcatThenSplitIterDataset(
        documents, length_struct={"ids": seq_len, "labels": seq_len, "weights": seq_len}
    )
    return packed.map(_packed_row)


def _packed_row(row: dict[str, Any]) -> Example:
    segment_ids = np.asarray(row["ids_segment_ids"], np.int32)
    return {
        "ids": np.asarray(row["ids"], np.int32),
        "labels": np.asarray(row["labels"], np.int32),
        "weights": np.asarray(row["weights"], np.float32) * (segment_ids > 0),
        "segment_ids": segment_ids,
        "segment_pos": np.asarray(row["ids_positions"], np.int32) * (segment_ids > 0),
    }


def synthetic_example(seq_len: int) -> Example:
    """Pax's SyntheticLmData row: ids = labels = 1, one segment, positions 0..seq_len-1."""
    ones = np.ones(seq_len, np.int32)
    return {
        "ids": ones,
        "labels": ones,
        "weights": np.ones(seq_len, np.float32),
        "segment_ids": ones,
        "segment_pos": np.arange(seq_len, dtype=np.int32),
    }


class RandomTokens(grain.MapDataset):
    """Example i: seq_len + 1 uniform tokens in [4, vocab_size) seeded by (seed, i); one segment.

    Deterministic per index, so host sharding, shuffling and resumption work as for real data.
    """

    def __init__(self, num_examples: int, seq_len: int, vocab_size: int, seed: int):
        super().__init__()
        if vocab_size <= 4:
            raise ConfigError(f"random tokens need a vocabulary larger than the 4 specials, got {vocab_size}.")
        self._n, self._seq_len, self._vocab, self._seed = num_examples, seq_len, vocab_size, seed

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        index = int(index) % self._n
        tokens = np.random.default_rng([self._seed, index]).integers(4, self._vocab, self._seq_len + 1, dtype=np.int32)
        return {
            "ids": tokens[:-1],
            "labels": tokens[1:],
            "weights": np.ones(self._seq_len, np.float32),
            "segment_ids": np.ones(self._seq_len, np.int32),
            "segment_pos": np.arange(self._seq_len, dtype=np.int32),
        }

    def __str__(self) -> str:
        return f"RandomTokens(n={self._n}, seq_len={self._seq_len}, vocab={self._vocab})"
