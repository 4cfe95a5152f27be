"""Sequence-to-sequence examples: the batch format of an encoder-decoder, and two ways to make it.

Every seq2seq example (so every batch row) has five fields:

    inputs           int32    [seq_len]         encoder tokens, ending with eos, then pad (0)
    input_paddings   float32  [seq_len]         1.0 at padding
    target_ids       int32    [target_seq_len]  decoder inputs: [bos] + targets[:-1], then pad
    targets          int32    [target_seq_len]  what the decoder predicts, ending with eos, then pad
    target_paddings  float32  [target_seq_len]  1.0 at padding (the loss weight is 1 - paddings)

A padding example (eval epochs padded to end together on every host) is all pad with paddings
1.0, so it weighs nothing.

- pairs (source "seq2seq_jsonl"): (inputs text, targets text) tokenized, each truncated to
  leave room for eos, padded (`seq2seq_example`).
- span corruption (layout "span_corruption", span_corruption.py): windows of `raw_tokens`
  consecutive tokens of a split's token stream, corrupted by a grain `random_map`. Training
  windows start at `k * raw_tokens + shift` with a shift drawn per epoch (as the LM "stream"
  layout), and the noise of window k in epoch e is seeded by (seed, e * windows + k): every
  epoch cuts and corrupts the text anew, and a restored iterator redraws exactly the same
  examples. Eval windows cover the stream once (the last may be shorter) with noise seeded by
  the window's index: the same examples in every eval run and on every host.
"""

from __future__ import annotations

from collections.abc import Sequence

import grain
import numpy as np
from jaxtyping import ArrayLike, Int

from pax_eqx.config import ConfigError
from pax_eqx.data import lm_examples, span_corruption
from pax_eqx.data.host_sharding import HostShard, batch_host_examples
from pax_eqx.data.input import Input
from pax_eqx.data.input_config import InputConfig, Split
from pax_eqx.data.span_corruption import SpanCorruptionConfig
from pax_eqx.data.tokenizers import PAD_ID, Tokenizer

FIELDS = ("inputs", "input_paddings", "target_ids", "targets", "target_paddings")
Example = dict[str, np.ndarray]


def pad_example(seq_len: int, target_seq_len: int) -> Example:
    """A padding row: pad ids (0), paddings 1.0."""
    return {
        "inputs": np.zeros(seq_len, np.int32),
        "input_paddings": np.ones(seq_len, np.float32),
        "target_ids": np.zeros(target_seq_len, np.int32),
        "targets": np.zeros(target_seq_len, np.int32),
        "target_paddings": np.ones(target_seq_len, np.float32),
    }


