"""What a checkpoint claims is checked against what it holds, through the real command line.

A damage that still parses -- an input position changed in the data iterator state file, a step
directory copied over another step's name -- is treated as a damaged checkpoint: a warning
names it, the run falls back to the next newest checkpoint, sets the bad one aside, and the
rerun's metrics equal the undisturbed run's bit for bit.
"""

from __future__ import annotations

import shutil

from reliability_harness import (
    NUM_STEPS,
    assert_every_record_matches,
    assert_no_traceback,
    committed_steps,
    copy_of_reference,
    reference,
    run,
)


def fallback_warning(stderr: str) -> str:
    (line,) = [line for line in stderr.splitlines() if line.startswith("warning:") and "falling back" in line]
    return line


def test_a_changed_input_position_is_caught_and_the_run_falls_back(tmp_path):
    job = copy_of_reference(tmp_path)
    (state_file,) = (job / "checkpoints" / str(NUM_STEPS) / "data").glob("process_*.json")
    text = state_file.read_text()
    assert f'"served": {NUM_STEPS}' in text
    state_file.write_text(text.replace(f'"served": {NUM_STEPS}', f'"served": {NUM_STEPS + 1}'))  # still valid JSON
    (job / "metrics.jsonl").write_text("")  # so the rerun's own lines are the ones compared
    done = run(job)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_no_traceback(done.stderr)
    warning = fallback_warning(done.stderr)
    assert f"checkpoint {job / 'checkpoints' / str(NUM_STEPS)} is unreadable" in warning
    assert "the data iterator state of process 0 differs from the checksum written at save time" in warning
    assert f"Resuming shakespeare_char from checkpoint at step {NUM_STEPS - 2}" in done.stdout
    assert_every_record_matches(job, reference(), steps=range(NUM_STEPS - 1, NUM_STEPS + 1))
    assert committed_steps(job) == [4, 6, 8]


def test_a_step_directory_under_another_steps_name_is_caught(tmp_path):
    job = copy_of_reference(tmp_path)
    later = NUM_STEPS + 2
    shutil.copytree(job / "checkpoints" / str(NUM_STEPS), job / "checkpoints" / str(later))  # claims 10, holds 8
    done = run(job, "--train.num-steps", str(later))
    assert done.returncode == 0, done.stderr[-3000:]
    warning = fallback_warning(done.stderr)
    assert f"its directory is step {later} but its manifest was written for step {NUM_STEPS}" in warning
    assert f"Resuming shakespeare_char from checkpoint at step {NUM_STEPS}" in done.stdout
    assert f"Finished at step {later}" in done.stdout  # not "already trained to step 10"
    assert committed_steps(job) == [6, 8, 10]
    assert any(p.name.startswith(f"{later}.unreadable-") for p in (job / "checkpoints").iterdir())
