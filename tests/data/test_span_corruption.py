"""T5's span corruption: the noise mask's counts and shape, the sentinel encoding, the lengths
promised by random_spans_helper, and the text form with <extra_id_N> markers."""

import itertools
import math

import numpy as np
import pytest

from pax_eqx.config import ConfigError
from pax_eqx.data import (
    ByteTokenizer,
    DataConfig,
    Seq2SeqJsonlSource,
    ShakespeareSource,
    SpanCorruptionConfig,
    decode_with_sentinels,
    encode_with_sentinels,
    num_sentinels,
    raw_length,
    required_vocab_size,
)
from pax_eqx.data.span_corruption import corrupt, random_spans_noise_mask
from pax_eqx.data.tokenizers import SentencePieceConfig, SentencePieceTokenizer, train_sentencepiece

CONFIGS = [
    SpanCorruptionConfig(),  # T5's 0.15, 3.0
    SpanCorruptionConfig(noise_density=0.3, mean_noise_span_length=2.5),
    SpanCorruptionConfig(noise_density=0.5, mean_noise_span_length=1.0),
    SpanCorruptionConfig(noise_density=0.05, mean_noise_span_length=8.0),
]


def t5_counts(length: int, density: float, mean_span: float) -> tuple[int, int]:
    """T5's random_spans_noise_mask counts, written out: TensorFlow float32, round half to even."""
    length = max(length, 2)
    noise = round(float(np.float32(length) * np.float32(density)))  # Python's round: half to even
    noise = min(max(noise, 1), length - 1)
    spans = max(round(float(np.float32(noise) / np.float32(mean_span))), 1)
    return noise, min(spans, length - noise)  # (the cap only where T5 itself would fail)


def runs(mask: np.ndarray) -> list[tuple[bool, int]]:
    return [(bool(k), len(list(g))) for k, g in itertools.groupby(mask.tolist())]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.noise_density}-{c.mean_noise_span_length}")
def test_noise_mask_has_t5s_counts_and_alternation(cfg):
    for length, seed in itertools.product([*range(1, 120), 255, 568, 1001], range(3)):
        mask = random_spans_noise_mask(length, cfg, np.random.default_rng([seed, length]))
        assert mask.shape == (length,) and mask.dtype == bool
        spans = runs(mask)
        assert not spans[0][0]  # starts with non-noise
        if length < 2:
            continue  # T5 masks 2 tokens and keeps the first: no noise
        noise, num_spans = t5_counts(length, cfg.noise_density, cfg.mean_noise_span_length)
        assert int(mask.sum()) == noise, (length, seed)
        assert [k for k, _ in spans] == [False, True] * num_spans, (length, seed)  # ends with noise


def test_every_segmentation_is_equally_likely():
    # length 12, density 0.5, mean span 2: 6 noise tokens in 3 spans, 6 others in 3 spans:
    # C(5, 2) ** 2 = 100 masks, each drawn with probability 1 / 100.
    cfg = SpanCorruptionConfig(noise_density=0.5, mean_noise_span_length=2.0)
    rng = np.random.default_rng(0)
    counts: dict[bytes, int] = {}
    n = 6000
    for _ in range(n):
        key = random_spans_noise_mask(12, cfg, rng).tobytes()
        counts[key] = counts.get(key, 0) + 1
    assert len(counts) == 100
    expected = n / 100
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 160  # 99 degrees of freedom: p < 1e-4 above 160


