"""Seq2seq inputs: the batch format, span-corrupted text (deterministic eval epochs that cover the
stream once, resumable training), JSON-lines pairs, and the fields refused where they do nothing."""

import json
import re

import numpy as np
import pytest

from pax_eqx.config import ConfigError
from pax_eqx.data import (
    SEQ2SEQ_FIELDS,
    ByteTokenizer,
    DataConfig,
    InputConfig,
    JsonlSource,
    Seq2SeqJsonlSource,
    ShakespeareSource,
    SpanCorruptionConfig,
    SyntheticSource,
    TextFilesSource,
    build_input,
    build_tokenizer,
    is_seq2seq,
    raw_length,
    seq2seq_example,
    seq2seq_pad_example,
    target_length,
)
from pax_eqx.data.file_readers import split_text_tail
from pax_eqx.data.lm_examples import tokenize_stream
from pax_eqx.data.tokenizers import SentencePieceConfig
from pax_eqx.experiment import ExperimentConfig

TOK = ByteTokenizer()
EVAL = InputConfig(batch_size=4, shuffle=False, repeat=False, reset_for_eval=True)


def test_example_format_truncates_appends_eos_pads_and_shifts():
    ex = seq2seq_example([10, 11, 12], [20, 21], seq_len=6, target_seq_len=4, bos_id=2, eos_id=3)
    assert sorted(ex) == sorted(SEQ2SEQ_FIELDS)
    np.testing.assert_array_equal(ex["inputs"], [10, 11, 12, 3, 0, 0])
    np.testing.assert_array_equal(ex["input_paddings"], [0, 0, 0, 0, 1, 1])
    np.testing.assert_array_equal(ex["targets"], [20, 21, 3, 0])
    np.testing.assert_array_equal(ex["target_ids"], [2, 20, 21, 0])
    np.testing.assert_array_equal(ex["target_paddings"], [0, 0, 0, 1])
    assert [ex[k].dtype for k in SEQ2SEQ_FIELDS] == [np.int32, np.float32, np.int32, np.int32, np.float32]
    long = seq2seq_example(range(10, 20), range(20, 30), seq_len=4, target_seq_len=3, bos_id=2, eos_id=3)
    np.testing.assert_array_equal(long["inputs"], [10, 11, 12, 3])  # truncated, eos kept
    np.testing.assert_array_equal(long["targets"], [20, 21, 3])
    np.testing.assert_array_equal(long["target_ids"], [2, 20, 21])
    assert long["input_paddings"].sum() == long["target_paddings"].sum() == 0
    pad = seq2seq_pad_example(6, 4)
    assert all(pad[k].shape == ex[k].shape and pad[k].dtype == ex[k].dtype for k in SEQ2SEQ_FIELDS)
    assert pad["input_paddings"].all() and pad["target_paddings"].all() and not pad["inputs"].any()


# Text that never repeats itself (so equal examples mean equal windows and noise): random words.
_LETTERS = np.random.default_rng(0).integers(97, 123, 4000)
TEXT = "".join(chr(c) if i % 6 else ("\n" if i % 60 == 0 else " ") for i, c in enumerate(_LETTERS))


def span_data(tmp_path, **source_kw) -> DataConfig:
    """`source_kw`: fields of the text_files source (target_seq_len)."""
    path = tmp_path / "text.txt"
    path.write_text(TEXT)
    return DataConfig(
        source=TextFilesSource(path=str(path), layout="span_corruption", **source_kw),
        seq_len=24,
        train=InputConfig(batch_size=3, input_random_seed=5),
        eval=EVAL,
    )


def reassemble(row) -> list[int]:
    """The raw window of one example: the sentinels of its inputs replaced by their spans in the targets."""
    spans, current = {}, None
    for t in row["targets"].tolist():
        if t == TOK.eos_id:
            break
        if t >= TOK.vocab_size:
            current = spans.setdefault(t, [])
        else:
            current.append(t)
    out = []
    for t in row["inputs"].tolist():
        if t == TOK.eos_id:
            break
        out.extend(spans[t] if t >= TOK.vocab_size else [t])
    return out


