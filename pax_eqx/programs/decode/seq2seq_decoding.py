"""Decoding a sequence-to-sequence model in the programs: the decode CLI and the end of training.

The encoder's inputs are `decode.prompt` (sentinels written `<extra_id_N>`), or, when the prompt
is empty, the first `decode.num_samples` eval examples, printed with their targets. Each input
gets the strategy's first-pass output (greedy, or a sample) and, with `--decode.strategy beam`,
the beam's n-best list, every line with its length-normalised score, so greedy and beam compare on
the same scale; a last line gives their means over the inputs.

    input:  ROMEO: <extra_id_0> thou art<extra_id_1> Romeo?
    target: <extra_id_0>wherefore<extra_id_1> ...
    greedy (score -0.412): <extra_id_0>wherefore ...
    beam 1 (score -0.305): ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from pax_eqx.config import ConfigError
from pax_eqx.data import build_input
from pax_eqx.data.span_corruption import decode_with_sentinels, encode_with_sentinels
from pax_eqx.models.beam_search import length_normalize
from pax_eqx.models.decoding import sample


def decodes_examples(exp: Any) -> bool:
    """True when decoding reads eval examples: a model that decodes inputs, with no prompt."""
    return exp.model.decodes_inputs and not exp.decode.prompt


def source_rows(rt: Any, decode_cfg: Any) -> list[tuple[list[int], list[int] | None]]:
    """(input ids ending with eos, target ids or None) for each input to decode."""
    tokenizer = rt.tokenizer
    if decode_cfg.prompt:
        return [(encode_with_sentinels(tokenizer, decode_cfg.prompt) + [tokenizer.eos_id], None)]
    # A fresh single-host eval input: the run's own eval input keeps its position.
    inp = build_input(rt.exp.data, "eval", tokenizer, num_infeed_hosts=1, infeed_host_index=0)
    rows: list[tuple[list[int], list[int] | None]] = []
    try:
        while len(rows) < decode_cfg.num_samples:
            rows += example_pairs(inp.get_next())[: decode_cfg.num_samples - len(rows)]
    except StopIteration:
        pass
    finally:
        inp.close()
    if not rows:
        raise ConfigError("the eval split has no examples to decode; pass --decode.prompt '...'.")
    return rows


def example_pairs(batch: dict[str, np.ndarray]) -> list[tuple[list[int], list[int]]]:
    """(input ids, target ids) of each real row of a host batch (a padding row of the eval epoch,
    all inputs padded, is left out)."""
    pairs = []
    for inputs, in_pad, targets, tgt_pad in zip(
        batch["inputs"], batch["input_paddings"], batch["targets"], batch["target_paddings"], strict=True
    ):
        if not np.all(in_pad > 0.5):
            pairs.append((inputs[in_pad < 0.5].tolist(), targets[tgt_pad < 0.5].tolist()))
    return pairs


def decode_rows(
    model: Any, rows: list[list[int]], decode_cfg: Any, pad_id: int, start_id: int
) -> tuple[np.ndarray, np.ndarray, Any]:
    """(first-pass tokens [B, new], their normalised scores [B], the BeamResult or None): the
    strategy's first pass (greedy beside a beam, else the strategy itself) and a search's beams."""
    strategy = decode_cfg.strategy
    decoder = model.incremental_decoder(rows, decode_cfg.max_new_tokens, pad_id, start_id)
    first = decode_cfg.replace(strategy=strategy.first_pass())
    tokens, log_probs = sample(decoder, first, strategy.key(), pad_id)
    tokens, log_probs = np.asarray(tokens), np.asarray(log_probs)
    ended = tokens == decode_cfg.eos_id
    lengths = np.where(ended.any(1), ended.argmax(1) + 1, tokens.shape[1])
    alpha, base = strategy.length_norm()  # first-pass and beam scores on one scale
    scores = np.asarray(length_normalize(jnp.asarray(log_probs), jnp.asarray(lengths), alpha, base))
    return tokens, scores, strategy.beams(decoder, decode_cfg, pad_id)


def print_seq2seq(rt: Any, state: Any, decode_cfg: Any, log: Callable = print) -> list[str]:
    """Decodes the inputs (module docstring) and prints them; returns the best output texts."""
    tokenizer = rt.tokenizer
    eos = tokenizer.eos_id if decode_cfg.eos_id < 0 else decode_cfg.eos_id
    decode_cfg = decode_cfg.replace(eos_id=eos)
    model = rt.programs.task.model(rt.programs.task.inference_params(state))
    rows = source_rows(rt, decode_cfg)
    tokens, scores, beams = decode_rows(model, [r for r, _ in rows], decode_cfg, tokenizer.pad_id, tokenizer.bos_id)
    text = lambda ids: decode_with_sentinels(tokenizer, ids)
    first = decode_cfg.strategy.first_pass().describe()
    first = first if first == "greedy" else f"sample ({first})"
    best = []
    for i, (inputs, targets) in enumerate(rows):
        log(f"--- example {i} ---")
        log(f"input:  {text(inputs)}")
        if targets is not None:
            log(f"target: {text(targets)}")
        log(f"{first} (score {scores[i]:.4f}): {text(tokens[i])}")
        best.append(text(tokens[i]))
        if beams is not None:
            for k in range(beams.scores.shape[1]):
                score = float(beams.scores[i, k])
                if np.isfinite(score):
                    log(f"beam {k + 1} (score {score:.4f}): {text(np.asarray(beams.tokens[i, k]))}")
            best[-1] = text(np.asarray(beams.tokens[i, 0]))
    summary = f"mean score over {len(rows)} input(s): {first} {scores.mean():.4f}"
    if beams is not None:
        summary += f", beam {float(np.asarray(beams.scores)[:, 0].mean()):.4f}"
    alpha, base = decode_cfg.strategy.length_norm()
    log(summary + f" (log-prob / ((5 + length) / {base:g}) ** {alpha})")
    return best
