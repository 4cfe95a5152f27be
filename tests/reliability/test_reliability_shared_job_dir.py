"""One job dir, one trainer, any number of readers -- through the real command lines.

- `train`, `eval` and `decode` run at the same time on one job dir: the readers change nothing
  in DIR/checkpoints (not even a `*.orbax-checkpoint-tmp*` directory, which is a trainer's save
  in progress), eval's result goes to its own file and TensorBoard run, and the trainer
  finishes with exactly the losses of an undisturbed run;
- a second `train` on a job dir that is being trained exits 2 at once, naming the holder's pid
  and host, and changes nothing; the lock dies with its holder (SIGKILL), so the rerun resumes;
- a run that is already complete says so and exits 0 without redoing any work.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time

from reliability_harness import (
    NUM_STEPS,
    REPO,
    Running,
    assert_every_record_matches,
    assert_no_traceback,
    command,
    committed_steps,
    copy_of_reference,
    environment,
    records,
    reference,
    run,
    snapshot,
    tmp_checkpoints,
)


def start(job, program: str, out_dir) -> subprocess.Popen:
    """`python -m <program>` on `job` in the background, its output in files under `out_dir`."""
    name = program.rsplit(".", 1)[-1]
    with open(out_dir / f"{name}.out", "w") as out, open(out_dir / f"{name}.err", "w") as err:
        return subprocess.Popen(
            command(job, program=program), env=environment(), stdout=out, stderr=err, cwd=REPO, text=True
        )


def test_train_eval_and_decode_at_once_leave_the_trainer_exact(tmp_path):
    ref = reference()
    job = tmp_path / "job"
    trainer = Running(job, faults="hold:train:3")
    trainer.wait_for_hold("train-3")
    trainer.wait_for(lambda: 2 in committed_steps(job), "step 2 to commit")
    # A save in progress, as the trainer leaves it while writing: a reader that opened orbax's
    # CheckpointManager would delete it (and the trainer would die at its next save).
    in_progress = job / "checkpoints" / "99.orbax-checkpoint-tmp-1234567890"
    in_progress.mkdir()
    (in_progress / "half-written").write_text("a trainer's save in progress")
    readers = {name: start(job, f"pax_eqx.{name}", tmp_path) for name in ("eval", "decode")}
    time.sleep(1.0)  # the readers are importing, restoring, evaluating while the trainer goes on
    trainer.release("train-3")
    assert trainer.finish() == 0, trainer.stderr[-3000:]
    for name, proc in readers.items():
        assert proc.wait(timeout=180) == 0, (tmp_path / f"{name}.err").read_text()[-3000:]
        err = (tmp_path / f"{name}.err").read_text()
        assert_no_traceback(err)
        assert "unreadable" not in err, err

    assert in_progress.exists() and (in_progress / "half-written").exists()  # nobody cleaned it up
    in_progress.rename(tmp_path / "moved-aside")  # (so the tmp-dir check below sees only the trainer's)
    assert f"Finished at step {NUM_STEPS}" in trainer.stdout
    assert_every_record_matches(job, ref)  # exactly the undisturbed run's losses and eval metrics
    assert committed_steps(job) == [4, 6, 8] and not tmp_checkpoints(job)
    assert not (job / "train.lock").exists() and not (job / "train.lock.holder").exists()

    # eval: its own file and TensorBoard run, never the trainer's metrics.jsonl.
    assert {r["split"] for r in records(job)} == {"train", "eval"}
    (result,) = [json.loads(line) for line in (job / "eval_results.jsonl").read_text().splitlines()]
    assert result["split"] == "eval_separate" and result["step"] in (2, 4, 6, 8)
    printed = json.loads((tmp_path / "eval.out").read_text().strip().splitlines()[-1])
    assert printed["step"] == result["step"] and printed["total_loss"] == result["total_loss"]
    assert any((job / "summaries" / "eval_separate").iterdir())
    decoded = (tmp_path / "decode.out").read_text()
    assert "from the checkpoint at step" in decoded


def test_a_second_trainer_is_refused_at_once_and_the_lock_dies_with_its_holder(tmp_path):
    ref = reference()
    job = tmp_path / "job"
    first = Running(job, faults="hold:train:3")
    first.wait_for_hold("train-3")
    first.wait_for(lambda: 2 in committed_steps(job) and not tmp_checkpoints(job), "step 2 to commit")
    before = snapshot(job)
    metrics_before = (job / "metrics.jsonl").read_bytes()

    started = time.monotonic()
    second = run(job)
    took = time.monotonic() - started
    assert second.returncode == 2, second.stderr[-3000:]
    assert_no_traceback(second.stderr)
    (line,) = [line for line in second.stderr.splitlines() if line.strip()]
    assert line.startswith(f"error: --job-log-dir {str(job)!r} is in use by another training run")
    assert f"pid {first.proc.pid} on host {socket.gethostname()}" in line
    assert "eval and decode may read the job dir meanwhile" in line
    assert took < 30, took  # refused before building or compiling anything
    assert snapshot(job) == before and (job / "metrics.jsonl").read_bytes() == metrics_before

    first.kill()  # SIGKILL: the lock file stays behind, the OS lock does not
    assert (job / "train.lock").exists()
    done = run(job)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Resuming shakespeare_char from checkpoint at step 2" in done.stdout
    assert_every_record_matches(job, ref)
    assert not (job / "train.lock").exists()
    print(f"second trainer refused in {took:.1f}s")


def test_a_complete_run_says_so_and_redoes_nothing(tmp_path):
    job = copy_of_reference(tmp_path)
    before = {p: p.stat().st_mtime_ns for p in job.rglob("*") if p.is_file()}
    started = time.monotonic()
    done = run(job)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    assert_no_traceback(done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines[-1] == (
        f"shakespeare_char in {job} is already trained to step {NUM_STEPS} (train.num_steps={NUM_STEPS}): "
        "nothing to do. Raise --train.num-steps to train further."
    ), done.stdout
    for work in ("Resuming", "eval:", "Finished at step", "Config changes", "step "):
        assert not any(line.startswith(work) for line in lines), done.stdout  # nothing redone or re-printed
    after = {p: p.stat().st_mtime_ns for p in job.rglob("*") if p.is_file()}
    assert after == before  # no eval, no plots, no config.json, no metrics line, no checkpoint
    print(f"complete run reported in {took:.1f}s")
