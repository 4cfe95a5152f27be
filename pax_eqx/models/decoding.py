"""Sampling: greedy, temperature, top-k, top-p, EOS stop; `generate` for a LanguageModel.

`sample` takes any `IncrementalDecoder` (`pax_eqx.models.incremental`): the whole loop (`start`
+ `max_new_tokens` `extend` steps in a `lax.scan`) is one jitted program; rows that hit EOS
keep emitting `pad_id`. `generate` runs it on a LanguageModel's prompts (left-padded to a
common length P, so every row's next token is written to the same cache slot; padded slots are
masked and positions count only real tokens, so a prompt gives the same continuation alone or
in a batch), sliding a window past `max_seq_len`. Beam search (`beam_size > 1`) is
`pax_eqx.models.beam_search`, on the same protocol.
"""

from __future__ import annotations

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, check_range, config
from pax_eqx.models.incremental import IncrementalDecoder, LanguageModelDecoder
from pax_eqx.models.language_model import LanguageModel


@config
class SampleConfig(Config):
    """How continuations are drawn from a model that decodes.

    max_new_tokens: tokens to generate.
    temperature: divides the logits before sampling; 0 = greedy (argmax).
    top_k: sample among the k most likely tokens; 0 = off.
    top_p: nucleus sampling, among the fewest tokens holding this probability; 1.0 = off.
    eos_id: the token that ends a continuation; -1 = the tokenizer's eos in the programs (never
      stop, for a direct call).
    beam_size: 1 = sample (greedy at temperature 0); > 1 = beam search keeping that many
      hypotheses, scored by the model's log-probs (temperature, top-k and top-p do not apply).
    length_norm_alpha: beam search ranks hypotheses by log-prob / ((5 + length) / 6) ** alpha
      (GNMT's length penalty, Pax's BeamSearchHParams.length_norm_alpha); 0 = raw log-prob,
      larger favours longer hypotheses.
    beam_style: "pax_eqx" (this search) or "praxis" (Praxis' beam_search: every hypothesis's EOS
      continuation offered each step, the penalty's base 5, only ended hypotheses returned;
      models.beam_search).
    """

    max_new_tokens: int = 200
    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 1.0
    eos_id: int = -1
    beam_size: int = 1
    length_norm_alpha: float = 0.8
    beam_style: Literal["pax_eqx", "praxis"] = "pax_eqx"

    def inert_fields(self) -> dict[str, str]:
        """What the decoding mode does not read: sampling options under beam search or greedy
        decoding, the length penalty when sampling."""
        if self.beam_size > 1:
            why = f"decode.beam_size={self.beam_size} runs beam search, which does not sample"
            return {"temperature": why, "top_k": why, "top_p": why}
        why = "decode.beam_size=1 samples and ranks nothing"
        inert = {"length_norm_alpha": why, "beam_style": why}
        if self.temperature == 0:
            why = "decode.temperature=0 decodes greedily (argmax), which does not sample"
            inert.update(top_k=why, top_p=why)
        return inert

    def validate(self, modes: bool = True) -> None:
        """Raises ConfigError naming the field, the value and the fix. modes=False checks each
        value alone, not which fields the mode (sampling or beam search) reads: an experiment's
        settings are for its default mode, and the decode program checks the mode it runs."""
        check_range(self, "max_new_tokens", gt=0, prefix="decode")
        check_range(self, "temperature", ge=0, prefix="decode", note="0 = greedy")
        check_range(self, "top_p", gt=0, le=1, prefix="decode", note="1 = off")
        check_range(self, "top_k", ge=0, prefix="decode", note="0 = off")
        check_range(self, "eos_id", ge=-1, prefix="decode", note="-1 = the tokenizer's eos, or none")
        check_range(
            self, "beam_size", ge=1, prefix="decode", note="1 = sample, > 1 = beam search",
            fix="Pass e.g. --decode.beam-size 4.",
        )  # fmt: skip
        check_range(
            self, "length_norm_alpha", ge=0, prefix="decode", note="0 = rank by raw log-prob",
            fix="Pass e.g. --decode.length-norm-alpha 0.8.",
        )  # fmt: skip
        if self.beam_style not in ("pax_eqx", "praxis"):
            raise ConfigError(f"decode.beam_style={self.beam_style!r} is not one of ('pax_eqx', 'praxis').")
        if not modes:
            return
        default = SampleConfig()
        if self.beam_size > 1:
            for name in ("top_k", "top_p"):
                if getattr(self, name) != getattr(default, name):
                    raise ConfigError(
                        f"decode.{name}={getattr(self, name)} has no effect with decode.beam_size={self.beam_size}: "
                        "beam search keeps the best hypotheses by the model's log-probs, it does not sample; "
                        f"leave decode.{name} at {getattr(default, name)} or set decode.beam_size=1."
                    )
        elif self.beam_style != default.beam_style:
            raise ConfigError(
                f"decode.beam_style={self.beam_style!r} has no effect with decode.beam_size=1 (sampling runs no "
                f"beam); set decode.beam_size > 1 or leave beam_style at {default.beam_style!r}."
            )
        elif self.length_norm_alpha != default.length_norm_alpha:
            raise ConfigError(
                f"decode.length_norm_alpha={self.length_norm_alpha} has no effect with decode.beam_size=1 "
                "(sampling ranks nothing); set decode.beam_size > 1 or leave length_norm_alpha at "
                f"{default.length_norm_alpha}."
            )


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


