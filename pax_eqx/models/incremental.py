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

`LanguageModelDecoder` implements it for `LanguageModel` over `init_cache` / `extend_step`.
"""

from __future__ import annotations

import abc
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from pax_eqx.config import ConfigError
from pax_eqx.layers.attentions import KVCache
from pax_eqx.models.language_model import LanguageModel

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


class LanguageModelCarry(NamedTuple):
    """cache: every layer's keys/values; key_valid [rows, max_len]: slots holding real tokens
    (False for left padding and for slots not written yet); next_pos [rows]: the position of
    the next token (counting only real tokens, so padding does not shift a prompt)."""

    cache: KVCache | tuple[KVCache, ...]
    key_valid: Bool[Array, "rows max_len"]
    next_pos: Int[Array, " rows"]


class LanguageModelDecoder(IncrementalDecoder):
    """A `LanguageModel` continuing left-padded prompts.

    prompt [B, P]: token ids, shorter prompts padded on the left so every row's t-th new token
    is written to the same cache slot P + t; prompt_valid [B, P]: True on real tokens.
    max_len: cache slots, at least P + the number of new tokens (static: it sizes the cache).
    A prompt gives the same continuation alone or in a batch: padded slots are masked
    (`key_valid`) and positions count only real tokens.
    """

    model: LanguageModel
    prompt: Int[Array, "batch prompt"]
    prompt_valid: Bool[Array, "batch prompt"]
    max_len: int = eqx.field(static=True)

    @classmethod
    def from_prompts(
        cls,
        model: LanguageModel,
        prompts: list[list[int]],
        max_new_tokens: int,
        pad_id: int = 0,
        length: int | None = None,
    ) -> LanguageModelDecoder:
        """Left-pads `prompts` (lists of ids, none empty) to `length` (default: the longest);
        the cache holds `length + max_new_tokens` slots, which must fit in `model.max_seq_len`
        (ConfigError otherwise: a learned position table has no rows past it)."""
        length = max(len(p) for p in prompts) if length is None else length
        if length + max_new_tokens > model.max_seq_len:
            raise ConfigError(
                f"a prompt of {length} tokens + {max_new_tokens} new tokens (decode.max_new_tokens) needs "
                f"{length + max_new_tokens} positions, more than model.max_seq_len={model.max_seq_len}; lower "
                "decode.max_new_tokens or shorten the prompt (only sampling with `generate` slides a window "
                "past max_seq_len)."
            )
        ids = np.full((len(prompts), length), pad_id, np.int32)
        valid = np.zeros((len(prompts), length), bool)
        for i, p in enumerate(prompts):
            ids[i, length - len(p) :] = p
            valid[i, length - len(p) :] = True
        return cls(model, jnp.asarray(ids), jnp.asarray(valid), length + max_new_tokens)

    def start(self) -> tuple[Float[Array, "batch vocab"], LanguageModelCarry]:
        """Prefills the whole prompt at slot 0 (one `extend_step`)."""
        b, p = self.prompt.shape
        dtype = jax.tree.leaves(eqx.filter(self.model, eqx.is_inexact_array))[0].dtype
        cache = self.model.init_cache(b, self.max_len, dtype)
        key_valid = jnp.zeros((b, self.max_len), bool).at[:, :p].set(self.prompt_valid)
        positions = jnp.maximum(jnp.cumsum(self.prompt_valid, axis=1) - 1, 0).astype(jnp.int32)
        logits, cache = self.model.extend_step(self.prompt, cache, jnp.int32(0), positions, key_valid)
        return logits[:, -1], LanguageModelCarry(cache, key_valid, positions[:, -1] + 1)

    def extend(
        self, tokens: Int[Array, " rows"], carry: LanguageModelCarry, t: Int[Array, ""]
    ) -> tuple[Float[Array, "rows vocab"], LanguageModelCarry]:
        """Writes token t of every row at slot P + t and returns the next logits."""
        slot = self.prompt.shape[1] + t
        key_valid = carry.key_valid.at[:, slot].set(True)
        pos = carry.next_pos
        logits, cache = self.model.extend_step(tokens[:, None], carry.cache, slot, pos[:, None], key_valid)
        return logits[:, -1], LanguageModelCarry(cache, key_valid, pos + 1)

    def select(self, carry: LanguageModelCarry, rows: Int[Array, " n"]) -> LanguageModelCarry:
        cache = self.model.stack.select_cache(carry.cache, rows)  # the stack knows its cache layout
        return LanguageModelCarry(cache, carry.key_valid[rows], carry.next_pos[rows])
