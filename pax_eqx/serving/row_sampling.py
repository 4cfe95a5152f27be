"""Each row's next token chosen with that row's own settings, as traced values.

A continuous batch holds requests with different temperatures, top-k, top-p and seeds in one
compiled program, so none of them may shape the program (the decode CLI's `sampler.Draw` makes
greedy, top-k's k and nucleus-on static; a server cannot recompile per request). When some row
filters, every row's logits are sorted once: the descending order gives both the k-th largest
logit (top-k with k traced, 0 = off) and the nucleus cutoff (top-p, 1 = off). When none filters,
the sort is skipped (a traced `lax.cond`), and when none samples, so is the draw: greedy and
plain sampling pay an argmax or a draw, not a sort. Temperature 0 takes the argmax. A row's key
is `fold_in(PRNGKey(seed), t)` for its t-th token, so a seeded request draws the same tokens
whatever else shares the batch.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, UInt


class RowSampling(eqx.Module):
    """Per-row settings [rows] each: temperature (0 = greedy), top_k (0 = off), top_p (1 = off),
    seed, and count (how many tokens the row has drawn: the t of its key)."""

    temperature: Float[Array, " rows"]
    top_k: Int[Array, " rows"]
    top_p: Float[Array, " rows"]
    seed: UInt[Array, " rows"]
    count: Int[Array, " rows"]

    @staticmethod
    def zeros(rows: int) -> RowSampling:
        """Settings for `rows` free rows (greedy, no filters); a request overwrites its row's."""
        return RowSampling(
            temperature=jnp.zeros((rows,), jnp.float32), top_k=jnp.zeros((rows,), jnp.int32),
            top_p=jnp.ones((rows,), jnp.float32), seed=jnp.zeros((rows,), jnp.uint32),
            count=jnp.zeros((rows,), jnp.int32),
        )  # fmt: skip


def filter_rows(
    logits: Float[Array, "rows vocab"], top_k: Int[Array, " rows"], top_p: Float[Array, " rows"]
) -> Float[Array, "rows vocab"]:
    """Logits outside each row's top-k (k > 0) and nucleus (the fewest tokens whose probability
    reaches top_p) set to the dtype's minimum: `sampler.filter_logits` with k and p per row."""
    neg = jnp.finfo(logits.dtype).min
    vocab = logits.shape[-1]
    ranked = -jnp.sort(-logits, axis=-1)  # descending
    kth = jnp.take_along_axis(ranked, jnp.clip(top_k - 1, 0, vocab - 1)[:, None], axis=-1)
    logits = jnp.where((top_k[:, None] > 0) & (logits < kth), neg, logits)
    ranked = jnp.where((top_k[:, None] > 0) & (ranked < kth), neg, ranked)
    probs = jax.nn.softmax(ranked, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs  # keep a token if the mass before it < top_p
    cutoff = jnp.min(jnp.where(mass_before < top_p[:, None], ranked, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits < cutoff, neg, logits)


def choose_rows(logits: Float[Array, "rows vocab"], sampling: RowSampling) -> Int[Array, " rows"]:
    """Each row's token: the argmax where its temperature is 0, else a draw from its filtered,
    tempered distribution with the key `fold_in(PRNGKey(seed), count)`.

    The sort behind top-k / top-p costs more than a small model's whole step on a CPU (a 32k
    vocabulary: ~100 of a 125 ms step for 8 rows, benchmarks/serve.py), so it runs only when
    some row asks for a filter, and nothing is drawn when every row is greedy: `lax.cond`s on
    traced values, still one program."""
    logits = logits.astype(jnp.float32)
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    sampled = sampling.temperature > 0
    filtered = sampled & ((sampling.top_k > 0) | (sampling.top_p < 1))

    def draw() -> Int[Array, " rows"]:
        tempered = logits / jnp.where(sampled, sampling.temperature, 1.0)[:, None]
        tempered = jax.lax.cond(
            jnp.any(filtered), lambda x: filter_rows(x, sampling.top_k, sampling.top_p), lambda x: x, tempered
        )
        keys = jax.vmap(lambda s, t: jax.random.fold_in(jax.random.PRNGKey(s), t))(sampling.seed, sampling.count)
        drawn = jax.vmap(lambda k, row: jax.random.categorical(k, row))(keys, tempered).astype(jnp.int32)
        return jnp.where(sampled, drawn, greedy)

    return jax.lax.cond(jnp.any(sampled), draw, lambda: greedy)
