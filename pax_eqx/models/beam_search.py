"""Beam search over any `IncrementalDecoder`: K alive hypotheses per example, and the K best
finished ones (Praxis' beam search; T5X's, less its 2K candidates).

Every step, each alive hypothesis proposes all V tokens (its log-prob + the model's
log-softmax, float32); the K most probable of the K x V candidates become the alive beam, and
the decoder's state follows them (`decoder.select` by the parent rows). A candidate that is
`eos_id` leaves the beam for the finished set, ranked by the GNMT length-normalised score

    score = log_prob / ((5 + length) / 6) ** length_norm_alpha      (length counts EOS)

and hypotheses still alive after `max_new_tokens` join it there, unfinished. Alive ones all have
the same length, so their log-prob ranks them; only finished ones of different lengths need the
normalisation. At the start only beam 0 is live, so the first step picks the K best first
tokens rather than K copies of one.

With K = 1 the alive hypothesis takes the argmax every step and ends at greedy's EOS (or at
max_new_tokens), which is greedy decoding exactly (same tokens, same log-prob as
`decoding.sample` at temperature 0). T5X keeps 2K candidates so that K stay alive past an EOS;
then beam 1 would go on past greedy's EOS, so it is not done here.

Rejected: one pool where finished hypotheses compete with alive ones by normalised score (what
this module did first). Normalised scores are not monotone in length, so finished hypotheses
could fill the pool mid-way and stop the search: on a weak span-corruption model that beam
scored below greedy on every example. The loop is `max_new_tokens` steps of a `lax.scan`, one
jitted program over a batch of examples.

`style="praxis"` is Praxis' `beam_search.beam_search` instead (BeamSearchHParams defaults:
tokens_per_beam = K, early_exit=False, min_decode_steps=0), for matching a Pax decode:

- every step, each alive hypothesis's EOS continuation is offered to the finished set, whether or
  not it ranks among the K best candidates, and the alive beam is refilled from non-EOS tokens
  only, by Praxis' two-stage top-k: each hypothesis's K most probable tokens, an EOS among them
  penalised by -1e9, then the K best of the K x K (so K hypotheses stay alive throughout);
- the length penalty is Praxis' `decoder_utils.length_norm`, ((5 + length) / 5) ** alpha, not
  GNMT's ((5 + length) / 6) ** alpha (same ranking; scores differ by the factor (6/5) ** alpha);
- hypotheses still alive after max_new_tokens are not returned (Praxis keeps only ended ones);
  slots no ended hypothesis reached have score -inf (Praxis: its -1e9 placeholders).

It needs an eos_id in [0, vocab) and beam_size <= vocab. tests/praxis/test_praxis_beam_search.py
checks it against Praxis 1.4's own n-best ids and scores.
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from pax_eqx.config import ConfigError
from pax_eqx.models.incremental import IncrementalDecoder

BEAM_STYLES = ("pax_eqx", "praxis")


def length_penalty_base(style: str) -> float:
    """The base of a style's length penalty ((5 + length) / base) ** alpha: GNMT's 6, Praxis' 5."""
    return 5.0 if style == "praxis" else 6.0


_PRAXIS_PENALTY = 1e9  # Praxis' two_stage_topk subtracts this from EOS candidates


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
    log_probs: Float[Array, "*shape"], lengths: Int[Array, "*shape"], alpha: float, base: float = 6.0
) -> Float[Array, "*shape"]:
    """GNMT's length penalty (Wu et al. 2016, Pax's BeamSearchHParams.length_norm_alpha):
    log_probs / ((5 + lengths) / base) ** alpha, base 6 (GNMT; Praxis' decoder_utils.length_norm
    uses 5). A longer hypothesis has summed more negative terms; dividing by a growing penalty
    stops the search from preferring short ones."""
    return log_probs / ((lengths.astype(jnp.float32) + 5.0) / base) ** alpha


def beam_search(
    decoder: IncrementalDecoder,
    *,
    beam_size: int,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int = 0,
    length_norm_alpha: float = 0.8,
    style: str = "pax_eqx",
) -> BeamResult:
    """The `beam_size` best continuations of every row of `decoder` (see the module
    docstring); eos_id -1 never finishes a hypothesis early. One jitted program.

    style: "pax_eqx" (this module's search) or "praxis" (Praxis' beam_search, see the module
    docstring; needs eos_id >= 0)."""
    if beam_size < 1 or max_new_tokens < 1 or length_norm_alpha < 0:
        raise ConfigError(
            f"beam_search needs beam_size >= 1, max_new_tokens >= 1 and length_norm_alpha >= 0; got "
            f"{beam_size}, {max_new_tokens} and {length_norm_alpha}."
        )
    if style not in BEAM_STYLES:
        raise ConfigError(f"beam_search style={style!r} is not one of {BEAM_STYLES}.")
    if style == "praxis" and eos_id < 0:
        raise ConfigError(
            f"beam_search style='praxis' needs an eos_id >= 0 (Praxis offers every hypothesis's EOS "
            f"continuation to the finished set), got {eos_id}; pass the EOS id or use style='pax_eqx'."
        )
    return _beam_search(decoder, beam_size, max_new_tokens, eos_id, pad_id, float(length_norm_alpha), style)


