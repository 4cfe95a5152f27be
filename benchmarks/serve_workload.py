"""The serving benchmark's traffic and model, shared by `benchmarks.serve` (pax_eqx) and
`benchmarks.hf_generate_reference` (Hugging Face `transformers`, in a scratch environment), so
both sides run the same requests on the same architecture. numpy only: no jax, no torch.

Mixed lengths are the point: a static batch runs until its longest request ends, so a few long
requests among many short ones keep its other slots idle, which continuous batching refills. The
lengths are drawn from buckets with a long tail, with a fixed seed:

    prompt tokens  70% 8-32, 20% 33-128, 10% 129-256
    new tokens     70% 8-32, 20% 33-128, 10% 129-224

(at most 480 positions, inside TINY_LLAMA's 512). Prompt ids are drawn from [3, vocab): 0-2 are
the tokenizer's <unk>, <s>, </s>. Arrivals at a rate r are a Poisson process (exponential gaps
of mean 1/r, their own fixed seed); rate None means every request at t = 0 (offered load "as
fast as possible").
"""

from __future__ import annotations

import dataclasses

import numpy as np

# A tiny Llama 2-style model (config.json fields of transformers' LlamaConfig): the HF reference
# builds it with random weights and saves it; `python -m pax_eqx.import_hf` imports those weights;
# `benchmarks.serve --model tiny_llama` builds the same architecture with pax_eqx's own random
# weights (pax_eqx.hf.families maps the fields).
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": None,
    "initializer_range": 0.02,
    "pretraining_tp": 1,
    "use_cache": True,
    "torch_dtype": "float32",
}
FIRST_ID = 3  # ids below are the tokenizer's specials

PROMPT_BUCKETS = ((0.7, 8, 32), (0.2, 33, 128), (0.1, 129, 256))  # (probability, lowest, highest)
NEW_TOKEN_BUCKETS = ((0.7, 8, 32), (0.2, 33, 128), (0.1, 129, 224))


@dataclasses.dataclass(frozen=True)
class Job:
    """One request of the workload: its prompt ids and how many tokens it generates."""

    prompt: tuple[int, ...]
    max_tokens: int


def mixed_workload(
    n: int, *, vocab_size: int, max_seq_len: int, seed: int = 0, scale: float = 1.0
) -> list[Job]:  # fmt: skip
    """`n` requests of mixed lengths (the module docstring). scale < 1 shrinks every length (a
    smoke test's tiny model); a request is cut to fit `max_seq_len` positions."""
    rng = np.random.default_rng(seed)
    jobs = []
    for _ in range(n):
        p = max(1, round(_draw(rng, PROMPT_BUCKETS) * scale))
        m = max(1, round(_draw(rng, NEW_TOKEN_BUCKETS) * scale))
        p = min(p, max_seq_len - 1)
        m = min(m, max_seq_len - p)
        ids = rng.integers(min(FIRST_ID, vocab_size - 1), vocab_size, size=p)
        jobs.append(Job(tuple(int(i) for i in ids), int(m)))
    return jobs


def arrival_times(n: int, rate: float | None, seed: int = 1) -> list[float]:
    """Seconds after the start at which each of `n` requests is sent: a Poisson process of
    `rate` requests/s, or all at 0 when rate is None."""
    if rate is None:
        return [0.0] * n
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])]).tolist()


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (linear interpolation), NaN for no values."""
    return float(np.percentile(values, q)) if values else float("nan")


def _draw(rng: np.random.Generator, buckets: tuple[tuple[float, int, int], ...]) -> int:
    probs = np.array([b[0] for b in buckets])
    _, lo, hi = buckets[rng.choice(len(buckets), p=probs / probs.sum())]
    return int(rng.integers(lo, hi + 1))
