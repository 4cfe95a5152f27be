"""A job dir whose config.json is gone or damaged. eval and decode read the experiment saved in the
newest checkpoint's manifest (saying so), as train does, rather than silently building the
default experiment; a config.json that is not UTF-8 is one error line naming the file (it was a
UnicodeDecodeError traceback).

The job dir is a copy of the reliability harness's reference run (one per pytest worker, shared
with the other reliability tests), not a run of its own; eval and decode run as the real commands.
The damaged config.json is read by eval's command line, and by decode's and train's main in this
process (the same entry.run: the line and the status)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from reliability_harness import assert_no_traceback, committed_steps, copy_of_reference, environment


def _program(name: str, job, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", name, "--job-log-dir", str(job), *extra],
        capture_output=True, text=True, env=environment(), timeout=300,
    )  # fmt: skip


def test_eval_and_decode_read_the_checkpoints_experiment_when_config_json_is_lost(tmp_path):
    job = copy_of_reference(tmp_path)
    step = max(committed_steps(job))
    (job / "config.json").unlink()
    warning = f"warning: {job / 'config.json'} is missing; using the experiment saved with the step-{step} checkpoint."
    done = _program("pax_eqx.eval", job)
    assert done.returncode == 0, done.stderr[-3000:]
    assert warning in " ".join(done.stderr.split()) and "eval" in done.stdout
    done = _program("pax_eqx.decode", job, "--prompt", "RO", "--max-new-tokens", "4")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"from the checkpoint at step {step}" in done.stdout


def _check_one_line(code: int, stderr: str, name: str) -> None:
    assert code == 2, (name, stderr[-3000:])
    assert_no_traceback(stderr)
    assert "is not UTF-8" in stderr and "config.json" in stderr, stderr


def test_a_config_json_that_is_not_utf8_is_one_line(tmp_path, capsys):
    from pax_eqx import decode, train
    from pax_eqx.command_line import entry

    job = tmp_path / "job"
    job.mkdir()
    (job / "config.json").write_bytes(b'{"name": "\xff\xfe"}')
    done = _program("pax_eqx.eval", job)
    _check_one_line(done.returncode, done.stderr, "pax_eqx.eval")
    for name, program in (("pax_eqx.decode", decode), ("pax_eqx.train", train)):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:
            entry.run(lambda program=program: program.main(["--job-log-dir", str(job)]))
        _check_one_line(exited.value.code, capsys.readouterr().err, name)
