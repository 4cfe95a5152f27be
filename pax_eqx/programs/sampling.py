"""Text in, text out: encode a prompt, sample continuations or beam-search an n-best list, decode
them (decode CLI + end of training).

Nothing here is model-specific: the model answers `continue_prompts` (samples) and
`incremental_decoder` (the `IncrementalDecoder` beam search runs on), and a model whose config
`decodes_inputs` prints its inputs' outputs instead (seq2seq_decoding).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from pax_eqx.config import ConfigError
from pax_eqx.models.beam_search import beam_search, length_penalty_base, nbest_lists
from pax_eqx.programs.decode_modes import check_decode, for_mode
from pax_eqx.programs.seq2seq_decoding import print_seq2seq


def check_prompt(tokenizer: Any, prompt: str) -> None:
    """ValueError naming the characters of `prompt` the tokenizer cannot encode (checked before
    a run or a restore starts, not after it)."""
    bad = tokenizer.unknown_characters(prompt)
    if bad:
        raise ConfigError(
            f"decode.prompt (--prompt) {prompt!r} has characters outside the vocabulary: {bad!r}; "
            "remove them, or use a tokenizer that covers them (data.tokenizer.byte_fallback, or the byte tokenizer)."
        )


def _setup(rt: Any, state: Any, decode_cfg: Any) -> tuple[Any, list[int], Any, Any]:
    """(model, encoded prompt, decode config with the tokenizer's EOS, tokenizer)."""
    tokenizer = rt.tokenizer
    check_decode(decode_cfg)
    decode_cfg = for_mode(decode_cfg)
    check_prompt(tokenizer, decode_cfg.prompt)
    model = rt.programs.task.model(rt.programs.task.inference_params(state))
    eos = tokenizer.eos_id if decode_cfg.eos_id < 0 else decode_cfg.eos_id
    return model, tokenizer.encode(decode_cfg.prompt), decode_cfg.replace(eos_id=eos), tokenizer


def sample_text(rt: Any, state: Any, decode_cfg: Any) -> list[str]:
    """decode_cfg.num_samples continuations of decode_cfg.prompt (prompt included)."""
    model, prompt, cfg, tokenizer = _setup(rt, state, decode_cfg)  # a DecodeConfig is a SampleConfig
    key = jax.random.PRNGKey(decode_cfg.seed)
    outs = model.continue_prompts([prompt] * decode_cfg.num_samples, cfg, key, tokenizer.pad_id)
    return [decode_cfg.prompt + tokenizer.decode(ids) for ids in outs]


def beam_text(rt: Any, state: Any, decode_cfg: Any) -> list[tuple[str, float]]:
    """The n-best list of decode_cfg.prompt: (prompt + continuation, length-normalised score),
    best first, up to decode_cfg.beam_size of them."""
    model, prompt, cfg, tokenizer = _setup(rt, state, decode_cfg)
    decoder = model.incremental_decoder([prompt], cfg.max_new_tokens, tokenizer.pad_id, tokenizer.bos_id)
    result = beam_search(
        decoder, beam_size=cfg.beam_size, max_new_tokens=cfg.max_new_tokens, eos_id=cfg.eos_id,
        pad_id=tokenizer.pad_id, length_norm_alpha=cfg.length_norm_alpha, style=cfg.beam_style,
    )  # fmt: skip
    return [(decode_cfg.prompt + tokenizer.decode(ids), score) for ids, score in nbest_lists(result, cfg.eos_id)[0]]


def print_samples(rt: Any, state: Any, decode_cfg: Any, log: Callable = print) -> list[str]:
    """Samples (decode.beam_size 1) or the beam's n-best list, printed; returns the texts. A
    sequence-to-sequence model prints its inputs' outputs instead (seq2seq_decoding)."""
    if rt.exp.model.decodes_inputs:
        return print_seq2seq(rt, state, decode_cfg, log)
    decode_cfg = for_mode(decode_cfg)
    if decode_cfg.beam_size > 1:
        nbest = beam_text(rt, state, decode_cfg)
        log(
            f"--- beam search: {len(nbest)} best of beam_size {decode_cfg.beam_size} (score: log-prob / "
            f"((5 + length) / {length_penalty_base(decode_cfg.beam_style):g}) ** {decode_cfg.length_norm_alpha}) ---"
        )
        for rank, (text, score) in enumerate(nbest, 1):
            log(f"--- {rank} (score {score:.4f}) ---")
            log(text)
        return [text for text, _ in nbest]
    texts = sample_text(rt, state, decode_cfg)
    for i, text in enumerate(texts):
        settings = f"temperature {decode_cfg.temperature}, top_k {decode_cfg.top_k}, top_p {decode_cfg.top_p}"
        log(f"--- sample {i} ({settings}) ---")
        log(text)
    return texts