@eqx.filter_jit
def _beam_search(
    decoder: IncrementalDecoder, k: int, max_new_tokens: int, eos_id: int, pad_id: int, alpha: float, style: str
) -> BeamResult:
    logits, carry = decoder.start()
    b, v = logits.shape
    praxis = style == "praxis"
    if praxis and not (eos_id < v and k <= v):
        raise ConfigError(
            f"beam_search style='praxis' needs eos_id < vocab and beam_size <= vocab (its per-hypothesis "
            f"top-k); got eos_id={eos_id}, beam_size={k}, vocab={v}."
        )
    base = length_penalty_base(style)
    carry = decoder.select(carry, jnp.repeat(jnp.arange(b), k))  # row i -> beams i*K .. i*K+K-1
    logits = jnp.repeat(logits, k, axis=0)
    none = jnp.full((b, k), -jnp.inf, jnp.float32)
    pads = jnp.full((b, k, max_new_tokens), pad_id, jnp.int32)
    alive = (none.at[:, 0].set(0.0), pads)  # only beam 0 is live at the start
    finished = _Finished(none, none, jnp.zeros((b, k), jnp.int32), pads)

    def step(state, t):
        logits, carry, (alive_lp, alive_tokens), finished = state
        step_lp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1).reshape(b, k, v)
        lengths = jnp.full((b, k), t + 1, jnp.int32)
        if praxis:
            # Every alive hypothesis's EOS continuation is a finished candidate; the beam is
            # refilled by the two-stage top-k, EOS penalised (Praxis' two_stage_topk).
            eos_lp = alive_lp + step_lp[:, :, eos_id]
            finished = finished.merge(eos_lp, lengths, alive_tokens.at[:, :, t].set(eos_id), alpha, base)
            first_lp, first_token = jax.lax.top_k(step_lp, k)  # [b, k, k]
            cand = alive_lp[..., None] + first_lp - _PRAXIS_PENALTY * (first_token == eos_id)
            top_lp, best = jax.lax.top_k(cand.reshape(b, k * k), k)
            parent = best // k
            token = jnp.take_along_axis(first_token.reshape(b, k * k), best, axis=1).astype(jnp.int32)
            tokens = jax.vmap(lambda rows, p: rows[p])(alive_tokens, parent).at[:, :, t].set(token)
            alive_lp = top_lp
        else:
            cand = (alive_lp[..., None] + step_lp).reshape(b, k * v)
            top_lp, best = jax.lax.top_k(cand, k)  # by log-prob: every alive hypothesis has length t
            parent, token = best // v, (best % v).astype(jnp.int32)
            tokens = jax.vmap(lambda rows, p: rows[p])(alive_tokens, parent).at[:, :, t].set(token)
            ends = token == eos_id
            finished = finished.merge(jnp.where(ends, top_lp, -jnp.inf), lengths, tokens, alpha, base)
            alive_lp = jnp.where(ends, -jnp.inf, top_lp)  # a hypothesis that ended leaves the beam
        carry = decoder.select(carry, (jnp.arange(b)[:, None] * k + parent).reshape(-1))
        logits, carry = decoder.extend(token.reshape(-1), carry, t)
        return (logits, carry, (alive_lp, tokens), finished), None

    state, _ = jax.lax.scan(step, (logits, carry, alive, finished), jnp.arange(max_new_tokens, dtype=jnp.int32))
    _, _, (alive_lp, alive_tokens), finished = state
    if not praxis:  # hypotheses still alive after max_new_tokens end there, without EOS
        finished = finished.merge(alive_lp, jnp.full((b, k), max_new_tokens, jnp.int32), alive_tokens, alpha, base)
    return BeamResult(finished.tokens, finished.scores, finished.log_probs, finished.lengths)


class _Finished(NamedTuple):
    """The K best finished hypotheses of each example so far, best first (-inf: none yet)."""

    scores: Float[Array, "batch beam"]
    log_probs: Float[Array, "batch beam"]
    lengths: Int[Array, "batch beam"]
    tokens: Int[Array, "batch beam new"]

    def merge(self, log_probs, lengths, tokens, alpha: float, base: float) -> _Finished:
        """These K plus new candidates (log-prob -inf = not a candidate), the K best kept."""
        scores = jnp.where(jnp.isfinite(log_probs), length_normalize(log_probs, lengths, alpha, base), -jnp.inf)
        both = [jnp.concatenate(pair, axis=1) for pair in zip(self, (scores, log_probs, lengths, tokens))]
        _, keep = jax.lax.top_k(both[0], self.scores.shape[1])
        return _Finished(*(jax.vmap(lambda rows, i: rows[i])(x, keep) for x in both))


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
