"""Disk and permission faults, through the real command line: each stops the run within seconds
with one `error:` line naming the path and the cause, keeps every committed checkpoint byte for
byte, and the same command resumes once the fault is fixed.

- the checkpoints directory cannot be written (read-only; as root, immutable with chattr +i);
- the disk fills up while a checkpoint is written (a file-size limit: EFBIG, as a full disk
  gives ENOSPC);
- metrics.jsonl cannot be written (a link to /dev/full: every write fails with ENOSPC), or the
  TensorBoard directory cannot be created (a file in its place);
- the job dir cannot hold the trainer's lock file (immutable);
- a --job-log-dir that is not empty and not a job dir (`/`, a source tree) is refused.

Each test prints how long the failing command took (start-up included) for docs/errors.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from reliability_harness import (
    NUM_STEPS,
    assert_no_traceback,
    committed_steps,
    copy_of_reference,
    run,
    snapshot,
    tmp_checkpoints,
)

from pax_eqx.job.job_dir import JobDirError, prepare

MORE = ("--train.num-steps", str(NUM_STEPS + 2))


def error_line(stderr: str) -> str:
    assert_no_traceback(stderr)
    (line,) = [line for line in stderr.splitlines() if line.startswith("error:")]
    return line


def checkpoints_of(job: Path) -> dict[str, bytes]:
    return {k: v for k, v in snapshot(job).items() if k != "config.json"}


def timed_run(job: Path, *extra: str, **kw):
    started = time.monotonic()
    done = run(job, *extra, **kw)
    return done, time.monotonic() - started


def resumes_and_finishes(job: Path) -> None:
    done = run(job, *MORE)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Resuming shakespeare_char from checkpoint at step {NUM_STEPS}" in done.stdout
    assert f"Finished at step {NUM_STEPS + 2}" in done.stdout
    assert committed_steps(job) == [6, 8, 10] and not tmp_checkpoints(job)


def make_unwritable(path: Path) -> None:
    """Read-only for a user; immutable for root (whom permissions do not stop)."""
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip("running as root on a file system without chattr +i")
    else:
        path.chmod(0o555)


def make_writable(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)
    path.chmod(0o755)


def test_an_unwritable_checkpoints_directory_stops_the_run_at_once(tmp_path):
    job = copy_of_reference(tmp_path)
    before = checkpoints_of(job)
    make_unwritable(job / "checkpoints")
    try:
        done, took = timed_run(job, *MORE)
    finally:
        make_writable(job / "checkpoints")
    assert done.returncode == 1, done.stderr[-3000:]
    line = error_line(done.stderr)
    reason = "Operation not permitted" if os.geteuid() == 0 else "Permission denied"
    assert line == (
        f"error: cannot write the checkpoint for step {NUM_STEPS + 2}: the checkpoint directory {job / 'checkpoints'} "
        f"cannot be written ({reason}); nothing of step {NUM_STEPS + 2} was written, the previous checkpoint "
        f"(step {NUM_STEPS}) is intact and will be restored. Make the directory writable (or free space) and rerun "
        "the same command."
    )
    assert checkpoints_of(job) == before
    assert took < 60, took  # orbax's own failure would wait minutes for its signals
    resumes_and_finishes(job)
    print(f"unwritable checkpoints dir: exit 1 after {took:.1f}s")


def test_a_disk_that_fills_up_while_saving_stops_the_run_and_the_rerun_resumes(tmp_path):
    job = copy_of_reference(tmp_path)
    before = checkpoints_of(job)
    done, took = timed_run(job, *MORE, max_file_bytes=16 * 1024)
    assert done.returncode == 1, done.stderr[-3000:]
    line = error_line(done.stderr)
    assert f"error: saving the checkpoint for step {NUM_STEPS + 2} in {job / 'checkpoints'} failed:" in line
    assert "File too large" in line and f"the previous checkpoint (step {NUM_STEPS}) is intact" in line
    assert checkpoints_of(job) == before
    assert took < 60, took
    resumes_and_finishes(job)  # "space freed": the leftover tmp directory is cleaned up by the rerun
    print(f"disk full while saving: exit 1 after {took:.1f}s")


@pytest.mark.parametrize("what", ["metrics.jsonl", "tensorboard"])
def test_a_log_file_that_cannot_be_written_stops_the_run_at_once(tmp_path, what):
    job = copy_of_reference(tmp_path)
    before = checkpoints_of(job)
    if what == "metrics.jsonl":
        kept = job.parent / "metrics.jsonl.kept"
        (job / "metrics.jsonl").rename(kept)
        (job / "metrics.jsonl").symlink_to("/dev/full")  # every write: ENOSPC, as on a full disk
        says = f"error: writing {job / 'metrics.jsonl'} failed at step {NUM_STEPS + 1} (No space left on device)"
    else:
        shutil.rmtree(job / "summaries" / "train")
        (job / "summaries" / "train").write_text("a file where the TensorBoard run directory goes")
        says = (
            f"error: writing the TensorBoard events in {job / 'summaries' / 'train'} failed at step {NUM_STEPS + 1} "
            "(Not a directory)"
        )
    done, took = timed_run(job, *MORE)
    assert done.returncode == 1, done.stderr[-3000:]
    line = error_line(done.stderr)
    assert line.startswith(says), line
    assert line.endswith(
        f"the newest checkpoint, step {NUM_STEPS}, is intact. Free space (or fix the permissions) and rerun the "
        "same command to resume."
    ), line
    assert "Exception ignored" not in done.stderr and "Exception in thread" not in done.stderr, done.stderr
    assert checkpoints_of(job) == before
    assert took < 60, took
    if what == "metrics.jsonl":
        (job / "metrics.jsonl").unlink()
        kept.rename(job / "metrics.jsonl")
    else:
        (job / "summaries" / "train").unlink()
    resumes_and_finishes(job)
    print(f"{what} unwritable: exit 1 after {took:.1f}s")


def test_a_job_dir_that_cannot_hold_the_lock_file_is_refused(tmp_path):
    job = copy_of_reference(tmp_path)
    before = snapshot(job)
    make_unwritable(job)
    try:
        done, took = timed_run(job, *MORE)
    finally:
        make_writable(job)
    assert done.returncode == 2, done.stderr[-3000:]
    line = error_line(done.stderr)
    assert line == f"error: --job-log-dir {str(job)!r} is not writable; fix its permissions or choose another path."
    assert snapshot(job) == before
    print(f"unwritable job dir: exit 2 after {took:.1f}s")

    (job / "train.lock").mkdir()  # something in the lock file's place
    done = run(job, *MORE)
    assert done.returncode == 2, done.stderr[-3000:]
    assert error_line(done.stderr) == (
        f"error: --job-log-dir {str(job)!r}: cannot create its lock file train.lock (Is a directory); move aside "
        "what is in its place, or choose another path."
    )
    assert snapshot(job) == before


def test_a_foreign_non_empty_job_dir_is_refused(tmp_path):
    listed = sorted(os.listdir("/"))
    done, took = timed_run(Path("/"))
    assert done.returncode == 2, done.stderr[-3000:]
    line = error_line(done.stderr)
    assert line.startswith("error: --job-log-dir '/' is not empty and is not a pax_eqx job dir (it holds ")
    assert "but no config.json, checkpoints/ or metrics.jsonl); choose a new or empty directory" in line
    assert sorted(os.listdir("/")) == listed
    print(f"--job-log-dir /: exit 2 after {took:.1f}s")

    source = tmp_path / "project"
    (source / "src").mkdir(parents=True)
    (source / "notes.txt").write_text("mine")
    done = run(source)
    assert done.returncode == 2
    assert f"--job-log-dir {str(source)!r} is not empty and is not a pax_eqx job dir (it holds notes.txt, src" in (
        error_line(done.stderr)
    )
    assert sorted(p.name for p in source.iterdir()) == ["notes.txt", "src"]


def test_what_counts_as_a_job_dir(tmp_path):
    """prepare() alone: empty, ours, or marked by config.json / checkpoints / metrics.jsonl."""
    cases = {
        "empty": [],
        "a first run that failed early": ["tokenizer/", "train.lock"],
        "a job dir with the user's notes": ["config.json", "notes.txt"],
        "checkpoints only": ["checkpoints/"],
    }
    for name, entries in cases.items():
        job = tmp_path / name.replace(" ", "_")
        job.mkdir()
        for entry in entries:
            (job / entry.rstrip("/")).mkdir() if entry.endswith("/") else (job / entry).write_text("")
        assert prepare(job) == job
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    for entry in ("plots", "README.md"):
        (foreign / entry).mkdir()
    with pytest.raises(JobDirError, match="is not empty and is not a pax_eqx job dir"):
        prepare(foreign)
    assert prepare(foreign, create=False) == foreign  # eval and decode only read; they fail on no checkpoint
