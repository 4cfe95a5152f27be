"""Multihost infeed, simulated: every host builds its own input with its own infeed_host_index."""

import math

import numpy as np
import pytest

from pax_eqx.data import (
    DataConfig,
    HostShard,
    Input,
    InputConfig,
    TextFilesSource,
    array_examples,
    batch_host_examples,
    build_input,
    build_tokenizer,
    zeros_like_example,
)

EVAL = InputConfig(batch_size=3, shuffle=False, repeat=False, reset_for_eval=True)


def host_inputs(cfg: InputConfig, n: int, num_hosts: int, split="train") -> list[Input]:
    examples = array_examples({"x": np.arange(n, dtype=np.int64)})
    pad = zeros_like_example({"x": np.int64(0)})
    inputs = []
    for i in range(num_hosts):
        shard = HostShard(count=num_hosts, index=i)
        batches, per_epoch = batch_host_examples(
            examples.map(lambda e: {**e, "weights": np.float32(1)}), cfg, shard, {**pad, "weights": np.float32(0)}
        )
        inputs.append(Input(batches, cfg, split=split, shard=shard, num_batches_per_epoch=per_epoch))
    return inputs


@pytest.mark.parametrize("num_hosts", [1, 2, 4])
def test_training_shards_are_disjoint_and_cover_each_epoch(num_hosts):
    n, batch = 48, 3
    cfg = InputConfig(batch_size=batch, input_random_seed=7)
    inputs = host_inputs(cfg, n, num_hosts)
    per_host_batches = n // num_hosts // batch
    epochs = []
    for _ in range(2):
        seen = [np.concatenate([inp.get_next()["x"] for _ in range(per_host_batches)]) for inp in inputs]
        for a in range(num_hosts):
            for b in range(a + 1, num_hosts):
                assert not set(seen[a]) & set(seen[b]), f"hosts {a} and {b} emitted the same example"
        union = np.concatenate(seen)
        assert sorted(union.tolist()) == list(range(n))  # disjoint and complete: exactly one epoch
        epochs.append(union)
    assert epochs[0].tolist() != epochs[1].tolist()  # a fresh order every epoch
    assert epochs[0].tolist() != list(range(n))  # shuffled


def test_different_seeds_give_different_orders():
    a = host_inputs(InputConfig(batch_size=4, input_random_seed=1), 32, 1)[0].get_next()["x"]
    b = host_inputs(InputConfig(batch_size=4, input_random_seed=2), 32, 1)[0].get_next()["x"]
    assert a.tolist() != b.tolist()


@pytest.mark.parametrize("num_hosts", [1, 2, 4])
@pytest.mark.parametrize("n", [1, 7, 13, 24])
def test_uneven_eval_ends_together_with_zero_weight_padding(num_hosts, n):
    inputs = host_inputs(EVAL, n, num_hosts, split="eval")
    counts, real = [], []
    for inp in inputs:
        batches = list(inp)  # reads to StopIteration
        counts.append(len(batches))
        for b in batches:
            assert b["x"].shape == (EVAL.batch_size,)
            real += b["x"][b["weights"] > 0].tolist()
            assert np.all(b["x"][b["weights"] == 0] == 0)  # padded rows are all zeros
        assert len(batches) == inp.num_batches_per_epoch
    assert len(set(counts)) == 1, f"hosts stop after different numbers of batches: {counts}"
    assert sorted(real) == list(range(n))  # every real example exactly once over all hosts
    assert counts[0] == math.ceil(math.ceil(n / num_hosts) / EVAL.batch_size)


def test_eval_reset_restarts_the_epoch():
    inp = host_inputs(EVAL, 7, 1, split="eval")[0]
    first = [b["x"].tolist() for b in inp]
    with pytest.raises(StopIteration):
        inp.get_next()
    inp.reset()
    assert [b["x"].tolist() for b in inp] == first


def text_data(tmp_path, text: str, eval_fraction: float = 0.1, **kw) -> DataConfig:
    path = tmp_path / "corpus.txt"
    path.write_text(text)
    source = TextFilesSource(path=str(path), eval_fraction=eval_fraction)
    base = dict(source=source, seq_len=8, train=InputConfig(batch_size=2, input_random_seed=3))
    return DataConfig(**{**base, **kw})


@pytest.mark.parametrize("num_hosts", [1, 2, 4])
def test_lm_stream_windows_are_disjoint_across_hosts(tmp_path, num_hosts):
    """The nanoGPT-style windows of one epoch: disjoint across hosts, together one tiling of the text."""
    text = "".join(chr(ord("a") + i % 26) + chr(ord("A") + (i // 26) % 26) for i in range(300))
    data = text_data(tmp_path, text, eval_fraction=0.5)
    tok = build_tokenizer(data)
    train_text = text[: len(text) // 2]  # one line: the tail split falls back to a character cut
    inputs = [build_input(data, "train", tok, num_hosts, i) for i in range(num_hosts)]
    stream = tok.encode(train_text) + [tok.eos_id]
    num_windows = len(stream) // 8 - 1
    per_host = num_windows // num_hosts // 2
    rows = []
    for inp in inputs:
        for _ in range(per_host):
            b = inp.get_next()
            np.testing.assert_array_equal(b["labels"][:, :-1], b["ids"][:, 1:])  # labels are the next tokens
            rows += [tuple(r) for r in b["ids"]]
    assert len(set(rows)) == len(rows)
    # All windows of the epoch start at one common shift in [0, 8) and tile the text from there.
    starts = sorted(_find(stream, r) for r in rows)
    shift = starts[0] % 8
    assert all((s - shift) % 8 == 0 for s in starts)
    if num_hosts * per_host * 2 == num_windows:
        assert starts == [shift + 8 * w for w in range(num_windows)]


def _find(stream: list[int], row: tuple) -> int:
    hits = [i for i in range(len(stream) - len(row) + 1) if tuple(stream[i : i + len(row)]) == row]
    assert len(hits) == 1
    return hits[0]


@pytest.mark.parametrize("num_hosts", [1, 2, 4])
def test_lm_eval_epoch_predicts_every_held_out_token_once(tmp_path, num_hosts):
    text = "\n".join(f"line {i}: " + "xyz" * (i % 5) for i in range(60)) + "\n"
    data = text_data(tmp_path, text, eval=InputConfig(batch_size=3, shuffle=False, repeat=False, reset_for_eval=True))
    tok = build_tokenizer(data)
    cut = text.find("\n", int(len(text) * 0.9)) + 1  # the last 10%, from a line start (no blank lines here)
    stream = tok.encode(text[cut:]) + [tok.eos_id]
    counts, rows_by_host = [], []
    for i in range(num_hosts):
        batches = list(build_input(data, "eval", tok, num_hosts, i))
        counts.append(len(batches))
        rows = []
        for b in batches:
            for ids, labels, w, seg in zip(b["ids"], b["labels"], b["weights"], b["segment_ids"]):
                if w.any():
                    rows.append((ids[w > 0].tolist(), labels[w > 0].tolist()))
                else:  # a padded row: nothing in it counts
                    assert not ids.any() and not labels.any() and not seg.any()
        rows_by_host.append(rows)
    assert len(set(counts)) == 1, counts
    # Unshuffled eval: window w is on host w % hosts, at position w // hosts there.
    num_windows = sum(len(r) for r in rows_by_host)
    windows = [rows_by_host[w % num_hosts][w // num_hosts] for w in range(num_windows)]
    assert sum((ids for ids, _ in windows), []) == stream[:-1]
    assert sum((labels for _, labels in windows), []) == stream[1:]
