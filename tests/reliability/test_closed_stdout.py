"""A closed stdout (`... | head -1`) ends a command quietly with 141, as the shell expects for a
reader that left, and a training run saves first (pax_eqx.closed_stdout): no BrokenPipeError
traceback, no "Exception ignored" at exit, and nothing lost."""

from __future__ import annotations

import subprocess
import sys

from reliability_harness import assert_no_traceback, command, committed_steps, environment, run


def _with_stdout_closed(args: list[str], *, after: str = "") -> tuple[int, str]:
    """(exit status, stderr) of `args` whose stdout's reader leaves after the line holding
    `after` (at once when it is "")."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment(), text=True)
    while after:
        line = proc.stdout.readline()
        assert line, f"the program's stdout ended before a line with {after!r}"
        if after in line:
            break
    proc.stdout.close()
    _, stderr = proc.communicate(timeout=300)
    return proc.returncode, stderr


def test_help_and_a_listing_into_a_closed_pipe_exit_141_in_silence(tmp_path):
    for program in ("pax_eqx.train", "pax_eqx.decode"):
        code, stderr = _with_stdout_closed([sys.executable, "-m", program, "--help"])
        assert (code, stderr) == (141, ""), (program, stderr[-2000:])
    code, stderr = _with_stdout_closed(
        [sys.executable, "-m", "pax_eqx.inspect_data", "--exp", "shakespeare_char", "--num-batches", "3"]
    )
    assert (code, stderr.strip()) == (141, ""), stderr[-2000:]


def test_a_training_run_whose_reader_leaves_saves_exits_141_and_resumes(tmp_path):
    job = tmp_path / "job"
    code, stderr = _with_stdout_closed(command(job), after="step 1/8")  # in the loop: the stop flag listens
    assert code == 141, stderr[-3000:]
    assert_no_traceback(stderr)
    assert "stdout was closed: finishing the current step, then saving a checkpoint" in stderr
    saved = committed_steps(job)
    assert saved, "the run stopped without saving"
    rerun = run(job)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"Resuming shakespeare_char from checkpoint at step {max(saved)}" in rerun.stdout
    assert max(committed_steps(job)) == 8
