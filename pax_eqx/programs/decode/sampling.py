"""Text in, text out: encode a prompt, sample continuations or beam-search an n-best list, decode
them (decode CLI + end of training).

Nothing here is model- or strategy-specific: the decode strategy (decode_strategies/) answers
what it makes of a prompt and how its outputs are labelled, from the model's `continue_prompts`
or `incremental_decoder`; a model whose config `decodes_inputs` prints its inputs' outputs
instead (seq2seq_decoding), and one that `fills_prompts` (a masked LM) prints its filled prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pax_eqx.models.decoding import check_prompt
from pax_eqx.programs.decode.seq2seq_decoding import print_seq2seq


def _setup(rt: Any, state: Any, decode_cfg: Any) -> tuple[Any, list[int], Any, Any]:
    """(model, encoded prompt, decode config with the tokenizer's EOS, tokenizer)."""
    tokenizer = rt.tokenizer
    check_prompt(tokenizer, decode_cfg.prompt)
    model = rt.programs.task.model(rt.programs.task.inference_params(state))
    eos = tokenizer.eos_id if decode_cfg.eos_id < 0 else decode_cfg.eos_id
    return model, tokenizer.encode(decode_cfg.prompt), decode_cfg.replace(eos_id=eos), tokenizer


def prompt_texts(rt: Any, state: Any, decode_cfg: Any) -> list[tuple[str, float | None]]:
    """What decode_cfg's strategy makes of decode_cfg.prompt: (prompt + continuation, score or
    None), in order -- num_samples samples, or a beam's n-best list best first."""
    model, prompt, cfg, tokenizer = _setup(rt, state, decode_cfg)
    strategy = cfg.strategy
    outputs = strategy.prompt_outputs(model, prompt, cfg, cfg.num_samples, strategy.key(), tokenizer.pad_id,
                                      tokenizer.bos_id)  # fmt: skip
    return [(decode_cfg.prompt + tokenizer.decode(ids), score) for ids, score in outputs]


def print_samples(rt: Any, state: Any, decode_cfg: Any, log: Callable = print) -> list[str]:
    """What the strategy makes of the prompt, printed (samples, or a beam's n-best list with its
    scores); returns the texts. A sequence-to-sequence model prints its inputs' outputs instead
    (seq2seq_decoding)."""
    if rt.exp.model.decodes_inputs:
        return print_seq2seq(rt, state, decode_cfg, log)
    if rt.exp.model.fills_prompts:
        return print_filled(rt, state, decode_cfg, log)
    outputs = prompt_texts(rt, state, decode_cfg)
    heading = decode_cfg.strategy.heading(len(outputs))
    if heading:
        log(f"--- {heading} ---")
    for i, (text, score) in enumerate(outputs):
        log(f"--- {decode_cfg.strategy.label(i, score)} ---")
        log(text)
    return [text for text, _ in outputs]


def print_filled(rt: Any, state: Any, decode_cfg: Any, log: Callable = print) -> list[str]:
    """A model that fills its prompt's gaps (`ModelConfig.fills_prompts`, a masked LM): the prompt
    as the model completes it, printed; returns [that text]."""
    tokenizer = rt.tokenizer
    check_prompt(tokenizer, decode_cfg.prompt)
    model = rt.programs.task.model(rt.programs.task.inference_params(state))
    text = model.fill_prompt(decode_cfg.prompt, tokenizer)
    log("--- filled ---")
    log(text)
    return [text]
