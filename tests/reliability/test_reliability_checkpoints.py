"""Damaged, torn and unwritable checkpoints, through the real CLI.

- the newest checkpoint's array files are damaged: a warning names it, the run resumes from the
  next newest, and the rerun's metrics equal the uninterrupted run's bit for bit; a torn
  (uncommitted) directory of a newer step beside it is never restored;
- every checkpoint is damaged: the run stops with an error (exit 1) instead of starting from
  scratch, and writes nothing;
- the disk "fills up" while saving (a file-size limit set on the process makes the kernel fail
  its large writes with EFBIG, as a full disk fails them with ENOSPC): one error line, exit 1,
  and every earlier checkpoint byte for byte as it was.
"""

from __future__ import annotations

import json

from reliability_harness import (
    NUM_STEPS,
    assert_every_record_matches,
    assert_no_traceback,
    committed_steps,
    copy_of_reference,
    reference,
    run,
    snapshot,
    tmp_checkpoints,
)


def damage(job, step: int) -> None:
    """Overwrites the middle of every array data file of checkpoint `step` with 0xff bytes."""
    files = list((job / "checkpoints" / str(step) / "state").glob("ocdbt.process_*/d/*"))
    assert files
    for path in files:
        data = bytearray(path.read_bytes())
        middle = len(data) // 2
        data[middle : middle + 64] = b"\xff" * len(data[middle : middle + 64])
        path.write_bytes(bytes(data))


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_damaged_newest_checkpoint_is_named_and_skipped_and_a_torn_one_never_restored(tmp_path):
    job = copy_of_reference(tmp_path)
    damage(job, 8)
    torn = job / "checkpoints" / "9.orbax-checkpoint-tmp-1234"
    torn.mkdir()
    (torn / "_CHECKPOINT_METADATA").write_text("{}")
    (job / "metrics.jsonl").write_text("")  # so the rerun's own lines are the ones compared
    done = run(job)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_no_traceback(done.stderr)
    warning = [line for line in done.stderr.splitlines() if line.startswith("warning:") and "unreadable" in line]
    assert warning and str(job / "checkpoints" / "8") in warning[0] and "falling back" in warning[0]
    assert "Resuming shakespeare_char from checkpoint at step 6" in done.stdout
    assert f"Finished at step {NUM_STEPS}" in done.stdout
    ref = reference()
    assert_every_record_matches(job, ref, steps=range(7, NUM_STEPS + 1))
    assert committed_steps(job) == [4, 6, 8]  # 8 written again
    assert any(p.name.startswith("8.unreadable-") for p in (job / "checkpoints").iterdir())
    assert not tmp_checkpoints(job)


def test_no_readable_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    job = copy_of_reference(tmp_path)
    for step in committed_steps(job):
        damage(job, step)
    before = snapshot(job)
    done = run(job)
    assert done.returncode == 1, done.stderr[-3000:]
    assert_no_traceback(done.stderr)
    (line,) = error_lines(done.stderr)
    assert "none of the 3 committed checkpoints" in line and "refusing to start from scratch" in line
    assert "Move the directory aside to start afresh" in line
    assert "Starting" not in done.stdout
    assert snapshot(job) == before


def test_disk_full_while_saving_keeps_every_earlier_checkpoint(tmp_path):
    job = copy_of_reference(tmp_path)
    before = {k: v for k, v in snapshot(job).items() if k != "config.json"}
    config_before = json.loads((job / "config.json").read_text())
    done = run(job, "--train.num-steps", "10", max_file_bytes=16 * 1024)
    assert done.returncode == 1, done.stderr[-3000:]
    assert_no_traceback(done.stderr)
    (line,) = error_lines(done.stderr)
    assert "saving the checkpoint for step 10" in line and "File too large" in line
    assert "the previous checkpoint (step 8) is intact" in line
    assert committed_steps(job) == [4, 6, 8]
    assert {k: v for k, v in snapshot(job).items() if k != "config.json"} == before
    config_after = json.loads((job / "config.json").read_text())
    assert config_after["train"].pop("num_steps") == 10 and config_before["train"].pop("num_steps") == NUM_STEPS
    assert config_after == config_before
