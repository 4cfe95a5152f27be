"""The token-by-token loop every drawing decode strategy runs (sampling, greedy): `draw_tokens`
takes any `IncrementalDecoder` and a `Draw` (how one token is chosen from the logits), and runs
`start` + `max_new_tokens` `extend` steps in a `lax.scan`, one jitted program; rows that hit EOS
keep emitting `pad_id`. No config is read here: a strategy (decode_strategies/) makes its Draw.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from pax_eqx.models.incremental import IncrementalDecoder


def filter_logits(
    logits: Float[Array, "batch vocab"], top_k: int, top_p: float | Float[Array, ""], nucleus: bool | None = None
) -> Float[Array, "batch vocab"]:
    """Sets logits outside the top-k / nucleus (smallest set with probability >= top_p) to -inf.

    `nucleus` says whether the top-p filter runs (default: `top_p < 1`); it is separate so that
    `top_p` can be a traced value while the program's structure stays static.
    """
    neg = jnp.finfo(logits.dtype).min
    if top_k > 0:
        kth = jax.lax.top_k(logits, min(top_k, logits.shape[-1]))[0][..., -1:]
        logits = jnp.where(logits < kth, neg, logits)
    if nucleus is None:
        nucleus = top_p < 1.0
    if nucleus:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        # Keep a token if the probability mass strictly before it is < top_p.
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        cutoff = jnp.min(jnp.where(mass_before < top_p, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, neg, logits)
    return logits


class Draw(eqx.Module):
    """How one token is chosen, as the compiled loop sees it: what shapes the program is static
    (greedy or not, top-k's k, top-p on or off), the numbers are arrays. A new temperature, top-p
    or EOS id then reuses the compiled decode instead of compiling it again."""

    greedy: bool = eqx.field(static=True)
    top_k: int = eqx.field(static=True)
    nucleus: bool = eqx.field(static=True)
    temperature: Float[Array, ""]
    top_p: Float[Array, ""]
    eos_id: Int[Array, ""]

    @staticmethod
    def of(*, temperature: float, top_k: int, top_p: float, eos_id: int) -> Draw:
        return Draw(
            greedy=temperature == 0.0, top_k=top_k, nucleus=top_p < 1.0,
            temperature=jnp.float32(temperature), top_p=jnp.float32(top_p), eos_id=jnp.int32(eos_id),
        )  # fmt: skip

    def token(self, logits: Float[Array, "batch vocab"], key: PRNGKeyArray) -> Int[Array, " batch"]:
        logits = logits.astype(jnp.float32)
        if self.greedy:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        logits = filter_logits(logits / self.temperature, self.top_k, self.top_p, self.nucleus)
        return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


@eqx.filter_jit
def draw_tokens(
    decoder: IncrementalDecoder, draw: Draw, key: PRNGKeyArray, pad_id: int, max_new_tokens: int
) -> tuple[Int[Array, "batch new"], Float[Array, " batch"]]:
    """`max_new_tokens` tokens of every row of `decoder`, each chosen by `draw`: the tokens [B, new]
    (a row that emitted `draw.eos_id` emits `pad_id` after it) and log_probs [B], the sum of the
    model's log-softmax (temperature 1, no top-k/top-p) of every emitted token up to and including
    EOS -- the score beam search maximises, so the two can be compared."""
    logits, carry = decoder.start()
    key, sub = jax.random.split(key)
    token, token_logp = _choose(logits, sub, draw)
    b = token.shape[0]

    def step(state, t):
        token, token_logp, carry, done, total, key = state
        emitted = jnp.where(done, pad_id, token)  # the EOS itself is emitted, pads after it
        total = total + jnp.where(done, 0.0, token_logp)
        done = done | (token == draw.eos_id)
        logits, carry = decoder.extend(emitted, carry, t)
        key, sub = jax.random.split(key)
        token, token_logp = _choose(logits, sub, draw)
        return (token, token_logp, carry, done, total, key), emitted

    state = (token, token_logp, carry, jnp.zeros((b,), bool), jnp.zeros((b,), jnp.float32), key)
    state, emitted = jax.lax.scan(step, state, jnp.arange(max_new_tokens, dtype=jnp.int32))
    return emitted.T, state[4]


def _choose(
    logits: Float[Array, "batch vocab"], key: PRNGKeyArray, draw: Draw
) -> tuple[Int[Array, " batch"], Float[Array, " batch"]]:
    """The next token of every row and its log-probability under the model (float32)."""
    token = draw.token(logits, key)
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return token, jnp.take_along_axis(log_probs, token[:, None], axis=-1)[:, 0]


def cut_at_eos(rows: list[list[int]], eos_id: int) -> list[list[int]]:
    """Each row up to (not including) its first `eos_id`."""
    return [row[: row.index(eos_id)] if eos_id in row else row for row in rows]