def rows(batches):
    for b in batches:
        for i in range(len(b["inputs"])):
            yield {k: v[i] for k, v in b.items()}


def test_span_corruption_batches_are_corrupted_windows_of_the_text(tmp_path):
    data = span_data(tmp_path)
    data.validate()
    raw, derived = raw_length(SpanCorruptionConfig(), 24)
    assert is_seq2seq(data) and target_length(data) == derived == 6  # 26 raw tokens: 4 noise in 1 span + eos
    inp = build_input(data, "train", TOK, 1, 0)
    batch = inp.get_next()
    assert sorted(batch) == sorted(SEQ2SEQ_FIELDS)
    assert batch["inputs"].shape == batch["input_paddings"].shape == (3, 24)
    assert batch["targets"].shape == batch["target_ids"].shape == batch["target_paddings"].shape == (3, 6)
    for row in rows([batch]):
        window = reassemble(row)
        assert len(window) == raw and TOK.decode(window) in TEXT  # raw consecutive tokens of the text
        real = int((row["target_paddings"] == 0).sum())
        np.testing.assert_array_equal(row["target_ids"][:real], [TOK.bos_id, *row["targets"][: real - 1]])
        assert row["targets"][real - 1] == TOK.eos_id and not row["target_ids"][real:].any()
        assert row["inputs"][int((row["input_paddings"] == 0).sum()) - 1] == TOK.eos_id
    decoded = inp.ids_to_strings(batch["inputs"])  # sentinels shown as T5 markers
    assert all("<extra_id_0>" in text for text in decoded)


def test_span_corruption_eval_epoch_is_deterministic_and_covers_the_stream_once(tmp_path):
    data = span_data(tmp_path)
    first = list(build_input(data, "eval", TOK, 1, 0))
    again = build_input(data, "eval", TOK, 1, 0)
    second = list(again)
    again.reset()
    third = list(again)  # the next eval run of the same input
    assert len(first) == len(second) == len(third) > 1
    for a, b, c in zip(first, second, third):
        for k in SEQ2SEQ_FIELDS:
            np.testing.assert_array_equal(a[k], b[k])
            np.testing.assert_array_equal(a[k], c[k])
    # The epoch's windows, in order, are the held-out stream (eos separators dropped), once.
    held_out = split_text_tail(TEXT, data.source.eval_fraction)[1]
    expected = [t for t in tokenize_stream([held_out], TOK).tolist() if t != TOK.eos_id]
    real = [row for row in rows(first) if not row["input_paddings"].all()]
    assert sum(len(reassemble(row)) for row in real) == len(expected)
    assert [t for row in real for t in reassemble(row)] == expected
    padding = [row for row in rows(first) if row["input_paddings"].all()]
    assert all(row["target_paddings"].all() and not row["targets"].any() for row in padding)
    # Two hosts: host h gets windows h, h + 2, ..., corrupted exactly as on one host.
    for host in (0, 1):
        mine = [row for row in rows(build_input(data, "eval", TOK, 2, host)) if not row["input_paddings"].all()]
        assert len(mine) == len(real[host::2])
        for got, want in zip(mine, real[host::2]):
            np.testing.assert_array_equal(got["inputs"], want["inputs"])
            np.testing.assert_array_equal(got["targets"], want["targets"])


