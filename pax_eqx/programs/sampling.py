"""Text in, text out: encode a prompt, sample continuations, decode them (decode CLI + end of training)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from pax_eqx.config import ConfigError
from pax_eqx.models.decoding import generate


def check_prompt(tokenizer: Any, prompt: str) -> None:
    """ValueError naming the characters of `prompt` the tokenizer cannot encode (checked before
    a run or a restore starts, not after it)."""
    bad = tokenizer.unknown_characters(prompt)
    if bad:
        raise ConfigError(
            f"decode.prompt (--prompt) {prompt!r} has characters outside the vocabulary: {bad!r}; "
            "remove them, or use a tokenizer that covers them (data.tokenizer.byte_fallback, or the byte tokenizer)."
        )


def sample_text(rt: Any, state: Any, decode_cfg: Any) -> list[str]:
    tokenizer = rt.tokenizer
    check_prompt(tokenizer, decode_cfg.prompt)
    prompt = tokenizer.encode(decode_cfg.prompt)
    model = rt.programs.task.model(state.params if state.ema is None else state.ema)
    eos = tokenizer.eos_id if decode_cfg.eos_id < 0 else decode_cfg.eos_id
    cfg = decode_cfg.replace(eos_id=eos)  # a DecodeConfig is a SampleConfig
    key = jax.random.PRNGKey(decode_cfg.seed)
    outs = generate(model, [prompt] * decode_cfg.num_samples, cfg, key, pad_id=tokenizer.pad_id)
    return [decode_cfg.prompt + tokenizer.decode(ids) for ids in outs]


def print_samples(rt: Any, state: Any, decode_cfg: Any, log: Callable = print) -> list[str]:
    texts = sample_text(rt, state, decode_cfg)
    for i, text in enumerate(texts):
        settings = f"temperature {decode_cfg.temperature}, top_k {decode_cfg.top_k}, top_p {decode_cfg.top_p}"
        log(f"--- sample {i} ({settings}) ---")
        log(text)
    return texts
