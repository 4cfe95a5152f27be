"""Synthetic inputs: Pax's SyntheticLmData (fixed rows) and random tokens, with the same contract."""

import numpy as np
import pytest

from pax_eqx.data import LM_FIELDS, ByteTokenizer, DataConfig, InputConfig, RandomSource, SyntheticSource, build_input


def test_synthetic_lm_data_matches_pax():
    """Pax's SyntheticLmData: ids = labels = 1, weights 1, one segment, positions 0..seq_len-1."""
    data = DataConfig(source=SyntheticSource(), seq_len=6, train=InputConfig(batch_size=3))
    batch = build_input(data, "train", ByteTokenizer(), 1, 0).get_next()
    assert sorted(batch) == sorted(LM_FIELDS)
    assert {k: (v.shape, v.dtype.name) for k, v in batch.items()} == {
        "ids": ((3, 6), "int32"), "labels": ((3, 6), "int32"), "weights": ((3, 6), "float32"),
        "segment_ids": ((3, 6), "int32"), "segment_pos": ((3, 6), "int32"),
    }  # fmt: skip
    assert (batch["ids"] == 1).all() and (batch["labels"] == 1).all() and (batch["weights"] == 1).all()
    assert (batch["segment_ids"] == 1).all()
    np.testing.assert_array_equal(batch["segment_pos"], np.tile(np.arange(6), (3, 1)))


@pytest.mark.parametrize("num_hosts", [2, 4])
def test_random_tokens_differ_across_hosts_and_are_deterministic(num_hosts):
    data = DataConfig(source=RandomSource(num_synthetic_examples=64), seq_len=8, train=InputConfig(batch_size=4))
    tok = ByteTokenizer()
    firsts = [build_input(data, "train", tok, num_hosts, i).get_next() for i in range(num_hosts)]
    rows = [tuple(r) for b in firsts for r in b["ids"]]
    assert len(set(rows)) == len(rows)
    again = build_input(data, "train", tok, num_hosts, 0).get_next()
    np.testing.assert_array_equal(again["ids"], firsts[0]["ids"])
    b = firsts[0]
    np.testing.assert_array_equal(b["labels"][:, :-1], b["ids"][:, 1:])
    assert b["ids"].min() >= 4 and b["ids"].max() < tok.vocab_size  # never a special token


def test_synthetic_eval_is_a_finite_padded_epoch():
    data = DataConfig(
        source=SyntheticSource(num_synthetic_examples=10),
        seq_len=4,
        eval=InputConfig(batch_size=4, shuffle=False, repeat=False, reset_for_eval=True),
    )
    batches = list(build_input(data, "eval", ByteTokenizer(), 1, 0))
    assert len(batches) == 3
    row_weights = np.concatenate([b["weights"].sum(axis=1) for b in batches])
    assert row_weights.tolist() == [4.0] * 10 + [0.0] * 2
