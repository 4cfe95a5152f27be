"""Sampling from a LanguageModel with a KV cache: greedy, temperature, top-k, top-p, EOS stop.

Prompts of different lengths are left-padded to a common length P, so every row's next token
is written to the same cache slot; padded slots are masked out (`key_valid`) and positions
count only real tokens, so a prompt gives the same continuation alone or in a batch.
The whole loop (prefill + `max_new_tokens` extend steps in a `lax.scan`) is one jitted
program; rows that hit EOS keep emitting `pad_id`.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, config
from pax_eqx.models.language_model import LanguageModel


@config
class SampleConfig(Config):
    """max_new_tokens: tokens to generate; temperature: 0 = greedy (argmax);
    top_k: 0 = off; top_p: 1.0 = off (nucleus sampling); eos_id: -1 = never stop early."""

    max_new_tokens: int = 200
    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 1.0
    eos_id: int = -1

    def validate(self) -> None:
        if self.max_new_tokens <= 0:
            raise ConfigError(f"decode.max_new_tokens must be > 0, got {self.max_new_tokens}.")
        if self.temperature < 0:
            raise ConfigError(f"decode.temperature must be >= 0, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"decode.top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < 0:
            raise ConfigError(f"decode.top_k must be >= 0, got {self.top_k}.")


def filter_logits(logits: Float[Array, "batch vocab"], top_k: int, top_p: float) -> Float[Array, "batch vocab"]:
    """Sets logits outside the top-k / nucleus (smallest set with probability >= top_p) to -inf."""
    neg = jnp.finfo(logits.dtype).min
    if top_k > 0:
        kth = jax.lax.top_k(logits, min(top_k, logits.shape[-1]))[0][..., -1:]
        logits = jnp.where(logits < kth, neg, logits)
    if top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        # Keep a token if the probability mass strictly before it is < top_p.
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        cutoff = jnp.min(jnp.where(mass_before < top_p, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, neg, logits)
    return logits


def sample_token(logits: Float[Array, "batch vocab"], key: PRNGKeyArray, cfg: SampleConfig) -> Int[Array, " batch"]:
    logits = logits.astype(jnp.float32)
    if cfg.temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = filter_logits(logits / cfg.temperature, cfg.top_k, cfg.top_p)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


@eqx.filter_jit
def _generate(
    model: LanguageModel,
    prompt: Int[Array, "batch prompt"],
    prompt_valid: Array,
    key: PRNGKeyArray,
    cfg: SampleConfig,
    pad_id: int,
) -> Int[Array, "batch new"]:
    b, p = prompt.shape
    total = p + cfg.max_new_tokens
    dtype = jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array))[0].dtype
    cache = model.init_cache(b, total, dtype)
    key_valid = jnp.zeros((b, total), bool).at[:, :p].set(prompt_valid)
    positions = jnp.maximum(jnp.cumsum(prompt_valid, axis=1) - 1, 0).astype(jnp.int32)
    logits, cache = model.extend_step(prompt, cache, jnp.int32(0), positions, key_valid)
    next_pos = positions[:, -1] + 1
    key, sub = jax.random.split(key)
    token = sample_token(logits[:, -1], sub, cfg)
    done = jnp.zeros((b,), bool)

    def step(carry, t):
        token, cache, key_valid, pos, done, key = carry
        emitted = jnp.where(done, pad_id, token)  # the EOS itself is emitted, pads after it
        done = done | (token == cfg.eos_id)
        slot = p + t
        key_valid = key_valid.at[:, slot].set(True)
        logits, cache = model.extend_step(token[:, None], cache, slot, pos[:, None], key_valid)
        key, sub = jax.random.split(key)
        nxt = sample_token(logits[:, -1], sub, cfg)
        return (nxt, cache, key_valid, pos + 1, done, key), emitted

    carry = (token, cache, key_valid, next_pos, done, key)
    _, emitted = jax.lax.scan(step, carry, jnp.arange(cfg.max_new_tokens, dtype=jnp.int32))
    return emitted.T


def generate(
    model: LanguageModel,
    prompts: list[list[int]],
    cfg: SampleConfig,
    key: PRNGKeyArray,
    pad_id: int = 0,
) -> list[list[int]]:
    """Continuations of each prompt (token ids), cut after `cfg.eos_id` (excluded).

    A model is trained on at most `max_seq_len` tokens (and a learned position table has no
    rows past it), so longer generations slide a window, as nanoGPT does: the context is
    cropped to its last max_seq_len // 2 tokens, re-prefilled at positions 0.., and extended to
    max_seq_len; every window has the same shapes, so it compiles once.
    """
    cfg.validate()
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ConfigError("every prompt needs at least one token.")
    longest = max(len(p) for p in prompts)
    if longest + cfg.max_new_tokens <= model.max_seq_len:
        return _cut_at_eos(_run(model, prompts, longest, cfg, key, pad_id), cfg.eos_id)
    keep = model.max_seq_len // 2
    window = cfg.replace(max_new_tokens=model.max_seq_len - keep)
    contexts = [list(p) for p in prompts]
    new: list[list[int]] = [[] for _ in prompts]
    while min(len(n) for n in new) < cfg.max_new_tokens:
        key, sub = jax.random.split(key)
        outs = _run(model, [c[-keep:] for c in contexts], keep, window, sub, pad_id)
        for i, out in enumerate(outs):
            contexts[i] += out
            new[i] += out
    return _cut_at_eos([n[: cfg.max_new_tokens] for n in new], cfg.eos_id)


def _run(model, prompts, length, cfg, key, pad_id) -> list[list[int]]:
    """One jitted prefill + extend loop over prompts left-padded to `length`."""
    ids = np.full((len(prompts), length), pad_id, np.int32)
    valid = np.zeros((len(prompts), length), bool)
    for i, p in enumerate(prompts):
        ids[i, length - len(p) :] = p
        valid[i, length - len(p) :] = True
    return np.asarray(_generate(model, jnp.asarray(ids), jnp.asarray(valid), key, cfg, pad_id)).tolist()


def _cut_at_eos(rows: list[list[int]], eos_id: int) -> list[list[int]]:
    return [row[: row.index(eos_id)] if eos_id in row else row for row in rows]