def test_span_corruption_training_resumes_exactly_and_changes_per_epoch(tmp_path):
    data = span_data(tmp_path)
    reference = build_input(data, "train", TOK, 2, 1)
    for _ in range(3):
        reference.get_next()
    state = json.loads(json.dumps(reference.get_state()))  # what a checkpoint stores
    expected = [reference.get_next() for _ in range(30)]  # several epochs of this small text
    resumed = build_input(data, "train", TOK, 2, 1)
    resumed.set_state(state)
    for want in expected:
        got = resumed.get_next()
        for k in SEQ2SEQ_FIELDS:
            np.testing.assert_array_equal(got[k], want[k])
    # Epochs cut and corrupt the text anew: no example repeats across epochs.
    seen = {row["inputs"].tobytes() for row in rows(expected)}
    assert len(seen) == 3 * len(expected)


def write_pairs(path, n):
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"question": f"what is {i} + {i}?", "answer": f"{2 * i}", "id": i}) + "\n")


def pair_data(tmp_path, **source_kw) -> DataConfig:
    """`source_kw`: fields of the seq2seq_jsonl source (target_seq_len, jsonl_targets_key)."""
    write_pairs(tmp_path / "qa.jsonl", 20)
    fields = dict(jsonl_inputs_key="question", jsonl_targets_key="answer", eval_fraction=0.25)
    return DataConfig(
        source=Seq2SeqJsonlSource(path=str(tmp_path / "qa.jsonl"), **{**fields, **source_kw}), seq_len=16, eval=EVAL
    )


def test_seq2seq_jsonl_round_trip(tmp_path):
    data = pair_data(tmp_path, target_seq_len=5)
    data.validate()
    assert is_seq2seq(data) and target_length(data) == 5
    assert target_length(data.replace(source=data.source.replace(target_seq_len=0))) == 16  # 0 = data.seq_len
    inp = build_input(data, "eval", TOK, 1, 0)
    batches = list(inp)
    assert inp.num_batches_per_epoch == len(batches) == 2  # records 3, 7, 11, 15, 19 + 3 padding rows
    real = [row for row in rows(batches) if not row["input_paddings"].all()]
    assert [inp.ids_to_strings(r["inputs"])[0] for r in real] == [
        f"what is {i} + {i}?"[:15] for i in (3, 7, 11, 15, 19)
    ]
    assert [inp.ids_to_strings(r["targets"])[0] for r in real] == ["6", "14", "22", "30", "38"]
    # "what is 15 + 15?" has 16 characters: truncated to 15, then eos
    assert TOK.decode(real[3]["inputs"]) == "what is 15 + 15" and real[3]["inputs"][-1] == TOK.eos_id
    train = build_input(data.replace(train=InputConfig(batch_size=2, shuffle=False)), "train", TOK, 1, 0)
    first = train.get_next()
    assert train.ids_to_strings(first["inputs"]) == ["what is 0 + 0?", "what is 1 + 1?"]
    np.testing.assert_array_equal(first["target_ids"][1], [TOK.bos_id, *TOK.encode("2"), 0, 0, 0])


def test_seq2seq_jsonl_sentencepiece_trains_on_both_fields(tmp_path):
    path = tmp_path / "pairs.jsonl"
    with path.open("w") as f:
        for i in range(40):
            f.write(json.dumps({"inputs": f"abc {i % 10}", "targets": f"xyz {i % 7}"}) + "\n")
    data = DataConfig(source=Seq2SeqJsonlSource(path=str(path)), tokenizer=SentencePieceConfig(vocab_size=21))
    tok = build_tokenizer(data)
    assert tok.unknown_characters("abc xyz 0123456") == ""  # x, y, z occur only in the targets


def test_seq2seq_jsonl_missing_field_names_the_setting(tmp_path):
    data = pair_data(tmp_path, jsonl_targets_key="reply")
    with pytest.raises(ConfigError, match=r"no 'reply' field .*set data\.jsonl_targets_key"):
        build_input(data, "train", TOK, 1, 0).get_next()


_PAIRS = Seq2SeqJsonlSource(path="pairs.jsonl")
_ONLY_SEQ2SEQ = "seq2seq_jsonl reads it. Switch with --data.source seq2seq_jsonl, or drop the flag."
# The sources that read it, the one most like the chosen source first (the one the fix names).
_TEXT_LAYOUTS = "{} read it. Switch with --data.source {}, or drop the flag."


