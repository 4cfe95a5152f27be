"""SIGKILL the real training CLI at seven different points, rerun the same command, and get the
uninterrupted run's loss trajectory back bit for bit.

Each case is a chain: one job dir, killed at one or more points (each kill checked for what it
left on disk: which checkpoints are committed, whether a save was torn), and rerun with the
same command line after each kill. Every metrics line ever written to the job dir -- including
the steps a killed run logged past its last checkpoint, which the next run computes again --
must equal the reference run's line for that step exactly: loss, gradient norm, learning rate,
accuracy, skipped-step count, and the rolling eval's metrics (whose input position is
checkpointed too).

The reference run: 8 steps, checkpoints at 2, 4, 6, 8 (keep 3), a rolling eval of two batches
at steps 3, 6 and 8. A hold (reliability_faults) parks a run just before it reads the batch of
a given step, so a kill lands between known steps; the kill mid-save polls for orbax's
`<step>.orbax-checkpoint-tmp*` directory instead.
"""

from __future__ import annotations

import pytest
from reliability_harness import (
    NUM_STEPS,
    Running,
    assert_every_record_matches,
    assert_no_traceback,
    committed_steps,
    reference,
    run,
    tmp_checkpoints,
    trajectory,
)


def _settled(job, *steps):
    return lambda: set(steps) <= set(committed_steps(job)) and not tmp_checkpoints(job)


def kill_during_compile(job):
    r = Running(job)
    r.wait_for(lambda: "Starting" in r.stdout, "the run to start compiling")
    r.kill()
    assert committed_steps(job) == [] and trajectory(job) == {}


def kill_before_the_first_checkpoint(job):
    r = Running(job, faults="hold:train:2")
    r.wait_for_hold("train-2")
    r.kill()
    assert committed_steps(job) == [] and sorted(trajectory(job)) == [1]


def kill_mid_async_save(job):
    """Killed while a checkpoint is being written in the background (the first save seen in
    progress; a run from scratch makes four): it is torn, and not committed."""
    r = Running(job)
    r.wait_for(lambda: tmp_checkpoints(job), "a save to start", poll_s=0.0002)
    r.kill()
    torn = {int(name.split(".")[0]) for name in tmp_checkpoints(job)}
    assert torn and not torn & set(committed_steps(job)), "the kill came after the commit"


def kill_right_after_a_commit(job):
    r = Running(job, faults="hold:train:5")
    r.wait_for_hold("train-5")
    r.wait_for(_settled(job, 4), "step 4 to commit")
    r.kill()
    assert committed_steps(job) == [2, 4]


def kill_during_eval(job):
    """The second eval run (after step 6, before the step-6 save) is reading its first batch."""
    r = Running(job, faults="hold:eval:3")
    r.wait_for_hold("eval-3")
    r.wait_for(_settled(job, 4), "step 4 to commit")
    r.kill()
    assert committed_steps(job)[-1] == 4 and sorted(trajectory(job)) == list(range(1, 7))


def kill_after_logging_past_the_checkpoint(job):
    """Step 7 is logged, the newest checkpoint is step 6: the rerun computes step 7 again."""
    r = Running(job, faults="hold:train:8")
    r.wait_for_hold("train-8")
    r.wait_for(_settled(job, 6), "step 6 to commit")
    r.kill()
    assert committed_steps(job)[-1] == 6 and sorted(trajectory(job)) == list(range(1, 8))


def kill_after_the_final_checkpoint(job):
    r = Running(job)
    r.wait_for(lambda: NUM_STEPS in committed_steps(job), "the final checkpoint")
    r.kill()


CHAINS = {
    "compile-then-before-first-checkpoint-then-mid-save": [
        kill_during_compile,
        kill_before_the_first_checkpoint,
        kill_mid_async_save,
    ],
    "after-commit-then-during-eval-then-past-checkpoint": [
        kill_right_after_a_commit,
        kill_during_eval,
        kill_after_logging_past_the_checkpoint,
    ],
    "after-final-checkpoint": [kill_after_the_final_checkpoint],
}


@pytest.mark.parametrize("chain", list(CHAINS))
def test_rerun_after_sigkill_is_bitwise_equal_to_the_uninterrupted_run(chain, tmp_path):
    ref = reference()
    job = tmp_path / "job"
    for kill in CHAINS[chain]:
        kill(job)
    done = run(job)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_no_traceback(done.stderr)
    # A run killed after its final checkpoint is complete: the rerun says so and redoes nothing.
    complete = chain == "after-final-checkpoint"
    assert (f"already trained to step {NUM_STEPS}" if complete else f"Finished at step {NUM_STEPS}") in done.stdout
    assert_every_record_matches(job, ref)
    # The newest checkpoints are the reference's. (A kill right after a commit, before orbax
    # deleted the checkpoints beyond max_to_keep, can leave one older step more.)
    assert committed_steps(job)[-3:] == committed_steps(ref)
    assert not tmp_checkpoints(job)
