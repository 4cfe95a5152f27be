"""Decoding a model: `SampleConfig` (how long, where to stop, and the strategy: sample, greedy or
beam search, a choice of configs in decode_strategies/), `sample` on any `IncrementalDecoder`,
and `generate` / `beam_search_lm` for the prompts of a model with a `max_seq_len` (a
LanguageModel: its `incremental_decoder` left-pads them). It imports no model: only the
`IncrementalDecoder` protocol and the `PromptDecoding` it asks of a model.

The token loop is `sampler.draw_tokens` (`start` + `max_new_tokens` `extend` steps in a
`lax.scan`, one jitted program; rows that hit EOS keep emitting `pad_id`); beam search is
`pax_eqx.models.beam_search`, on the same protocol. `generate` left-pads prompts to a common
length P, so every row's next token is written to the same cache slot (padded slots are masked
and positions count only real tokens, so a prompt gives the same continuation alone or in a
batch), and a drawing strategy slides a window past `max_seq_len`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

import jax
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, check_range, config
from pax_eqx.models import decode_strategies  # noqa: F401  (every strategy registers itself)
from pax_eqx.models.beam_search import nbest_lists
from pax_eqx.models.decode_strategies.sample import SampleStrategy
from pax_eqx.models.decode_strategy import DecodeStrategy
from pax_eqx.models.incremental import IncrementalDecoder
from pax_eqx.models.sampler import cut_at_eos, draw_tokens, filter_logits  # noqa: F401  (re-exported)

# The fields a strategy holds that SampleConfig held before strategies were choices.
_SAMPLING = ("temperature", "top_k", "top_p", "seed")
_BEAM = ("beam_size", "length_norm_alpha", "beam_style")


@config
class SampleConfig(Config):
    """How continuations are chosen by a model that decodes.

    max_new_tokens: tokens to generate.
    eos_id: the token that ends a continuation; -1 = the tokenizer's eos in the programs (never
      stop, for a direct call).
    strategy: sample (temperature, top-k, top-p, seed), greedy, or beam (beam size, length
      penalty, Praxis or pax_eqx style), a choice (`--decode.strategy beam`; each strategy's
      fields in its file of pax_eqx/models/decode_strategies/). Its fields are flags of
      `decode.` too (`--decode.temperature` is `--decode.strategy.temperature`).
    """

    flattened: ClassVar[tuple[str, ...]] = ("strategy",)

    max_new_tokens: int = 200
    eos_id: int = -1
    strategy: DecodeStrategy = SampleStrategy()

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        check_range(self, "max_new_tokens", gt=0, prefix="decode")
        check_range(self, "eos_id", ge=-1, prefix="decode", note="-1 = the tokenizer's eos, or none")

    @classmethod
    def migrate(cls, data: dict[str, Any]) -> dict[str, Any]:
        """An older config.json's flat decoding fields (`beam_size`, `temperature`, ...) as the
        strategy they chose: beam_size > 1 a beam, else sampling (greedy at temperature 0)."""
        if "strategy" in data or not any(k in data for k in _SAMPLING + _BEAM):
            return data
        sampling = {k: data.pop(k) for k in _SAMPLING if k in data}
        beam = {k: data.pop(k) for k in _BEAM if k in data}
        if beam.get("beam_size", 1) > 1:
            data["strategy"] = {"kind": "beam", **beam}
        elif sampling.get("temperature", 0.8) == 0:
            data["strategy"] = {"kind": "greedy"}
        else:
            data["strategy"] = {"kind": "sample", **sampling}
        return data


def sample_token(logits: Float[Array, "batch vocab"], key: PRNGKeyArray, cfg: SampleConfig) -> Int[Array, " batch"]:
    """One token of every row, as `cfg`'s strategy draws it."""
    return cfg.strategy.draw(cfg.eos_id).token(logits, key)


