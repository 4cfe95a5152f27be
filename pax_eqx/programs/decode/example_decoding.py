"""Decoding a model that maps each example to a record (`ModelConfig.decodes_examples`, e.g. a
classifier): what `python -m pax_eqx.decode` does for it.

The examples are the first `decode.num_samples` real examples of the eval split (with their
labels), or the files `decode.inputs` names (read by the model's config, `example_from_file`).
Each example's record (`Model.decode_examples`, Pax's decode + process_decode_out) is printed
on a line and written, one JSON object a line, to DIR/decode/step_<step>.jsonl, which a rerun
at the same step replaces:

    example 0: predicted 3, probability 0.912, label 3
    seven.png: predicted 7, probability 0.640
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from pax_eqx.config import ConfigError
from pax_eqx.data import build_input

DECODE_DIR = "decode"


def eval_examples(rt: Any, count: int) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
    """The first `count` real examples of the eval split (a fresh single-host input) as one
    batch, and each one's name in the records ({"example": i})."""
    inp = build_input(rt.exp.data, "eval", rt.tokenizer, num_infeed_hosts=1, infeed_host_index=0)
    rows: list[dict[str, np.ndarray]] = []
    try:
        while len(rows) < count:
            batch = inp.get_next()
            real = np.flatnonzero(np.asarray(batch["weights"]) > 0)
            for i in real[: count - len(rows)]:
                rows.append({k: np.asarray(v)[i] for k, v in batch.items()})
    except StopIteration:
        pass
    finally:
        inp.close()
    if not rows:
        raise ConfigError("the eval split has no examples to decode; pass --decode.inputs FILE ...")
    return _stack(rows), [{"example": i} for i in range(len(rows))]


def file_examples(exp: Any, paths: tuple[str, ...]) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
    """The files as one batch, each read by the model's config, and their names ({"file": path})."""
    rows = [exp.model.example_from_file(path, exp.data) for path in paths]
    return _stack(rows), [{"file": path} for path in paths]


def _stack(rows: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.stack([row[k] for row in rows]) for k in rows[0] if k != "weights"}


def decode_records(rt: Any, state: Any, decode_cfg: Any) -> list[dict[str, Any]]:
    """One record per example: its name, then what the model's `decode_examples` gives for it."""
    if decode_cfg.inputs:
        batch, names = file_examples(rt.exp, decode_cfg.inputs)
    else:
        batch, names = eval_examples(rt, decode_cfg.num_samples)
    outputs = jax.device_get(jax.jit(rt.programs.task.decode_examples)(state, batch))
    order = sorted(outputs, key=lambda k: (k == "label", k))  # the truth after the predictions
    return [{**name, **{k: np.asarray(outputs[k][i]).item() for k in order}} for i, name in enumerate(names)]


def _line(record: dict[str, Any]) -> str:
    """`example 0: predicted 3, probability 0.912, label 3`: the name, then the outputs."""
    name = f"example {record['example']}" if "example" in record else record["file"]
    outputs = {k: v for k, v in record.items() if k not in ("example", "file")}
    shown = [f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in outputs.items()]
    return f"{name}: {', '.join(shown)}"


def write_records(job_dir: Path, step: int, records: list[dict[str, Any]]) -> Path:
    """DIR/decode/step_<step>.jsonl, written whole to a temporary name and then renamed, so a
    killed decode leaves the previous file, not half of a new one."""
    out = Path(job_dir) / DECODE_DIR / f"step_{step}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(out)
    return out


def print_decoded(rt: Any, state: Any, decode_cfg: Any, step: int, log: Callable = print) -> list[dict[str, Any]]:
    """Decodes (module docstring), prints a line per example and a summary, writes the records."""
    records = decode_records(rt, state, decode_cfg)
    for record in records:
        log(_line(record))
    out = write_records(rt.job_dir, step, records)
    labelled = [r for r in records if "label" in r and "predicted" in r]
    if labelled:
        right = sum(r["predicted"] == r["label"] for r in labelled)
        log(f"{right} of {len(labelled)} predicted right ({right / len(labelled):.1%})")
    log(f"records: {out}")
    return records
