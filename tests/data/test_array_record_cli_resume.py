"""`--data.source array_record` resumes exactly through the training CLI: a tiny LM trains on the
C4-shaped fixture prepared into ArrayRecord shards (bytes, documents packed at read time), is
SIGKILLed by `python -m pax_eqx.train`'s side after a checkpoint commits, is rerun with the same
command, and every metrics line of both runs -- the killed run's steps past its checkpoint
included, which the rerun computes again -- equals the uninterrupted run's bit for bit. Equal
losses at every step mean equal batches: the input's iterator state (grain's position in the
shuffled, host-sliced, packed stream of shard records) was restored with the model.

The run helpers are the reliability harness's (tests/reliability/reliability_harness.py): one
CPU device, a persistent compilation cache shared by the three runs, metrics.jsonl read
exactly."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("apache_beam", reason="the [prepare] extra (.ci/run installs it)")

sys.path.insert(0, str(Path(__file__).parents[1] / "reliability"))

from reliability_harness import (  # noqa: E402
    RUN_TIMEOUT_S,
    assert_every_record_matches,
    assert_no_traceback,
    committed_steps,
    environment,
    tmp_checkpoints,
    trajectory,
)

from pax_eqx.data.prepare.config import PrepareConfig  # noqa: E402

ROOT = Path(__file__).parents[2]
C4_TRAIN = f"{ROOT}/tests/fixtures/c4_small/c4-train.*.json.gz"
NUM_STEPS = 16
ARGS = [
    "--exp", "shakespeare_char", "--model.num-layers", "1", "--model.model-dims", "32", "--model.hidden-dims",
    "64", "--model.num-heads", "2", "--mesh.ici-mesh-shape", "1", "1", "1",
    "--data.seq-len", "32", "--data.train.batch-size", "4", "--data.eval.batch-size", "4",
    "--data.eval.eval-loop-num-batches", "2", "--data.eval.no-reset-for-eval",
    "--train.num-steps", str(NUM_STEPS), "--train.summary-interval-steps", "1", "--train.eval-interval-steps", "5",
    "--train.steps-per-loop", "1", "--train.no-sample-at-end",
    "--checkpoint.every-n-steps", "2", "--checkpoint.max-to-keep", "2",
]  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The fixture's training pages, byte-tokenized documents in 2 shards (in this process)."""
    from pax_eqx.data.prepare import pipeline

    out = tmp_path_factory.mktemp("prepared") / "c4"
    pipeline.prepare(PrepareConfig(input=C4_TRAIN, output_dir=str(out), num_shards=2, num_workers=1))
    return out


def command(job: Path, corpus: Path) -> list[str]:
    return [sys.executable, "-m", "pax_eqx.train", *ARGS, "--data.source", "array_record", "--data.path",
            str(corpus), "--job-log-dir", str(job)]  # fmt: skip


def run(job: Path, corpus: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(
        command(job, corpus), env=environment(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=ROOT
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert_no_traceback(done.stderr)
    return done


def test_array_record_input_resumes_bit_for_bit_after_sigkill(corpus, tmp_path):
    reference = tmp_path / "reference"
    run(reference, corpus)
    assert sorted(trajectory(reference)) == list(range(1, NUM_STEPS + 1))
    assert sorted(trajectory(reference, "eval")) == [5, 10, 15, 16]

    job = tmp_path / "job"
    with open(tmp_path / "stdout", "w") as out, open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen(command(job, corpus), env=environment(), stdout=out, stderr=err, cwd=ROOT)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        # a checkpoint past step 2 committed, so the rerun restores a mid-run input position
        while not (any(4 <= s < NUM_STEPS for s in committed_steps(job)) and not tmp_checkpoints(job)):
            assert proc.poll() is None, f"the run exited before a checkpoint: {(tmp_path / 'stderr').read_text()}"
            assert time.monotonic() < deadline, "timed out waiting for a checkpoint"
            time.sleep(0.002)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    killed_at = max(committed_steps(job))
    assert killed_at < NUM_STEPS, "the kill came after the final checkpoint: nothing was resumed"
    print(f"killed with step {killed_at} committed, steps {sorted(trajectory(job))} logged")

    done = run(job, corpus)
    assert f"Finished at step {NUM_STEPS}" in done.stdout
    assert_every_record_matches(job, reference)
