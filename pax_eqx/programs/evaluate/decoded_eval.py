"""Eval metrics on decoded outputs (`data.eval.metrics` of kind "decoded", pax_eqx.metric_fns):
the model's decode of the examples an eval run read, as text, against their targets.

The eval loop keeps the host batches it reads when such a metric is declared; their real rows
are decoded in one call (one compiled program per eval) with the experiment's decode settings
-- the decode strategy's best output (greedy, a sample, or a beam's best) -- for at most the
targets' length of new tokens. Each example's input, target and output go to DIR/decode/eval_step_<step>.jsonl for
inspection, then every metric scores the outputs against the targets. Each host scores the
examples it read; process 0's are the ones reported and written.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pax_eqx.data import target_length
from pax_eqx.data.span_corruption import decode_with_sentinels
from pax_eqx.metric_fns import run_decoded
from pax_eqx.programs.decode.seq2seq_decoding import example_pairs


def decoded_texts(rt: Any, state: Any, pairs: list[tuple[list[int], list[int]]]) -> list[str]:
    """Each input's decoded output text: the best output of the decode strategy."""
    tokenizer = rt.tokenizer
    cfg = rt.exp.decode
    eos = tokenizer.eos_id if cfg.eos_id < 0 else cfg.eos_id
    cfg = cfg.replace(eos_id=eos, max_new_tokens=min(cfg.max_new_tokens, target_length(rt.exp.data)))
    model = rt.programs.task.model(rt.programs.task.inference_params(state))
    decoder = model.incremental_decoder(
        [inputs for inputs, _ in pairs], cfg.max_new_tokens, tokenizer.pad_id, tokenizer.bos_id
    )
    best = cfg.strategy.best(decoder, cfg, cfg.strategy.key(), tokenizer.pad_id)
    return [decode_with_sentinels(tokenizer, _until_eos(row, eos)) for row in best]


def _until_eos(ids: np.ndarray, eos: int) -> list[int]:
    ids = list(np.asarray(ids).tolist())
    return ids[: ids.index(eos)] if eos in ids else ids


def decoded_scores(
    rt: Any, state: Any, batches: Sequence[dict[str, np.ndarray]], names: Sequence[str], step: int, files_dir: Any
) -> dict[str, float]:
    """The named metrics of the decoded real rows of `batches`; the texts written under
    `files_dir` (None: not this process)."""
    pairs = [pair for batch in batches for pair in example_pairs(batch)]
    if not pairs:
        return {}
    outputs = decoded_texts(rt, state, pairs)
    inputs = [decode_with_sentinels(rt.tokenizer, i) for i, _ in pairs]
    targets = [decode_with_sentinels(rt.tokenizer, t) for _, t in pairs]
    if files_dir is not None:
        out = Path(files_dir) / "decode" / f"eval_step_{step}.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        rows = (json.dumps({"input": i, "target": t, "output": o}) for i, t, o in zip(inputs, targets, outputs))
        out.write_text("".join(r + "\n" for r in rows))
    scores: dict[str, float] = {}
    for name in names:
        scores.update(run_decoded(name, targets, outputs))
    return scores
