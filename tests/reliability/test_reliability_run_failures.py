"""Failures in the middle of a run: a data pipeline that raises, and a NaN loss (both policies).

Each fails (or skips) at a known step, through the fault-injecting input of
`reliability_faults`; each checks the one `error:` line (the step, the cause, the checkpoint a
rerun resumes from), the exit status, that no traceback is printed, that no checkpoint holds
the failed step, and that what was saved before is intact -- by resuming from it.
"""

from __future__ import annotations

import math

from reliability_harness import (
    NUM_STEPS,
    Running,
    assert_every_record_matches,
    assert_no_traceback,
    committed_steps,
    copy_of_reference,
    records,
    reference,
    run,
    snapshot,
    tmp_checkpoints,
)


def error_line(stderr: str) -> str:
    (line,) = [line for line in stderr.splitlines() if line.startswith("error:")]
    return line


def test_a_data_pipeline_that_raises_stops_with_a_clear_error_and_keeps_the_checkpoints(tmp_path):
    job = tmp_path / "job"
    failed = run(job, faults="raise:train:6")
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert_no_traceback(failed.stderr)
    line = error_line(failed.stderr)
    assert "the training input failed while reading the batch for step 6" in line
    assert "OSError: [Errno 5] Input/output error (injected) reading train batch 6" in line
    assert "reliability_faults.py" in line  # where it was raised
    # The step-4 save was still in flight when the input failed: it was let to commit.
    assert "the newest checkpoint, step 4, is intact" in line and "rerun the same command" in line
    assert committed_steps(job) == [2, 4] and not tmp_checkpoints(job)

    # The rerun resumes from step 4; now the eval input fails, in the eval after step 6.
    failed = run(job, faults="raise:eval:3")
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert_no_traceback(failed.stderr)
    line = error_line(failed.stderr)
    assert "the eval after step 6 failed: the eval input failed while reading eval batch 1" in line
    assert "Input/output error (injected) reading eval batch 3" in line
    assert "the newest checkpoint, step 4, is intact" in line
    assert committed_steps(job) == [2, 4] and not tmp_checkpoints(job)

    done = run(job)  # the input is fixed: the same command resumes from step 4
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Resuming shakespeare_char from checkpoint at step 4" in done.stdout
    assert_every_record_matches(job, reference())


def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    job = copy_of_reference(tmp_path)
    before = {k: v for k, v in snapshot(job).items() if k != "config.json"}
    failed = run(job, "--train.num-steps", "10", faults="nan:train:9")
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert_no_traceback(failed.stderr)
    line = error_line(failed.stderr)
    assert "total_loss is nan and grad_norm is nan at step 9" in line
    assert "the newest checkpoint, step 8, is intact" in line and "--learner.skip-nonfinite" in line
    assert committed_steps(job) == [4, 6, 8]
    assert {k: v for k, v in snapshot(job).items() if k != "config.json"} == before  # no NaN checkpoint


def test_skip_nonfinite_skips_counts_logs_and_the_count_survives_a_kill(tmp_path):
    """Policy skip: step 5's NaN update is skipped and counted; a run killed after step 7 and
    rerun recomputes step 7 with the restored count, bit for bit."""
    job = tmp_path / "job"
    skip = ("--learner.skip-nonfinite",)
    r = Running(job, *skip, faults="nan:train:5;hold:train:8")
    r.wait_for_hold("train-8")
    r.wait_for(lambda: 6 in committed_steps(job) and not tmp_checkpoints(job), "step 6 to commit")
    r.kill()
    assert "step 5: non-finite loss or gradients; 1 update(s) skipped" in r.stdout
    done = run(job, *skip, faults="nan:train:5")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Resuming shakespeare_char from checkpoint at step 6" in done.stdout
    assert f"Finished at step {NUM_STEPS}" in done.stdout

    train = [r for r in records(job) if r["split"] == "train"]
    step7 = [r for r in train if r["step"] == 7]
    assert len(step7) == 2 and step7[0]["loss"] == step7[1]["loss"] and step7[0]["skipped_steps"] == 1.0
    by_step = {r["step"]: r for r in train}
    assert by_step[5]["loss"] == "nan" and by_step[5]["skipped_steps"] == 1.0
    assert [by_step[s]["skipped_steps"] for s in range(1, NUM_STEPS + 1)] == [0.0] * 4 + [1.0] * 4
    assert all(math.isfinite(by_step[s]["loss"]) for s in range(6, NUM_STEPS + 1))
    assert_every_record_matches(job, reference(), steps=range(1, 5))  # before the NaN: the reference