def _padded(ids: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    out = np.full(length, PAD_ID, np.int32)
    out[: len(ids)] = ids
    return out, (np.arange(length) >= len(ids)).astype(np.float32)


def seq2seq_example(
    inputs: Sequence[int] | Int[ArrayLike, " n"],
    targets: Sequence[int] | Int[ArrayLike, " m"],
    seq_len: int,
    target_seq_len: int,
    *,
    bos_id: int,
    eos_id: int,
) -> Example:
    """One example from token ids without eos: each truncated to leave room for eos, eos
    appended, padded; `target_ids` = [bos] + targets[:-1] over the real targets."""
    src = np.concatenate([np.asarray(inputs, np.int32)[: seq_len - 1], [eos_id]]).astype(np.int32)
    tgt = np.concatenate([np.asarray(targets, np.int32)[: target_seq_len - 1], [eos_id]]).astype(np.int32)
    shifted = np.concatenate([[bos_id], tgt[:-1]]).astype(np.int32)
    inputs_row, input_paddings = _padded(src, seq_len)
    targets_row, target_paddings = _padded(tgt, target_seq_len)
    return {
        "inputs": inputs_row,
        "input_paddings": input_paddings,
        "target_ids": _padded(shifted, target_seq_len)[0],
        "targets": targets_row,
        "target_paddings": target_paddings,
    }


def pair_examples(pairs: grain.MapDataset, tokenizer: Tokenizer, seq_len: int, target_seq_len: int) -> grain.MapDataset:
    """(inputs text, targets text) records -> examples, tokenized lazily (as grain reads them)."""
    bos, eos = tokenizer.bos_id, tokenizer.eos_id

    def make(pair: Sequence[str]) -> Example:
        source, target = pair
        return seq2seq_example(
            tokenizer.encode(source), tokenizer.encode(target), seq_len, target_seq_len, bos_id=bos, eos_id=eos
        )

    return pairs.map(make)


class TokenWindows(grain.MapDataset):
    """Windows of `length` consecutive tokens of a stream (int32 arrays).

    Training (`shift_seed` set): index `epoch * len(self) + w` is the window starting at
    `w * length + shift(epoch)`, a shift in [0, length) drawn per epoch as lm_examples'
    StreamWindows does (grain's shuffle and slice pass the epoch in the index). Eval
    (`shift_seed=None`): the windows cover the stream exactly once; the last may be shorter.
    """

    def __init__(self, tokens: Int[np.ndarray, " n"], length: int, *, shift_seed: int | None):
        super().__init__()
        self._tokens = np.array(tokens, np.int32)
        self._tokens.flags.writeable = False
        self._length = length
        self._shift_seed = shift_seed
        n = len(self._tokens)
        if shift_seed is None:
            self._num_windows = -(-n // length)
        else:
            self._num_windows = max(n // length - 1, 0)
        if self._num_windows == 0:
            raise ConfigError(
                f"the text has {n} tokens, too few for one training window of {length} tokens (span corruption "
                "of data.seq_len); use more text or a shorter data.seq_len."
            )

    def __len__(self) -> int:
        return self._num_windows

    def shift(self, epoch: int) -> int:
        if self._shift_seed is None:
            return 0
        return lm_examples._epoch_shift(self._shift_seed, epoch, self._length)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        epoch, window = divmod(int(index), self._num_windows)
        start = window * self._length + self.shift(epoch)
        return self._tokens[start : start + self._length]

    def __str__(self) -> str:
        return f"TokenWindows(windows={self._num_windows}, length={self._length})"


class SpanCorrupt(grain.transforms.RandomMap):
    """A window of tokens -> a span-corrupted seq2seq example (sentinels from `first_sentinel`)."""

    def __init__(
        self,
        cfg: SpanCorruptionConfig,
        seq_len: int,
        target_seq_len: int,
        *,
        first_sentinel: int,
        bos_id: int,
        eos_id: int,
    ):
        self.cfg = cfg
        self.seq_len, self.target_seq_len = seq_len, target_seq_len
        self.first_sentinel, self.bos_id, self.eos_id = first_sentinel, bos_id, eos_id

    def random_map(self, window: np.ndarray, rng: np.random.Generator) -> Example:
        inputs, targets = span_corruption.corrupt(window, self.cfg, rng, self.first_sentinel)
        return seq2seq_example(
            inputs, targets, self.seq_len, self.target_seq_len, bos_id=self.bos_id, eos_id=self.eos_id
        )


def span_corruption_examples(
    tokens: Int[np.ndarray, " n"],
    cfg: SpanCorruptionConfig,
    seq_len: int,
    target_seq_len: int,
    tokenizer: Tokenizer,
    *,
    seed: int,
    train: bool,
) -> grain.MapDataset:
    """A split's token stream -> span-corrupted examples (module doc). Document eos separators
    are dropped first: T5 concatenates documents without one, and eos ends the inputs and
    targets, so it must not occur inside them."""
    raw_tokens, needed = span_corruption.raw_length(cfg, seq_len)
    if target_seq_len < needed:
        raise ConfigError(
            f"data.target_seq_len={target_seq_len} is too short for span corruption with data.seq_len={seq_len}: "
            f"the targets take up to {needed} tokens; use >= {needed}, or 0 for exactly that."
        )
    tokens = np.asarray(tokens, np.int32)
    tokens = tokens[tokens != tokenizer.eos_id]
    windows = TokenWindows(tokens, raw_tokens, shift_seed=seed if train else None)
    corrupt = SpanCorrupt(
        cfg,
        seq_len,
        target_seq_len,
        first_sentinel=tokenizer.vocab_size,
        bos_id=tokenizer.bos_id,
        eos_id=tokenizer.eos_id,
    )
    # The noise has its own seed (not the shuffle's or the shift's), the same on every host.
    noise_seed = int(np.random.SeedSequence([seed, 0x5C]).generate_state(1)[0])
    return windows.random_map(corrupt, seed=noise_seed)


class Seq2SeqInput(Input):
    """An Input of seq2seq batches: `ids_to_strings` shows sentinels as `<extra_id_i>` and stops
    at eos (`decode_with_sentinels`)."""

    def ids_to_strings(
        self, ids: Int[ArrayLike, "*batch time"], lengths: Int[ArrayLike, " batch"] | None = None
    ) -> list[str]:
        if self.tokenizer is None:
            raise ValueError(f"this {self.split} input has no tokenizer, so its ids cannot be decoded.")
        rows = np.asarray(ids)
        rows = rows[None] if rows.ndim == 1 else rows
        out = []
        for i, row in enumerate(rows):
            n = len(row) if lengths is None else int(np.asarray(lengths)[i])
            out.append(span_corruption.decode_with_sentinels(self.tokenizer, row[:n]))
        return out


def seq2seq_input(
    examples: grain.MapDataset,
    cfg: InputConfig,
    split: Split,
    shard: HostShard,
    tokenizer: Tokenizer,
    seq_len: int,
    target_seq_len: int,
) -> Seq2SeqInput:
    """This host's Input over seq2seq `examples`: sharded, shuffled and padded (weight 0) like
    every source, batched."""
    batches, per_epoch = batch_host_examples(examples, cfg, shard, pad_example(seq_len, target_seq_len))
    return Seq2SeqInput(batches, cfg, split=split, shard=shard, tokenizer=tokenizer, num_batches_per_epoch=per_epoch)