class _Draw(eqx.Module):
    """A SampleConfig as the compiled sampler sees it: what shapes the program is static (greedy or
    not, top-k's k, top-p on or off), the numbers are arrays. A new temperature, top-p or EOS id
    then reuses the compiled decode instead of compiling it again."""

    greedy: bool = eqx.field(static=True)
    top_k: int = eqx.field(static=True)
    nucleus: bool = eqx.field(static=True)
    temperature: Float[Array, ""]
    top_p: Float[Array, ""]
    eos_id: Int[Array, ""]

    @staticmethod
    def of(cfg: SampleConfig) -> _Draw:
        return _Draw(
            greedy=cfg.temperature == 0.0, top_k=cfg.top_k, nucleus=cfg.top_p < 1.0,
            temperature=jnp.float32(cfg.temperature), top_p=jnp.float32(cfg.top_p), eos_id=jnp.int32(cfg.eos_id),
        )  # fmt: skip

    def token(self, logits: Float[Array, "batch vocab"], key: PRNGKeyArray) -> Int[Array, " batch"]:
        logits = logits.astype(jnp.float32)
        if self.greedy:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        logits = filter_logits(logits / self.temperature, self.top_k, self.top_p, self.nucleus)
        return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def sample_token(logits: Float[Array, "batch vocab"], key: PRNGKeyArray, cfg: SampleConfig) -> Int[Array, " batch"]:
    return _Draw.of(cfg).token(logits, key)


def sample(
    decoder: IncrementalDecoder,
    cfg: SampleConfig,
    key: PRNGKeyArray,
    pad_id: int = 0,
    max_new_tokens: int | None = None,
) -> tuple[Int[Array, "batch new"], Float[Array, " batch"]]:
    """Samples (greedy at temperature 0) `max_new_tokens` (default `cfg.max_new_tokens`) tokens
    for every row of `decoder`, as one jitted program (`start`, then a `lax.scan` of `extend`).

    Returns the tokens [B, new] (a row that emitted `cfg.eos_id` emits `pad_id` after it) and
    log_probs [B]: the sum of the model's log-softmax (temperature 1, no top-k/top-p) of every
    emitted token up to and including EOS -- the score beam search maximises, so the two can be
    compared (`beam_search` with beam_size 1 returns the same tokens and log-prob as greedy).
    """
    cfg.validate()
    if cfg.beam_size > 1:
        raise ConfigError(
            f"sample() draws one continuation per row, but decode.beam_size={cfg.beam_size}; "
            "call pax_eqx.models.beam_search.beam_search, or set decode.beam_size=1."
        )
    new = cfg.max_new_tokens if max_new_tokens is None else max_new_tokens
    return _sample(decoder, _Draw.of(cfg), key, pad_id, new)


@eqx.filter_jit
def _sample(
    decoder: IncrementalDecoder, draw: _Draw, key: PRNGKeyArray, pad_id: int, max_new_tokens: int
) -> tuple[Int[Array, "batch new"], Float[Array, " batch"]]:
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
    logits: Float[Array, "batch vocab"], key: PRNGKeyArray, draw: _Draw
) -> tuple[Int[Array, " batch"], Float[Array, " batch"]]:
    """The next token of every row and its log-probability under the model (float32)."""
    token = draw.token(logits, key)
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return token, jnp.take_along_axis(log_probs, token[:, None], axis=-1)[:, 0]


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

    With `cfg.beam_size > 1`, each prompt's best beam-search hypothesis (no window: prompt +
    max_new_tokens must fit in max_seq_len); `key` is then unused.
    """
    cfg.validate()
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ConfigError("every prompt needs at least one token.")
    if cfg.beam_size > 1:
        from pax_eqx.models.beam_search import beam_search_lm  # it imports this module

        return [nbest[0][0] if nbest else [] for nbest in beam_search_lm(model, prompts, cfg, pad_id)]
    longest = max(len(p) for p in prompts)
    if longest + cfg.max_new_tokens <= model.max_seq_len:
        return cut_at_eos(_run(model, prompts, longest, cfg, key, pad_id), cfg.eos_id)
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
    return cut_at_eos([n[: cfg.max_new_tokens] for n in new], cfg.eos_id)


def _run(model, prompts, length, cfg, key, pad_id) -> list[list[int]]:
    """One jitted prefill + extend loop over prompts left-padded to `length`."""
    decoder = LanguageModelDecoder.from_prompts(model, prompts, cfg.max_new_tokens, pad_id, length=length)
    return np.asarray(sample(decoder, cfg, key, pad_id)[0]).tolist()


def cut_at_eos(rows: list[list[int]], eos_id: int) -> list[list[int]]:
    """Each row up to (not including) its first `eos_id`."""
    return [row[: row.index(eos_id)] if eos_id in row else row for row in rows]


def check_utf8(prompt: str) -> None:
    """ConfigError for a prompt that is not text: bytes that are not UTF-8 reach Python's argv
    as lone surrogates, which no tokenizer can encode (the run would fail at its final sample)."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raw = prompt.encode("utf-8", "surrogateescape")
        raise ConfigError(
            f"decode.prompt={raw!r} is not UTF-8 text (the bytes at {e.start}..{e.end - 1} are not); "
            "give the prompt as UTF-8 text."
        ) from None
