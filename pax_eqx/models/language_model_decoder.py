"""`LanguageModelDecoder`: a `LanguageModel` as an `IncrementalDecoder` (incremental.py), over
its `init_cache` / `extend_step`.

It holds the model as a `Model` (the base contract), not a `LanguageModel`, so that
language_model.py can build it without the two modules importing each other.
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from pax_eqx.config import ConfigError
from pax_eqx.layers.attentions import KVCache
from pax_eqx.models.incremental import IncrementalDecoder
from pax_eqx.models.model import Model


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

    model: Model  # a LanguageModel
    prompt: Int[Array, "batch prompt"]
    prompt_valid: Bool[Array, "batch prompt"]
    max_len: int = eqx.field(static=True)

    @classmethod
    def from_prompts(
        cls,
        model: Model,
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
