"""import_hf on a broken Hugging Face directory: one `error:` line naming the file or tensor and
the fix, exit 2, and no job dir left behind (both were tracebacks)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

QWEN = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen2"


def _import(src: Path, job: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pax_eqx.import_hf", str(src), "--job-log-dir", str(job)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _garbage_tokenizer(src: Path) -> None:
    (src / "tokenizer.json").write_text("garbage{")


def _wrong_shape_weight(src: Path) -> None:
    from safetensors.numpy import load_file, save_file

    weights = load_file(src / "model.safetensors")
    weights["model.layers.0.self_attn.q_proj.weight"] = np.zeros((3, 5), np.float32)
    save_file(weights, src / "model.safetensors")


@pytest.mark.parametrize(
    "damage, message",
    [
        (_garbage_tokenizer, "tokenizer.json is not a tokenizer the tokenizers library can read"),
        (_wrong_shape_weight, "the Hugging Face tensor model.layers.0.self_attn.q_proj.weight has shape (3, 5), "
                              "which does not make stack.layers.attention.w_q of shape (32, 4, 8)"),
    ],
)  # fmt: skip
def test_a_broken_model_directory_is_one_line_and_leaves_no_job_dir(damage, message, tmp_path):
    src = tmp_path / "model"
    shutil.copytree(QWEN, src)
    damage(src)
    done = _import(src, tmp_path / "job")
    assert done.returncode == 2, done.stderr[-3000:]
    [line] = [x for x in done.stderr.splitlines() if x.strip()]
    assert line.startswith("error: ") and message in line
    assert "Traceback" not in done.stderr and not (tmp_path / "job").exists()
