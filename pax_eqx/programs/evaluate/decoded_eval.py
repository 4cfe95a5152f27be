"""Eval metrics on decoded outputs (`data.eval.metrics` of kind "decoded", pax_eqx.metric_fns):
the model's decode of the examples an eval run read, as text, against their targets.

The eval loop keeps the host batches it reads when such a metric is declared; their real rows
are decoded in one call (one compiled program per eval) with the experiment's decode settings
-- the decode strategy's best output (greedy, a sample, or a beam's best) -- for at most the
targets' length of new tokens. Each example's input, target and output go to DIR/decode/eval_step_<step>.jsonl for
inspection, then every metric scores the outputs against the targets. Each host scores the
examples it read; process 0's are the ones reported and written.

A metric that raises, or returns something other than numbers, on this eval's outputs is one
warning line, and its scores are NaN in this eval: the run goes on and saves this step's
checkpoint. (A user's metric was called once on a made-up pair before the run started,
programs/preflight.py, so what fails here depends on the outputs: an empty prediction, say.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pax_eqx.data import target_length
from pax_eqx.data.span_corruption import decode_with_sentinels
from pax_eqx.job.errors import raised_at
from pax_eqx.metric_fns import MetricReturnError, resolve, run_decoded
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
    rt: Any,
    state: Any,
    batches: Sequence[dict[str, np.ndarray]],
    names: Sequence[str],
    step: int,
    files_dir: Any,
    log: Callable[[str], None] = print,
) -> dict[str, float]:
    """The named metrics of the decoded real rows of `batches`; the texts written under
    `files_dir` (None: not this process). A metric that fails is `log`ged and NaN (module doc)."""
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
        try:
            scores.update(run_decoded(name, targets, outputs))
        except Exception as e:  # noqa: BLE001 -- a metric's failure must not cost the run (module doc)
            log(_failed(name, step, e))
            scores.update({reported: float("nan") for reported in resolve(name).reports})
    return scores


def _failed(name: str, step: int, error: Exception) -> str:
    what = f"it {error}" if isinstance(error, MetricReturnError) else (
        f"it raised {type(error).__name__}: {' '.join(str(error).split())}{raised_at(error)}"
    )  # fmt: skip
    return (
        f"warning: the eval metric {name!r} (data.eval.metrics) failed on the outputs of the eval at step {step}: "
        f"{what}; its scores are NaN in this eval, and the run goes on. Fix the function: it must return "
        "{name: float} or a float for any targets and predictions."
    )
