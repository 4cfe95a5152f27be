"""Mixtures (SeqIO's Mixture semantics): sources drawn with probability weight / sum, each repeating
on its own; observed rates within sampling tolerance of the weights; exact resume; and a mixture of
two prepared corpora through `--data.source array_record`."""

from __future__ import annotations

import collections
import json

import grain
import numpy as np
import pytest

from pax_eqx.config import ConfigError
from pax_eqx.data import ArrayRecordSource, DataConfig, InputConfig, ShakespeareSource, build_input, build_tokenizer
from pax_eqx.data.mixtures import SampledMix


def labelled(name: str, n: int) -> grain.IterDataset:
    """A source of n elements (name, i), repeating: its epochs are visible in i."""
    in_this_thread = grain.ReadOptions(num_threads=0, prefetch_buffer_size=1)
    return grain.MapDataset.range(n).map(lambda i: (name, int(i))).repeat().to_iter_dataset(in_this_thread)


def within_tolerance(counts: dict[str, int], weights: dict[str, float]) -> None:
    """Each observed share within 4 binomial standard deviations of its probability."""
    total = sum(counts.values())
    norm = sum(weights.values())
    for name, w in weights.items():
        p = w / norm
        assert abs(counts[name] / total - p) < 4 * np.sqrt(p * (1 - p) / total), (name, counts)


def test_observed_rates_match_the_weights_and_each_source_repeats_on_its_own():
    weights = {"a": 0.6, "b": 0.3, "c": 0.1}
    mixed = SampledMix([labelled("a", 1000), labelled("b", 50), labelled("c", 7)], list(weights.values()), seed=3)
    draws = [x for _, x in zip(range(20_000), mixed)]
    counts = collections.Counter(name for name, _ in draws)
    within_tolerance(counts, weights)
    assert counts["a"] != 12_000  # sampled, not interleaved in fixed proportions
    for name, n in (("a", 1000), ("b", 50), ("c", 7)):  # per-source epochs: each cycles through its own n
        seen = [i for src, i in draws if src == name]
        assert seen == [k % n for k in range(len(seen))]


def test_a_restored_mixture_goes_on_exactly():
    def make():
        return iter(SampledMix([labelled("a", 13), labelled("b", 5)], [2.0, 1.0], seed=7))

    it = make()
    _ = [next(it) for _ in range(37)]
    state = json.loads(json.dumps(it.get_state()))
    expected = [next(it) for _ in range(50)]
    again = make()
    again.set_state(state)
    assert [next(again) for _ in range(50)] == expected


def test_weights_are_checked():
    with pytest.raises(ConfigError, match="must be positive numbers"):
        SampledMix([labelled("a", 3), labelled("b", 3)], [1.0, 0.0], seed=0)
    with pytest.raises(ConfigError, match="needs 2 weights"):
        SampledMix([labelled("a", 3), labelled("b", 3)], [1.0], seed=0)


def test_a_mixture_of_two_prepared_corpora_packs_documents_at_the_weights(tmp_path):
    pytest.importorskip("apache_beam", reason="the [prepare] extra (.ci/run installs it)")
    from pax_eqx.data.prepare import pipeline
    from pax_eqx.data.prepare.config import PrepareConfig

    for name in ("a", "b"):
        path = tmp_path / f"{name}.jsonl"
        path.write_text(
            "".join(json.dumps({"text": f"{name.upper()}{i} " + "x" * (i % 11)}) + "\n" for i in range(150))
        )
        cfg = PrepareConfig(input=str(path), output_dir=str(tmp_path / name), num_shards=2, num_workers=1)
        pipeline.prepare(cfg)
    one_host = InputConfig(batch_size=4, num_infeed_hosts=1, infeed_host_index=0)
    data = DataConfig(
        source=ArrayRecordSource(path=f"{tmp_path / 'a'},{tmp_path / 'b'}", mixture_weights=(3.0, 1.0)),
        seq_len=64,
        train=one_host,
        eval=InputConfig(batch_size=4, shuffle=False, repeat=False, reset_for_eval=True, num_infeed_hosts=1),
    )
    data.validate()
    tok = build_tokenizer(data)
    inp = build_input(data, "train", tok)
    counts = collections.Counter()
    for _ in range(60):
        batch = inp.get_next()
        starts = (batch["segment_pos"] == 0) & (batch["segment_ids"] > 0) & (batch["ids"] == tok.bos_id)
        starts[:, -1] = False  # a document begun at a row's last position has its first letter in the next row
        for row, col in zip(*np.nonzero(starts)):
            counts[tok.decode(batch["ids"][row, col + 1 : col + 2])] += 1  # the document's first letter
    assert set(counts) <= {"A", "B"} and sum(counts.values()) > 1000
    within_tolerance(counts, {"A": 3.0, "B": 1.0})
    # Eval: both corpora's held-out documents (every 10th), one row each.
    ev = build_input(data.replace(eval=data.eval.replace(infeed_host_index=0)), "eval", tok)
    firsts = [tok.decode(b["ids"][r, 1:2]) for b in ev for r in range(4) if b["weights"][r].sum() > 0]
    assert collections.Counter(firsts) == {"A": 15, "B": 15}
    with pytest.raises(ConfigError, match="gives 1 weight.*one weight per directory"):
        data.replace(source=data.source.replace(mixture_weights=(1.0,))).validate()
    with pytest.raises(ConfigError, match="names one prepared directory"):
        data.replace(source=data.source.replace(path=str(tmp_path / "a"), mixture_weights=(1.0, 2.0))).validate()


def test_mixture_weights_are_refused_where_nothing_mixes():
    from pax_eqx.command_line import cli

    # A source that is not array_record has no weights: the flag is refused naming the one that reads it.
    with pytest.raises(
        cli.FlagError,
        match=r"^--mixture-weights: source is 'shakespeare' here, which has no mixture_weights; array_record "
        r"reads it. Switch with --source array_record, or drop the flag.$",
    ):
        cli.parse_fields(DataConfig(), ["--mixture-weights", "1", "2"], "t")
    with pytest.raises(ConfigError, match="ShakespeareSource has no field 'mixture_weights'"):
        ShakespeareSource(mixture_weights=(1.0, 2.0))
    # array_record with one directory: nothing to mix.
    one = DataConfig(source=ArrayRecordSource(path="prepared/a"))
    with pytest.raises(ConfigError, match=r"data.mixture_weights=\[1.0, 2.0\] would do nothing"):
        one.replace(source=one.source.replace(mixture_weights=(1.0, 2.0))).validate(files=False)
    with pytest.raises(cli.FlagError, match="--mixture-weights has no effect: data.path names one prepared directory"):
        cli.parse_fields(one, ["--mixture-weights", "1", "2"], "t")
    assert "mixture_weights" in one.source.inert_fields()
    assert "mixture_weights" not in one.source.replace(path="a,b").inert_fields()
