"""The tiny BERT as a user drives it: `python -m pax_eqx.train` for 2 steps, then
`python -m pax_eqx.decode` filling the masks of a prompt, each a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pax_eqx import decode

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
TINY = [
    "--model.num-layers", "1", "--model.model-dims", "32", "--model.hidden-dims", "64", "--model.num-heads", "2",
    "--data.seq-len", "16", "--data.train.batch-size", "4", "--data.eval.batch-size", "4",
    "--data.eval.eval-loop-num-batches", "1", "--train.num-steps", "2", "--train.eval-interval-steps", "2",
    "--train.summary-interval-steps", "1", "--train.steps-per-loop", "1", "--checkpoint.every-n-steps", "2",
    "--train.no-sample-at-end",  # decode below fills masks from the checkpoint
]  # fmt: skip


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)


def test_train_then_decode_fills_the_masks(tmp_path, capsys):
    job = tmp_path / "job"
    done = run("pax_eqx.train", "--exp", "bert_shakespeare_char", "--job-log-dir", str(job), *TINY)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Experiment bert_shakespeare_char (BertModelConfig)" in done.stdout
    assert "Finished at step 2" in done.stdout
    config = json.loads((job / "config.json").read_text())
    assert config["name"] == "bert_shakespeare_char" and config["model"]["mask_token_id"] == 260
    assert sorted(p.name for p in (job / "checkpoints").iterdir() if p.name.isdigit()) == ["2"]
    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r["split"] == "eval"]
    assert evals and 0.0 <= evals[-1]["accuracy"] <= 1.0 and evals[-1]["avg_xent"] > 0
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2]

    done = run("pax_eqx.decode", "--job-log-dir", str(job), "--prompt", "To be, or not to b[MASK]")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Filling the prompt's masks from the checkpoint at step 2:" in done.stdout
    out = done.stdout.split("--- filled ---\n", 1)[1].splitlines()[0]
    assert out.startswith("To be, or not to b") and "[MASK]" not in out

    # Sampling options mean nothing to a masked LM: refused in one line, naming the flag (in this
    # process: it is refused while parsing, before anything is built).
    try:
        code = decode.main(["--job-log-dir", str(job), "--prompt", "a[MASK]", "--temperature", "0.5"])
    except SystemExit as e:
        code = e.code
    assert code == 2 and "--decode.temperature has no effect" in capsys.readouterr().err
