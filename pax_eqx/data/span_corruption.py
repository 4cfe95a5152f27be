"""T5's span-corruption objective (t5.data.preprocessors.span_corruption), in NumPy.

A window of raw tokens is split into alternating non-noise and noise spans (starting with
non-noise); each noise span becomes one sentinel in the inputs, and the targets are each
sentinel followed by the span it replaced:

    raw      To be, or not to be: that is the question
    inputs   To be, or <extra_id_0>be: that is <extra_id_1>      + eos
    targets  <extra_id_0>not to <extra_id_1>the question         + eos

The counts are fixed by the length alone (`noise_counts`, as T5's random_spans_noise_mask):

    num_noise_tokens = round(length * noise_density), clipped to [1, length - 1]
    num_noise_spans  = max(1, round(num_noise_tokens / mean_noise_span_length))

and the noise and non-noise tokens are each cut into `num_noise_spans` non-empty spans at
uniformly random places. Arithmetic is float32 with round-half-to-even, as T5's TensorFlow code.
Only the cut points are random: they are drawn from the `np.random.Generator` grain's
`random_map` hands each example (seeded by the example's index), so an example is a function
of (seed, index) and a restored iterator redraws exactly the same noise.

Sentinels: T5 appropriates the top ids of its vocabulary; our tokenizers have none to spare,
so sentinel i (the i-th noise span of an example, i = 0, 1, ...) is `tokenizer.vocab_size + i`
and the model's vocabulary must hold them (`required_vocab_size`). Text shows them as T5's
`<extra_id_i>` (`decode_with_sentinels`, `encode_with_sentinels`).

Lengths (`raw_length`, T5's random_spans_helper): the longest raw window whose inputs
(non-noise tokens + one sentinel per span + eos) fit in `seq_len`, and the targets length it
gives (noise tokens + one sentinel per span + eos). For seq_len 512 and T5's defaults: 568
raw tokens, targets of 114, as T5. Two deliberate differences from T5's helper: it counts with
the mask's own clipped float32 arithmetic, so the promised lengths always hold (T5's helper
rounds in float64 without clipping, which disagrees with its own mask for very short windows
and for some ties: at 190 raw tokens and density 0.15 the helper counts 28 noise tokens, the
mask 29, and T5's targets come out 2 tokens longer than its helper said); and it keeps the
longest window for noise_density 0.5 too (T5 shortens it by one there so that the targets are
not longer than the inputs). Where T5's code would fail (more noise spans than non-noise
tokens, possible only for a high density with short spans) the spans are capped at the
non-noise tokens.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from jaxtyping import ArrayLike, Bool, Int

from pax_eqx.config import Config, ConfigError, config
from pax_eqx.data.tokenizers import Tokenizer, largest_id

_SENTINEL = re.compile(r"<extra_id_(\d+)>")


@config
class SpanCorruptionConfig(Config):
    """T5's span corruption (layout "span_corruption").

    noise_density: the share of a window's tokens that are corrupted (T5: 0.15).
    mean_noise_span_length: the average length of a corrupted span (T5: 3.0).
    """

    noise_density: float = 0.15
    mean_noise_span_length: float = 3.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, where: str = "data.span_corruption") -> None:
        d, m = self.noise_density, self.mean_noise_span_length
        if not (math.isfinite(d) and 0.0 < d < 1.0):
            raise ConfigError(
                f"{where}.noise_density={d!r} must be in (0, 1): the share of tokens corrupted; T5 uses 0.15."
            )
        if not (math.isfinite(m) and m >= 1.0):
            raise ConfigError(
                f"{where}.mean_noise_span_length={m!r} must be a finite number >= 1 (tokens per corrupted span); "
                "T5 uses 3.0."
            )


def noise_counts(length: int, cfg: SpanCorruptionConfig) -> tuple[int, int]:
    """(num_noise_tokens, num_noise_spans) of a window of `length` tokens (module doc; T5's counts,
    computed on max(length, 2) as T5 does, with the spans capped at the non-noise tokens)."""
    length = max(int(length), 2)
    noise = int(np.round(np.float32(length) * np.float32(cfg.noise_density)))
    noise = min(max(noise, 1), length - 1)
    spans = int(np.round(np.float32(noise) / np.float32(cfg.mean_noise_span_length)))
    spans = min(max(spans, 1), length - noise)
    return noise, spans


def corrupted_lengths(length: int, cfg: SpanCorruptionConfig) -> tuple[int, int]:
    """(inputs, targets) lengths, eos included, of a corrupted window of `length` tokens."""
    noise, spans = noise_counts(length, cfg)
    if length < 2:  # T5 masks max(length, 2) tokens and keeps the first `length`: no noise at all
        return length + 1, spans + 1
    return length - noise + spans + 1, noise + spans + 1


def raw_length(cfg: SpanCorruptionConfig, seq_len: int) -> tuple[int, int]:
    """(raw_tokens, target_len): the longest window whose corrupted inputs (eos included) fit in
    `seq_len`, and the length of its targets (eos included). Both lengths grow with the window, so
    every shorter window (an eval split's last) fits too."""
    tokens = seq_len - 1  # fits: a window never gains tokens (spans <= noise tokens)
    while corrupted_lengths(tokens + 1, cfg)[0] <= seq_len:
        tokens += 1
    if tokens < 2:
        raise ConfigError(
            f"data.seq_len={seq_len} is too short for span corruption: a window needs 2 raw tokens, whose "
            f"inputs take {corrupted_lengths(2, cfg)[0]} (text, sentinel, eos); use data.seq_len >= "
            f"{corrupted_lengths(2, cfg)[0]}."
        )
    return tokens, corrupted_lengths(tokens, cfg)[1]


def num_sentinels(cfg: SpanCorruptionConfig, seq_len: int) -> int:
    """The most noise spans (so sentinels) an example with inputs of `seq_len` tokens can have."""
    return noise_counts(raw_length(cfg, seq_len)[0], cfg)[1]


def required_vocab_size(data_cfg: Any, tokenizer: Tokenizer) -> int:
    """The smallest model vocabulary for `data_cfg`'s batches: the tokenizer's, plus the ids its
    source adds (span corruption's sentinels; `DataSource.added_token_ids`), and at least its
    largest id + 1 (a tokenizer.json whose vocabulary skips ids)."""
    added = data_cfg.source.added_token_ids(data_cfg.seq_len)
    return max(tokenizer.vocab_size + added, largest_id(tokenizer) + 1)


def _random_segmentation(num_items: int, num_segments: int, rng: np.random.Generator) -> np.ndarray:
    """`num_items` items cut into `num_segments` non-empty segments at uniformly random places:
    the segments' lengths (T5's _random_segmentation)."""
    first_in_segment = np.zeros(num_items, np.int64)
    first_in_segment[1:] = rng.permutation(np.arange(num_items - 1) < num_segments - 1)
    return np.bincount(np.cumsum(first_in_segment), minlength=num_segments)


def random_spans_noise_mask(
    length: int, cfg: SpanCorruptionConfig, rng: np.random.Generator
) -> Bool[np.ndarray, " length"]:
    """T5's random_spans_noise_mask: True at noise tokens; spans alternate non-noise / noise,
    starting with non-noise (so the mask ends with noise for length >= 2)."""
    full = max(length, 2)
    noise, spans = noise_counts(full, cfg)
    noise_lengths = _random_segmentation(noise, spans, rng)
    nonnoise_lengths = _random_segmentation(full - noise, spans, rng)
    interleaved = np.stack([nonnoise_lengths, noise_lengths], axis=1).reshape(-1)
    is_noise = np.arange(2 * spans) % 2 == 1
    return np.repeat(is_noise, interleaved)[:length]


def noise_span_to_unique_sentinel(
    tokens: Sequence[int] | Int[ArrayLike, " n"],
    noise_mask: Sequence[bool] | Bool[ArrayLike, " n"],
    first_sentinel: int,
) -> Int[np.ndarray, " m"]:
    """Each run of noise tokens replaced by one sentinel: first_sentinel, first_sentinel + 1, ..."""
    tokens = np.asarray(tokens, np.int32)
    mask = np.asarray(noise_mask, bool)
    previous = np.concatenate([[False], mask[:-1]])
    first = mask & ~previous
    sentinels = first_sentinel - 1 + np.cumsum(first)
    out = np.where(first, sentinels, tokens)
    return out[~(mask & previous)].astype(np.int32)


def nonnoise_span_to_unique_sentinel(
    tokens: Sequence[int] | Int[ArrayLike, " n"],
    noise_mask: Sequence[bool] | Bool[ArrayLike, " n"],
    first_sentinel: int,
) -> Int[np.ndarray, " m"]:
    """Each run of non-noise tokens replaced by one sentinel (the targets of span corruption)."""
    return noise_span_to_unique_sentinel(tokens, ~np.asarray(noise_mask, bool), first_sentinel)


def corrupt(
    tokens: Sequence[int] | Int[ArrayLike, " n"],
    cfg: SpanCorruptionConfig,
    rng: np.random.Generator,
    first_sentinel: int,
) -> tuple[Int[np.ndarray, " i"], Int[np.ndarray, " t"]]:
    """(inputs, targets) of one window, without eos: non-noise tokens with a sentinel per noise
    span, and each sentinel followed by its span."""
    tokens = np.asarray(tokens, np.int32)
    mask = random_spans_noise_mask(len(tokens), cfg, rng)
    inputs = noise_span_to_unique_sentinel(tokens, mask, first_sentinel)
    targets = nonnoise_span_to_unique_sentinel(tokens, mask, first_sentinel)
    return inputs, targets


def decode_with_sentinels(tokenizer: Tokenizer, ids: Iterable[int] | Int[ArrayLike, " time"]) -> str:
    """Text of `ids` with `<extra_id_i>` where sentinel i (`tokenizer.vocab_size + i`) is; stops
    at eos; pad, bos and the other specials are dropped."""
    parts: list[str] = []
    run: list[int] = []
    for i in np.asarray(ids).reshape(-1).tolist():
        if i == tokenizer.eos_id:
            break
        if i >= tokenizer.vocab_size:
            parts.append(tokenizer.decode(run))
            parts.append(f"<extra_id_{i - tokenizer.vocab_size}>")
            run = []
        elif i >= 0:
            run.append(i)
    parts.append(tokenizer.decode(run))
    return "".join(parts)


def encode_with_sentinels(tokenizer: Tokenizer, text: str) -> list[int]:
    """`tokenizer.encode(text)` with every `<extra_id_N>` marker as sentinel N
    (`tokenizer.vocab_size + N`): a prompt for a span-corruption model."""
    ids: list[int] = []
    pieces = _SENTINEL.split(text)
    for k, piece in enumerate(pieces):
        if k % 2:
            ids.append(tokenizer.vocab_size + int(piece))
        elif piece:
            ids.extend(tokenizer.encode(piece))
    return ids
