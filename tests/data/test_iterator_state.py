"""Resumption: after set_state(get_state()) an input emits exactly what an uninterrupted one would."""

import json

import numpy as np
import pytest

from pax_eqx.data import (
    DataConfig,
    InputConfig,
    JsonlSource,
    RandomSource,
    TextFilesSource,
    build_input,
    build_tokenizer,
)

TRAIN = InputConfig(batch_size=3, input_random_seed=11)


def jsonl_data(tmp_path, eval=None, **source_kw) -> DataConfig:
    """`source_kw`: fields of the jsonl source (layout, eval_fraction)."""
    path = tmp_path / "docs.jsonl"
    with path.open("w") as f:
        for i in range(40):
            f.write(json.dumps({"text": f"document {i} " + "abc " * (i % 7)}) + "\n")
    data = DataConfig(source=JsonlSource(path=str(path), **source_kw), seq_len=16, train=TRAIN)
    return data if eval is None else data.replace(eval=eval)


def text_data(tmp_path) -> DataConfig:
    path = tmp_path / "t.txt"
    path.write_text("".join(f"verse {i} of the poem\n" for i in range(80)))
    return DataConfig(source=TextFilesSource(path=str(path)), seq_len=12, train=TRAIN)


CASES = {
    "stream": lambda tmp: text_data(tmp),
    "packed": lambda tmp: jsonl_data(tmp, layout="packed"),
    "random": lambda tmp: DataConfig(source=RandomSource(num_synthetic_examples=20), seq_len=8, train=TRAIN),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("num_hosts, host", [(1, 0), (2, 1)])
def test_resumed_input_continues_exactly(tmp_path, case, num_hosts, host):
    data = CASES[case](tmp_path)
    tok = build_tokenizer(data)
    reference = build_input(data, "train", tok, num_hosts, host)
    for _ in range(5):
        reference.get_next()
    state = json.loads(json.dumps(reference.get_state()))  # what a checkpoint stores
    expected = [reference.get_next() for _ in range(12)]  # crosses epoch boundaries for small data

    resumed = build_input(data, "train", tok, num_hosts, host)  # a fresh process after preemption
    resumed.set_state(state)
    for want in expected:
        got = resumed.get_next()
        assert sorted(got) == sorted(want)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


def test_state_of_an_untouched_input_is_the_start(tmp_path):
    data = text_data(tmp_path)
    tok = build_tokenizer(data)
    a = build_input(data, "train", tok, 1, 0)
    start = a.get_state()
    first = a.get_next()["ids"]
    a.get_next()
    a.set_state(start)
    np.testing.assert_array_equal(a.get_next()["ids"], first)


def test_eval_state_round_trips_mid_epoch(tmp_path):
    eval_cfg = InputConfig(batch_size=2, shuffle=False, repeat=False, reset_for_eval=True)
    data = jsonl_data(tmp_path, layout="packed", eval_fraction=0.5, eval=eval_cfg)
    tok = build_tokenizer(data)
    a = build_input(data, "eval", tok, 2, 0)
    a.get_next()
    state = a.get_state()
    rest = [batch["ids"].tolist() for batch in a]
    assert len(rest) >= 2
    b = build_input(data, "eval", tok, 2, 0)
    b.set_state(state)
    assert [batch["ids"].tolist() for batch in b] == rest