def sample(
    decoder: IncrementalDecoder,
    cfg: SampleConfig,
    key: PRNGKeyArray,
    pad_id: int = 0,
    max_new_tokens: int | None = None,
) -> tuple[Int[Array, "batch new"], Float[Array, " batch"]]:
    """Draws `max_new_tokens` (default `cfg.max_new_tokens`) tokens for every row of `decoder` as
    `cfg.strategy` draws them (sample or greedy), as one jitted program (sampler.draw_tokens).

    Returns the tokens [B, new] (a row that emitted `cfg.eos_id` emits `pad_id` after it) and
    log_probs [B]: the sum of the model's log-softmax (temperature 1, no top-k/top-p) of every
    emitted token up to and including EOS -- the score beam search maximises, so the two can be
    compared (`beam_search` with beam_size 1 returns the same tokens and log-prob as greedy).
    """
    new = cfg.max_new_tokens if max_new_tokens is None else max_new_tokens
    return draw_tokens(decoder, cfg.strategy.draw(cfg.eos_id), key, pad_id, new)


@runtime_checkable
class PromptDecoding(Protocol):
    """What `generate` and `beam_search_lm` ask of a model (a LanguageModel answers): its
    context length, and a decoder of prompts left-padded to `length` tokens (default: the
    longest) with room for `max_new_tokens` more."""

    max_seq_len: int

    def incremental_decoder(
        self, prompts: list[list[int]], max_new_tokens: int, pad_id: int, bos_id: int = 0, length: int | None = None
    ) -> IncrementalDecoder: ...


def generate(
    model: PromptDecoding,
    prompts: list[list[int]],
    cfg: SampleConfig,
    key: PRNGKeyArray,
    pad_id: int = 0,
) -> list[list[int]]:
    """Continuations of each prompt (token ids), cut after `cfg.eos_id` (excluded): the best
    output of `cfg.strategy`.

    A model is trained on at most `max_seq_len` tokens (and a learned position table has no
    rows past it), so longer generations of a strategy that draws a token at a time slide a
    window, as nanoGPT does: the context is cropped to its last max_seq_len // 2 tokens,
    re-prefilled at positions 0.., and extended to max_seq_len; every window has the same
    shapes, so it compiles once. A beam slides no window: prompt + max_new_tokens must fit.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ConfigError("every prompt needs at least one token.")
    longest = max(len(p) for p in prompts)
    if longest + cfg.max_new_tokens <= model.max_seq_len or not cfg.strategy.slides_window:
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
    """The strategy's best output of prompts left-padded to `length`, one jitted program."""
    decoder = model.incremental_decoder(prompts, cfg.max_new_tokens, pad_id, length=length)
    return np.asarray(cfg.strategy.best(decoder, cfg, key, pad_id)).tolist()


def beam_search_lm(
    model: PromptDecoding, prompts: list[list[int]], cfg: SampleConfig, pad_id: int = 0
) -> list[list[tuple[list[int], float]]]:
    """Each prompt's n-best list under `cfg.strategy` (a beam): up to beam_size (continuation ids
    cut before `cfg.eos_id`, length-normalised score), best first. Slots no hypothesis reached
    (-inf, only when beam_size exceeds the distinct continuations) are left out.

    Beam search slides no window (the hypotheses' caches would have to be re-prefilled), so
    the longest prompt plus `cfg.max_new_tokens` must fit in `model.max_seq_len`.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ConfigError("every prompt needs at least one token.")
    decoder = model.incremental_decoder(prompts, cfg.max_new_tokens, pad_id)
    result = cfg.strategy.beams(decoder, cfg, pad_id)
    if result is None:
        raise ConfigError(
            f"beam_search_lm needs decode.strategy beam, not {cfg.strategy.kind!r}; pass "
            "SampleConfig(strategy=BeamStrategy(beam_size=...))."
        )
    return nbest_lists(result, cfg.eos_id)


def check_prompt(tokenizer: Any, prompt: str) -> None:
    """ValueError naming the characters of `prompt` the tokenizer cannot encode (checked before
    a run or a restore starts, not after it)."""
    bad = tokenizer.unknown_characters(prompt)
    if bad:
        raise ConfigError(
            f"decode.prompt (--prompt) {prompt!r} has characters outside the vocabulary: {bad!r}; "
            "remove them, or use a tokenizer that covers them (data.tokenizer.byte_fallback, or the byte tokenizer)."
        )


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
