"""A job dir whose config.json is gone or damaged. eval and decode read the experiment saved in the
newest checkpoint's manifest (saying so), as train does, rather than silently building the
default experiment; a config.json that is not UTF-8 is one error line naming the file (it was a
UnicodeDecodeError traceback)."""

from __future__ import annotations

import subprocess
import sys

from reliability_harness import assert_no_traceback, environment, run


def _program(name: str, job, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", name, "--job-log-dir", str(job), *extra],
        capture_output=True, text=True, env=environment(), timeout=300,
    )  # fmt: skip


def test_eval_and_decode_read_the_checkpoints_experiment_when_config_json_is_lost(tmp_path):
    job = tmp_path / "job"
    assert run(job, "--train.num-steps", "2").returncode == 0
    (job / "config.json").unlink()
    warning = f"warning: {job / 'config.json'} is missing; using the experiment saved with the step-2 checkpoint."
    done = _program("pax_eqx.eval", job)
    assert done.returncode == 0, done.stderr[-3000:]
    assert warning in " ".join(done.stderr.split()) and "eval" in done.stdout
    done = _program("pax_eqx.decode", job, "--prompt", "RO", "--max-new-tokens", "4")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "from the checkpoint at step 2" in done.stdout


def test_a_config_json_that_is_not_utf8_is_one_line(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "config.json").write_bytes(b'{"name": "\xff\xfe"}')
    for name in ("pax_eqx.eval", "pax_eqx.decode", "pax_eqx.train"):
        done = _program(name, job)
        assert done.returncode == 2, (name, done.stderr[-3000:])
        assert_no_traceback(done.stderr)
        assert "is not UTF-8" in done.stderr and "config.json" in done.stderr, done.stderr
