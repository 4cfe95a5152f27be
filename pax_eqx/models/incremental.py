"""The one protocol decoding is written against: start, extend one token, select rows.

Sampling/greedy (`pax_eqx.models.decoding.sample`) and beam search
(`pax_eqx.models.beam_search.beam_search`) take any `IncrementalDecoder`, so every model that
writes these three methods gets both, and both are one jitted program:

    logits, carry = decoder.start()                  # [N, vocab]: the first new token
    for t in range(max_new_tokens):
        tokens = choose(logits)                      # [N]
        logits, carry = decoder.extend(tokens, carry, t)
        carry = decoder.select(carry, rows)          # beam search: reorder / tile rows

`carry` is any pytree of arrays (KV caches, positions, masks; a seq2seq model adds the
encoder's cross-attention keys and values) with the batch rows on the axis the decoder
chooses: only `select` needs to know where. The decoder is an `eqx.Module` holding the model
and its inputs (prompts, source sentences) as fields, so it passes through `eqx.filter_jit`
whole; its shapes (not the number of new tokens) fix what is compiled.

`language_model_decoder.LanguageModelDecoder` implements it for `LanguageModel` over
`init_cache` / `extend_step`; this module imports no model, so decoding (`sampler`,
`beam_search`, `decoding`, the strategies) depends on the protocol alone.
"""

from __future__ import annotations

import abc
from typing import Any

import equinox as eqx
from jaxtyping import Array, Float, Int

Carry = Any  # a pytree of arrays with the decoder's rows on an axis of its choosing


class IncrementalDecoder(eqx.Module):
    """A model and its inputs, decoded one token at a time over N rows (see the module docstring)."""

    @abc.abstractmethod
    def start(self) -> tuple[Float[Array, "rows vocab"], Carry]:
        """Logits for the first new token of every row, and the decoding state after the inputs
        (a prompt prefilled, a source sentence encoded)."""

    @abc.abstractmethod
    def extend(
        self, tokens: Int[Array, " rows"], carry: Carry, t: Int[Array, ""]
    ) -> tuple[Float[Array, "rows vocab"], Carry]:
        """Feeds the t-th new token of every row (t = 0 for the one chosen from `start`'s
        logits) and returns the logits for the next. `t` is a traced scalar: the same
        program runs every step."""

    @abc.abstractmethod
    def select(self, carry: Carry, rows: Int[Array, " n"]) -> Carry:
        """The state of rows `rows` (a gather: indices may repeat, e.g. [0,0,0,1,1,1] tiles
        2 rows into 2 x 3 beams; beam search reorders hypotheses by their parents)."""