@pytest.mark.parametrize(
    "source, args, message",
    [
        # a field of the chosen source that its other settings make inert
        (ShakespeareSource(), ["--data.span-corruption.noise-density", "0.3"],
         "--data.span-corruption.noise-density has no effect: data.layout='stream' is not span_corruption. Remove"),
        (ShakespeareSource(), ["--data.target-seq-len", "8"],
         "--data.target-seq-len has no effect: data.layout='stream' is not span_corruption. Remove"),
        # a field the chosen source does not have
        (ShakespeareSource(), ["--data.jsonl-inputs-key", "q"],
         "--data.jsonl-inputs-key: data.source is 'shakespeare' here, which has no jsonl_inputs_key; " + _ONLY_SEQ2SEQ),
        (JsonlSource(path="x.jsonl"), ["--data.jsonl-targets-key", "a"],
         "--data.jsonl-targets-key: data.source is 'jsonl' here, which has no jsonl_targets_key; " + _ONLY_SEQ2SEQ),
        (_PAIRS, ["--data.layout", "packed"],
         "--data.layout: data.source is 'seq2seq_jsonl' here, which has no layout; "
         + _TEXT_LAYOUTS.format("jsonl, text_files, shakespeare", "jsonl")),
        (_PAIRS, ["--data.jsonl-text-key", "body"],
         "--data.jsonl-text-key: data.source is 'seq2seq_jsonl' here, which has no jsonl_text_key; jsonl reads it. "
         "Switch with --data.source jsonl, or drop the flag."),
        (SyntheticSource(), ["--data.layout", "span_corruption"],  # span corruption needs text
         "--data.layout: data.source is 'synthetic' here, which has no layout; "
         + _TEXT_LAYOUTS.format("shakespeare, jsonl, text_files", "shakespeare")),
        # a bad value of a field the source has
        (_PAIRS, ["--data.jsonl-inputs-key", ""], "data.jsonl_inputs_key is empty"),
        (_PAIRS, ["--data.target-seq-len", "-1"], "data.target_seq_len must be >= 0"),
    ],
)  # fmt: skip
def test_fields_that_would_do_nothing_are_refused(source, args, message):
    """Each flag is refused naming itself, why, and the fix (a bad value: the field and the value)."""
    from pax_eqx.command_line import cli

    exp = ExperimentConfig(data=DataConfig(source=source, seq_len=24))
    with pytest.raises(cli.FlagError, match=re.escape(message)):
        cli.parse_fields(exp, args, "test")


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: JsonlSource(jsonl_targets_key="a"), r"JsonlSource has no field 'jsonl_targets_key'"),
        (lambda: Seq2SeqJsonlSource(layout="packed"), r"Seq2SeqJsonlSource has no field 'layout'"),
        (lambda: SyntheticSource(layout="span_corruption"), r"SyntheticSource has no field 'layout'"),
        (lambda: Seq2SeqJsonlSource(jsonl_inputs_key=""), r"data\.jsonl_inputs_key is empty"),
        (lambda: Seq2SeqJsonlSource(target_seq_len=-1), r"data\.target_seq_len must be >= 0"),
        (lambda: DataConfig(source=ShakespeareSource(layout="span_corruption", target_seq_len=5), seq_len=24).validate(
            files=False), r"data\.target_seq_len=5 is too short.* >= 6"),
    ],
)  # fmt: skip
def test_bad_source_fields_are_refused_in_python(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_a_larger_target_seq_len_pads_span_corruption_targets(tmp_path):
    data = span_data(tmp_path, target_seq_len=10)
    data.validate()
    batch = build_input(data, "train", TOK, 1, 0).get_next()
    assert batch["targets"].shape == (3, 10) and batch["target_paddings"][:, 6:].all()
