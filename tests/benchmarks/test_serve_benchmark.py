"""`benchmarks.serve` as a smoke run: a tiny model, a handful of mixed-length requests at one
rate and all at once, in-process and over HTTP; every request completes with exactly its
max_tokens, and continuous and static batching produce the same tokens. Untimed (the numbers
are docs/performance.md's, on the real sizes)."""

from __future__ import annotations

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import hf_generate_reference, serve
from benchmarks.serve_workload import arrival_times, mixed_workload
from pax_eqx.models import LanguageModelConfig


@pytest.fixture(scope="module")
def tiny():
    """A 2-layer model with numpy's random weights (jax's initialisers would compile for longer
    than the test runs)."""
    cfg = LanguageModelConfig(vocab_size=64, max_seq_len=48, num_layers=2, model_dims=16, hidden_dims=32, num_heads=4)
    rng = np.random.default_rng(0)

    def fill(leaf):
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            return leaf
        if not jnp.issubdtype(leaf.dtype, jnp.floating):
            return jnp.zeros(leaf.shape, leaf.dtype)
        return jnp.asarray(rng.normal(0.0, 0.5, leaf.shape), leaf.dtype)

    return jax.tree.map(fill, eqx.filter_eval_shape(cfg.build, jax.random.key(0))), serve.WordTokenizer(64)


@pytest.mark.parametrize("http", [False, True], ids=["in_process", "http"])
def test_every_request_completes_and_both_policies_give_the_same_tokens(tiny, http, capsys):
    model, tokenizer = tiny
    rows, breakdown = serve.run_benchmark(
        model, tokenizer, requests=6, slots=3, chunk=8, rates=[None, 50.0], scale=0.15, http=http, breakdown=not http
    )
    assert [(r["rate"], r["policy"]) for r in rows] == [(r, p) for r in ("max", 50.0) for p in serve.POLICIES]
    for r in rows:
        assert r["completed"] == r["requests"] == 6 and r["tokens"] == r["expected_tokens"]
        assert r["same_tokens"] and r["tokens_per_s"] > 0 and r["ttft_p50_s"] <= r["latency_p50_s"]
    assert set(breakdown) == (set() if http else {"generate_step_s", "prefill_chunk_s", "choose_rows_s"})
    serve.print_report(rows, breakdown, what="tiny", slots=3, http=http)
    out = capsys.readouterr().out
    assert "| max | continuous | 6/6 |" in out and "continuous / static tokens/s" in out
    assert [json.loads(line)["policy"] for line in out.strip().splitlines()[-4:]] == list(serve.POLICIES) * 2


def test_the_workload_has_a_long_tail_and_fits_the_model():
    jobs = mixed_workload(200, vocab_size=32000, max_seq_len=512)
    assert jobs == mixed_workload(200, vocab_size=32000, max_seq_len=512)  # a fixed seed
    new = sorted(j.max_tokens for j in jobs)
    assert new[100] <= 40 and new[-1] > 128  # most short, some long
    assert all(len(j.prompt) + j.max_tokens <= 512 and min(j.prompt) >= 3 for j in jobs)
    assert arrival_times(3, None) == [0.0] * 3 and arrival_times(50, 10.0)[0] == 0.0


def test_the_hf_reference_imports_without_torch():
    """Its torch and transformers imports are inside its functions (a scratch environment's)."""
    assert callable(hf_generate_reference.run_jobs) and callable(hf_generate_reference.make_model)
