"""Beam search over any `IncrementalDecoder`: one pool of K hypotheses per example.

Every step, each unfinished hypothesis proposes all V tokens (its log-prob + the model's
log-softmax, float32); a finished one (it emitted `eos_id`) proposes only `pad_id`, with its
log-prob and length unchanged. The K x V candidates of an example are ranked by the GNMT
length-normalised score

    score = log_prob / ((5 + length) / 6) ** length_norm_alpha      (length counts EOS)

and the top K become the next pool; the decoder's state follows them (`decoder.select` by the
parent rows). At the start only beam 0 is live (the others score -inf), so the first step
picks the K best first tokens rather than K copies of one.

With K = 1 every step takes the argmax of the log-softmax, which is greedy decoding exactly
(same tokens, same log-prob as `decoding.sample` at temperature 0): unlike T5X's separate
alive/finished sets, a finished hypothesis competes in the one pool, so beam 1 cannot go on
past greedy's EOS. The loop is `max_new_tokens` steps of a `lax.scan` (finished hypotheses
just carry), one jitted program over a batch of examples.
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from pax_eqx.config import ConfigError
from pax_eqx.models.decoding import SampleConfig
from pax_eqx.models.incremental import IncrementalDecoder, LanguageModelDecoder
from pax_eqx.models.language_model import LanguageModel


class BeamResult(NamedTuple):
    """Each example's K hypotheses, best first.

    tokens [B, K, new]: pad_id after a hypothesis's EOS; scores [B, K]: length-normalised
    (what they are ranked by; -inf for a slot no hypothesis reached, when K exceeds the number
    of distinct sequences); log_probs [B, K]: the raw sums of the model's log-probs; lengths
    [B, K]: tokens up to and including EOS.
    """

    tokens: Int[Array, "batch beam new"]
    scores: Float[Array, "batch beam"]
    log_probs: Float[Array, "batch beam"]
    lengths: Int[Array, "batch beam"]


def length_normalize(
    log_probs: Float[Array, "*shape"], lengths: Int[Array, "*shape"], alpha: float
) -> Float[Array, "*shape"]:
    """GNMT's length penalty (Wu et al. 2016, Pax's BeamSearchHParams.length_norm_alpha):
    log_probs / ((5 + lengths) / 6) ** alpha. A longer hypothesis has summed more negative
    terms; dividing by a growing penalty stops the search from preferring short ones."""
    return log_probs / ((5.0 + lengths.astype(jnp.float32)) / 6.0) ** alpha


def beam_search(
    decoder: IncrementalDecoder,
    *,
    beam_size: int,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int = 0,
    length_norm_alpha: float = 0.8,
) -> BeamResult:
    """The `beam_size` best continuations of every row of `decoder` (see the module
    docstring); eos_id -1 never finishes a hypothesis early. One jitted program."""
    if beam_size < 1 or max_new_tokens < 1 or length_norm_alpha < 0:
        raise ConfigError(
            f"beam_search needs beam_size >= 1, max_new_tokens >= 1 and length_norm_alpha >= 0; got "
            f"{beam_size}, {max_new_tokens} and {length_norm_alpha}."
        )
    return _beam_search(decoder, beam_size, max_new_tokens, eos_id, pad_id, float(length_norm_alpha))


@eqx.filter_jit
def _beam_search(
    decoder: IncrementalDecoder, k: int, max_new_tokens: int, eos_id: int, pad_id: int, alpha: float
) -> BeamResult:
    logits, carry = decoder.start()
    b, v = logits.shape
    carry = decoder.select(carry, jnp.repeat(jnp.arange(b), k))  # row i -> beams i*K .. i*K+K-1
    logits = jnp.repeat(logits, k, axis=0)
    log_probs = jnp.zeros((b, k), jnp.float32).at[:, 1:].set(-jnp.inf)  # only beam 0 is live
    state = (
        logits,
        carry,
        log_probs,
        jnp.zeros((b, k), jnp.int32),  # lengths
        jnp.zeros((b, k), bool),  # finished
        jnp.full((b, k, max_new_tokens), pad_id, jnp.int32),  # tokens so far
    )
    is_pad = jnp.arange(v) == pad_id

    def step(state, t):
        logits, carry, log_probs, lengths, finished, tokens = state
        step_lp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1).reshape(b, k, v)
        grown = log_probs[..., None] + step_lp
        frozen = jnp.where(is_pad, log_probs[..., None], -jnp.inf)  # a finished one proposes only pad
        cand_lp = jnp.where(finished[..., None], frozen, grown)  # [B, K, V]
        cand_len = jnp.broadcast_to(jnp.where(finished, lengths, lengths + 1)[..., None], cand_lp.shape)
        cand_score = length_normalize(cand_lp, cand_len, alpha)
        _, best = jax.lax.top_k(cand_score.reshape(b, k * v), k)  # [B, K], best first
        parent, token = best // v, (best % v).astype(jnp.int32)

        def take(x):  # [B, K, ...]: each example's hypotheses by parent
            return jax.vmap(lambda rows, p: rows[p])(x, parent)

        log_probs = jnp.take_along_axis(cand_lp.reshape(b, k * v), best, axis=1)
        lengths = jnp.take_along_axis(cand_len.reshape(b, k * v), best, axis=1)
        finished = take(finished) | (token == eos_id)
        tokens = take(tokens).at[:, :, t].set(token)
        carry = decoder.select(carry, (jnp.arange(b)[:, None] * k + parent).reshape(-1))
        logits, carry = decoder.extend(token.reshape(-1), carry, t)
        return (logits, carry, log_probs, lengths, finished, tokens), None

    state, _ = jax.lax.scan(step, state, jnp.arange(max_new_tokens, dtype=jnp.int32))
    _, _, log_probs, lengths, _, tokens = state
    return BeamResult(tokens, length_normalize(log_probs, lengths, alpha), log_probs, lengths)


def beam_search_lm(
    model: LanguageModel, prompts: list[list[int]], cfg: SampleConfig, pad_id: int = 0
) -> list[list[tuple[list[int], float]]]:
    """Each prompt's n-best list: up to `cfg.beam_size` (continuation ids cut before
    `cfg.eos_id`, length-normalised score), best first. Slots no hypothesis reached (-inf,
    only when beam_size exceeds the distinct continuations) are left out.

    Beam search slides no window (the hypotheses' caches would have to be re-prefilled), so
    the longest prompt plus `cfg.max_new_tokens` must fit in `model.max_seq_len`.
    """
    cfg.validate()
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ConfigError("every prompt needs at least one token.")
    decoder = LanguageModelDecoder.from_prompts(model, prompts, cfg.max_new_tokens, pad_id)
    result = beam_search(
        decoder, beam_size=cfg.beam_size, max_new_tokens=cfg.max_new_tokens, eos_id=cfg.eos_id, pad_id=pad_id,
        length_norm_alpha=cfg.length_norm_alpha,
    )  # fmt: skip
    return nbest_lists(result, cfg.eos_id)


def nbest_lists(result: BeamResult, eos_id: int) -> list[list[tuple[list[int], float]]]:
    """A BeamResult as Python lists: per example, (ids, score) for every hypothesis with a
    finite score, best first; ids stop before EOS (as `generate`'s do)."""
    tokens, scores, lengths = (np.asarray(a) for a in (result.tokens, result.scores, result.lengths))
    out = []
    for rows, row_scores, row_lengths in zip(tokens, scores, lengths):
        nbest = []
        for row, score, length in zip(rows, row_scores, row_lengths):
            if np.isfinite(score):
                ids = row[:length].tolist()
                nbest.append((ids[:-1] if ids and ids[-1] == eos_id else ids, float(score)))
        out.append(nbest)
    return out
