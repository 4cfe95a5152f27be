"""`python -m pax_eqx.plots` on bad inputs, through the real command line: one `error:` line naming
the file, the value and the fix, no traceback; exit 2 for what the user gave, 1 for the
environment. The metrics files are written by hand (no training)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

GOOD_LINE = json.dumps({"step": 10, "split": "train", "loss": 2.0}) + "\n"


def plots(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-m", "pax_eqx.plots", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def error_line(done: subprocess.CompletedProcess, status: int) -> str:
    assert done.returncode == status, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    return line


def job_with(tmp_path: Path, content: bytes | None) -> Path:
    job = tmp_path / "job"
    job.mkdir()
    if content is not None:
        (job / "metrics.jsonl").write_bytes(content)
    return job


def test_a_line_that_is_not_utf8(tmp_path):
    job = job_with(tmp_path, GOOD_LINE.encode() + b'{"step": 20, "loss": "\xff\xfe"}\n')
    line = error_line(plots(str(job), cwd=tmp_path), 2)
    assert line == (
        f'error: {job / "metrics.jsonl"} line 2 is not UTF-8 text (b\'{{"step": 20, "loss": "\\xff\\xfe"}}\\n\'): '
        "pax_eqx writes ASCII JSON lines, so something else wrote it; delete that line (or restore the file) and "
        "rerun."
    )
    assert not (job / "plots").exists()


def test_out_naming_an_existing_file(tmp_path):
    job = job_with(tmp_path, GOOD_LINE.encode())
    out = tmp_path / "compare.png"
    out.write_bytes(b"not a directory")
    line = error_line(plots(str(job), "--out", str(out), cwd=tmp_path), 2)
    assert line == (
        f"error: --out '{out}' is a file; the plots are written into a directory, one PNG per metric: pass a "
        f"directory, new or existing (e.g. --out '{tmp_path / 'plots_compare'}')."
    )
    assert out.read_bytes() == b"not a directory"


def test_a_read_only_job_dir(tmp_path):
    """Exit 1 (the environment), and the fix it names works on the same read-only dir."""
    job = job_with(tmp_path, GOOD_LINE.encode())
    _make_unwritable(job)
    try:
        line = error_line(plots(str(job), cwd=tmp_path), 1)
        elsewhere = plots(str(job), "--out", str(tmp_path / "elsewhere"), cwd=tmp_path)
    finally:
        _make_writable(job)
    reason = "Operation not permitted" if os.geteuid() == 0 else "Permission denied"
    assert line == (
        f"error: cannot write the plots into {job / 'plots'} ({reason}); make it writable, or pass --out OTHER_DIR "
        "to draw them elsewhere."
    )
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert elsewhere.stdout.split() == [str(tmp_path / "elsewhere" / "loss.png")]


def test_metrics_jsonl_that_is_a_directory(tmp_path):
    job = job_with(tmp_path, None)
    (job / "metrics.jsonl").mkdir()
    line = error_line(plots(str(job), cwd=tmp_path), 2)
    assert line == (
        f"error: {job / 'metrics.jsonl'} is a directory, not the metrics file train writes (one JSON line per logged "
        "step); name the job dir of a run (its metrics.jsonl is a file), or move that directory aside."
    )


def test_an_empty_metrics_jsonl(tmp_path):
    job = job_with(tmp_path, b"")
    line = error_line(plots(str(job), cwd=tmp_path), 2)
    assert line == (
        f"error: {job / 'metrics.jsonl'} is empty: nothing to plot yet (the run logs a line every "
        "train.summary_interval_steps steps and at each eval); rerun once it has logged."
    )


def test_a_metrics_jsonl_without_a_metric_the_plots_draw(tmp_path):
    job = job_with(tmp_path, json.dumps({"step": 4, "split": "decode", "samples": ["ROMEO:"]}).encode() + b"\n")
    line = error_line(plots(str(job), cwd=tmp_path), 2)
    assert line == (
        f"error: {job / 'metrics.jsonl'} holds no train or eval line with a metric the plots draw (loss, total_loss, "
        "log_pplx, accuracy, learning_rate, grad_norm); nothing to plot."
    )


def _make_unwritable(path: Path) -> None:
    """Read-only for a user; immutable for root (whom permissions do not stop)."""
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip("running as root on a file system without chattr +i")
    else:
        path.chmod(0o555)


def _make_writable(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)
    path.chmod(0o755)
