"""The two compiled programs of continuous batching, over one KV cache of `slots` rows.

Praxis' LanguageModelContinuousBatching keeps a fixed number of decode slots; a request is
prefilled into a free slot and every generate step extends all slots by one token. Here:

    state = programs.empty()                                  # SlotState: cache, key_valid, length
    state, token = programs.prefill(params, state, slot, chunk, n_valid, start, settings)
    state, tokens = programs.generate(params, state, tokens, active, sampling)

Shapes are fixed by (slots, cache_len, chunk): `prefill` takes one request's prompt a chunk of
`chunk` tokens at a time (a long prompt is several calls, so a generate step for the other slots
can run between them), `generate` one token for every slot. Every per-request value (slot,
lengths, sampling settings) is traced, so traffic never compiles a third program
(`trace_counts` counts the traces).

Cache layout: a slot's token at position p lives in cache slot p of its row (no left padding),
so each row has its own write position (`length`), and `key_valid` marks what a row may attend
to. A rolling window for local attention keeps the layout and writes at `p % window`.
The cache is `cache_len` = max_seq_len rounded up to whole chunks: a chunk's padding never
writes past the end (a clamped write would move onto real tokens).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from pax_eqx.serving.row_sampling import RowSampling, choose_rows


class SlotState(eqx.Module):
    """cache: the stack's KV caches with `slots` batch rows; key_valid [slots, cache_len]: the
    cache slots each row attends to; length [slots]: tokens in each row (= the next token's
    position and cache slot)."""

    cache: Any
    key_valid: Bool[Array, "slots cache_len"]
    length: Int[Array, " slots"]


class SlotPrograms:
    """`prefill` and `generate` of one model over `slots` decode slots (see the module docstring).

    model: a LanguageModel (init_cache / extend_step / stack.select_cache / write_cache_rows /
    max_seq_len); its arrays are an argument of both programs (`params`), not constants.
    """

    def __init__(self, model: Any, *, slots: int, chunk: int, dtype: Any = None) -> None:
        if slots < 1 or chunk < 1:
            raise ValueError(f"slots={slots} and chunk={chunk} must be >= 1.")
        self.params, self._static = eqx.partition(model, eqx.is_array)
        self.slots, self.chunk = slots, chunk
        self.max_seq_len = model.max_seq_len
        self.cache_len = -(-model.max_seq_len // chunk) * chunk
        leaves = jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array))
        self.dtype = dtype or leaves[0].dtype
        self.trace_counts: Counter[str] = Counter()
        self.prefill = jax.jit(self._prefill, donate_argnums=1)
        self.generate = jax.jit(self._generate, donate_argnums=1)

    def empty(self) -> SlotState:
        """Every slot free: a zero cache, nothing valid, length 0."""
        model = eqx.combine(self.params, self._static)
        return SlotState(
            cache=model.init_cache(self.slots, self.cache_len, self.dtype),
            key_valid=jnp.zeros((self.slots, self.cache_len), bool),
            length=jnp.zeros((self.slots,), jnp.int32),
        )

    def _prefill(
        self,
        params: Any,
        state: SlotState,
        slot: Int[Array, ""],
        chunk: Int[Array, " chunk"],
        n_valid: Int[Array, ""],
        start: Int[Array, ""],
        sampling: RowSampling,
    ) -> tuple[SlotState, Int[Array, ""]]:
        """Writes `chunk[:n_valid]` (a request's prompt tokens at positions [start, start +
        n_valid)) into row `slot` and draws the token after them with the request's settings
        (`sampling`, one row). Row `slot` is taken out of the cache, extended alone (a
        request's prefill costs one row, not `slots`), and written back."""
        self.trace_counts["prefill"] += 1
        model = eqx.combine(params, self._static)
        stack = model.stack
        rows = slot[None]
        row_cache = stack.select_cache(state.cache, rows)
        valid = jnp.arange(self.cache_len) < start + n_valid
        positions = jnp.minimum(start + jnp.arange(self.chunk), self.max_seq_len - 1)[None]
        logits, row_cache = model.extend_step(chunk[None], row_cache, start, positions, valid[None])
        token = choose_rows(jax.lax.dynamic_index_in_dim(logits[0], n_valid - 1, keepdims=True), sampling)[0]
        return SlotState(
            cache=stack.write_cache_rows(state.cache, rows, row_cache),
            key_valid=state.key_valid.at[slot].set(valid),
            length=state.length.at[slot].set(start + n_valid),
        ), token

    def _generate(
        self,
        params: Any,
        state: SlotState,
        tokens: Int[Array, " slots"],
        active: Bool[Array, " slots"],
        sampling: RowSampling,
    ) -> tuple[SlotState, Int[Array, " slots"]]:
        """Feeds each active slot's last token at its own position and draws the next; the other
        slots compute too (the shapes are fixed) and keep their length. Every row writes at its
        `length`, a cache slot it does not attend to yet: a slot between two chunks of its prompt
        is inactive here, and a write at position 0 would overwrite its first token's keys and
        values (its next chunk writes over `length` before attending to it; in a rolling window,
        slot `length % window` holds a position already outside every later query's window)."""
        self.trace_counts["generate"] += 1
        model = eqx.combine(params, self._static)
        write = state.length
        rows = jnp.arange(self.slots)
        key_valid = state.key_valid.at[rows, write].set(active | state.key_valid[rows, write])
        positions = jnp.minimum(write, self.max_seq_len - 1)[:, None]
        logits, cache = model.extend_step(tokens[:, None], state.cache, write, positions, key_valid)
        length = state.length + active.astype(jnp.int32)
        return SlotState(cache, key_valid, length), choose_rows(logits[:, -1], sampling)