def reassemble(inputs: np.ndarray, targets: np.ndarray, first_sentinel: int) -> list[int]:
    """T5's pair back to the window: each sentinel of the inputs replaced by what follows the same
    sentinel in the targets (up to the next sentinel)."""
    spans, current = {}, None
    for t in targets.tolist():
        if t >= first_sentinel:
            current = t
            spans[current] = []
        else:
            spans[current].append(t)
    out = []
    for t in inputs.tolist():
        out.extend(spans[t] if t >= first_sentinel else [t])
    return out


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.noise_density}-{c.mean_noise_span_length}")
def test_inputs_and_targets_reassemble_the_window(cfg):
    first = 1000
    for length, seed in itertools.product([2, 3, 5, 10, 31, 64, 190, 568], range(4)):
        window = np.random.default_rng([seed, 1]).integers(4, 260, length).astype(np.int32)
        inputs, targets = corrupt(window, cfg, np.random.default_rng([seed, length]), first)
        noise, spans = t5_counts(length, cfg.noise_density, cfg.mean_noise_span_length)
        # inputs: non-noise tokens, one sentinel per noise span, numbered in order
        sentinels = list(range(first, first + spans))
        assert [t for t in inputs.tolist() if t >= first] == sentinels
        assert [t for t in targets.tolist() if t >= first] == sentinels
        assert targets[0] == first  # targets start with sentinel 0 (the mask starts with non-noise)
        assert len(inputs) == length - noise + spans and len(targets) == noise + spans
        assert reassemble(inputs, targets, first) == window.tolist()


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.noise_density}-{c.mean_noise_span_length}")
def test_raw_length_fits_the_inputs_exactly_and_is_the_longest(cfg):
    eos = 1  # the examples append one eos to the inputs and to the targets
    for seq_len in [3, 4, 5, 7, 12, 33, 64, 100, 129, 200, 256, 512]:
        raw, target_len = raw_length(cfg, seq_len)
        rng = np.random.default_rng(seq_len)
        inputs, targets = corrupt(np.arange(raw) + 4, cfg, rng, 10_000)
        assert len(inputs) + eos <= seq_len
        assert len(targets) + eos == target_len
        longer, _ = corrupt(np.arange(raw + 1) + 4, cfg, rng, 10_000)
        assert len(longer) + eos > seq_len  # the next window would not fit: this one is the longest
        for shorter in [*range(1, raw, max(1, raw // 30)), raw - 1]:  # an eval split's last window is shorter: fits too
            i, t = corrupt(np.arange(shorter) + 4, cfg, rng, 10_000)
            assert len(i) + eos <= seq_len and len(t) + eos <= target_len
        n, s = t5_counts(raw, cfg.noise_density, cfg.mean_noise_span_length)
        assert num_sentinels(cfg, seq_len) == s


def test_raw_length_matches_t5_for_its_sequence_lengths():
    def t5_helper(inputs_length, density=0.15, mean=3.0):  # random_spans_helper, written out
        def lengths(tokens):
            noise = int(round(tokens * density))
            spans = int(round(noise / mean))
            return tokens - noise + spans + 1, noise + spans + 1

        tokens = inputs_length - 1
        while lengths(tokens + 1)[0] <= inputs_length:
            tokens += 1
        return tokens, lengths(tokens)[1]

    assert raw_length(SpanCorruptionConfig(), 512) == (568, 114)  # T5's C4 span corruption
    for seq_len in (64, 128, 256, 512, 1024, 2048):
        assert raw_length(SpanCorruptionConfig(), seq_len) == t5_helper(seq_len)


def test_sentinels_extend_the_vocabulary():
    tok = ByteTokenizer()
    data = DataConfig(source=ShakespeareSource(layout="span_corruption"), seq_len=512)
    assert num_sentinels(SpanCorruptionConfig(), 512) == 28  # round(85 / 3)
    assert required_vocab_size(data, tok) == 260 + 28
    assert required_vocab_size(DataConfig(), tok) == 260  # an LM: no sentinels
    assert required_vocab_size(DataConfig(source=Seq2SeqJsonlSource(path="x.jsonl")), tok) == 260


def test_text_with_sentinel_markers_round_trips():
    tok = ByteTokenizer()
    text = "To be <extra_id_0> not to be<extra_id_1>: that is <extra_id_12>"
    ids = encode_with_sentinels(tok, text)
    assert [i - 260 for i in ids if i >= 260] == [0, 1, 12]
    assert ids[:6] == tok.encode("To be ") and ids[6] == 260
    assert decode_with_sentinels(tok, ids) == text
    # pads and bos are dropped, decoding stops at eos
    row = np.array([tok.bos_id, *ids, tok.eos_id, *tok.encode("after eos"), 0, 0])
    assert decode_with_sentinels(tok, row) == text
    assert decode_with_sentinels(tok, [0, 0]) == ""


def test_sentinel_markers_with_sentencepiece():
    lines = ["to be or not to be that is the question", "whether tis nobler in the mind to suffer"] * 20
    tok = SentencePieceTokenizer(train_sentencepiece(lines, SentencePieceConfig(vocab_size=30)))
    text = "to be <extra_id_0> not<extra_id_1> the mind"
    ids = encode_with_sentinels(tok, text)
    assert [i - tok.vocab_size for i in ids if i >= tok.vocab_size] == [0, 1]
    assert decode_with_sentinels(tok, ids) == text  # sentinel ids never reach SentencePiece


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"noise_density": 0.0}, "noise_density"),
        ({"noise_density": 1.0}, "noise_density"),
        ({"noise_density": math.nan}, "noise_density"),
        ({"mean_noise_span_length": 0.5}, "mean_noise_span_length"),
        ({"mean_noise_span_length": math.inf}, "mean_noise_span_length"),
    ],
)
def test_bad_span_corruption_config_names_the_field(kw, field):
    value = next(iter(kw.values()))
    with pytest.raises(ConfigError, match=rf"data\.span_corruption\.{field}={value!r}"):
        DataConfig(source=ShakespeareSource(layout="span_corruption", span_corruption=SpanCorruptionConfig(**kw)))


def test_too_short_seq_len_for_span_corruption_names_the_minimum():
    with pytest.raises(ConfigError, match=r"data\.seq_len=2 is too short .*data\.seq_len >= 3"):
        DataConfig(source=ShakespeareSource(layout="span_corruption"), seq_len=2).validate(files=False)
    assert raw_length(SpanCorruptionConfig(), 3) == (2, 3)


def test_the_worked_example_of_docs_data_md():
    tok, cfg = ByteTokenizer(), SpanCorruptionConfig()
    assert raw_length(cfg, 64) == (70, 14)
    window = "HAMLET: To be, or not to be, that is the question: Whether 'tis nobler"
    inputs = "HAMLET: To be, or not to be, that is the <extra_id_0>: Whether 't<extra_id_1>s noble<extra_id_2>"
    targets = "<extra_id_0>question<extra_id_1>i<extra_id_2>r"
    inputs_ids, targets_ids = encode_with_sentinels(tok, inputs), encode_with_sentinels(tok, targets)
    assert len(tok.encode(window)) == 70 and len(inputs_ids) + 1 == 64 and len(targets_ids) + 1 == 14
    assert reassemble(np.array(inputs_ids), np.array(targets_ids), 260) == tok.encode(window)
    assert required_vocab_size(DataConfig(source=ShakespeareSource(layout="span_corruption")), tok) == 263
    # the draw shown (numpy's Generator stream; regenerate the docs' example if numpy changes it)
    got_inputs, got_targets = corrupt(tok.encode(window), cfg, np.random.default_rng(2), 260)
    assert (got_inputs.tolist(), got_targets.tolist()) == (inputs_ids, targets_ids)
