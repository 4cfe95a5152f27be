"""Driving the real `python -m pax_eqx.train` in subprocesses, killing it, and reading its job dir.

Every run uses the same tiny experiment (tests/programs/tiny.py, shrunk further): 8 steps,
a checkpoint every 2 (keep 3), a rolling eval every 3, the loss logged every step, one CPU
device, and the fault-injecting text input of `reliability_faults`. A persistent JAX
compilation cache (one per pytest worker) makes every run after the first skip compiling.

The loss trajectory is DIR/metrics.jsonl: one JSON line per step, whose floats are Python's
`repr` of the float32 loss (exact: a float32 converts to a float64 exactly, and repr round
trips). `records()` returns every line, including the ones a killed run logged past its last
checkpoint, so a test can check that the rerun recomputed those steps bit for bit.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "programs"))

from tiny import TINY  # noqa: E402

NUM_STEPS = 8
EVERY_N_STEPS = 2
EVAL_INTERVAL = 3
ARGS = [
    "--exp", "shakespeare_char", *TINY,
    "--mesh.ici-mesh-shape", "1", "1", "1", "--data.train.batch-size", "4", "--data.eval.batch-size", "4",
    "--data.source", "custom", "--data.custom-input", "reliability_faults.faulty_text_input",
    "--train.num-steps", str(NUM_STEPS), "--train.summary-interval-steps", "1",
    "--train.eval-interval-steps", str(EVAL_INTERVAL), "--train.no-sample-at-end",
    "--checkpoint.every-n-steps", str(EVERY_N_STEPS), "--checkpoint.max-to-keep", "3",
]  # fmt: skip
RUN_TIMEOUT_S = 120


@functools.cache
def workspace() -> Path:
    """This process's scratch directory: the corpus, the compilation cache, the reference run."""
    root = Path(tempfile.mkdtemp(prefix="pax_eqx_reliability_"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    corpus = root / "corpus.txt"
    from pax_eqx.data.shakespeare import shakespeare_documents

    corpus.write_text("\n".join(shakespeare_documents("train"))[:60_000])
    (root / "jax_cache").mkdir()
    return root


def corpus() -> Path:
    return workspace() / "corpus.txt"


def command(job: Path, *extra: str, program: str = "pax_eqx.train", max_file_bytes: int | None = None) -> list[str]:
    """The command line; with `max_file_bytes`, the program runs under that file-size limit
    (RLIMIT_FSIZE, set by a launcher that then runs the module: a write past it fails with EFBIG,
    as a write to a full disk fails with ENOSPC; Python ignores SIGXFSZ, so it is an error)."""
    args = [*ARGS, "--job-log-dir", str(job), *extra]
    if max_file_bytes is None:
        return [sys.executable, "-m", program, *args]
    launcher = (
        "import resource, runpy, sys; "
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({max_file_bytes}, resource.RLIM_INFINITY)); "
        f"sys.argv = [{program!r}, *sys.argv[1:]]; runpy.run_module({program!r}, run_name='__main__')"
    )
    return [sys.executable, "-c", launcher, *args]


def environment(faults: str = "", markers: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAX_RELIABILITY_", "PAX_EQX_TRACEBACK"))}
    env.update(
        XLA_FLAGS="--xla_force_host_platform_device_count=1",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        PYTHONUNBUFFERED="1",
        JAX_COMPILATION_CACHE_DIR=str(workspace() / "jax_cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        PAX_RELIABILITY_CORPUS=str(corpus()),  # what reliability_faults' custom input reads
    )
    if faults:
        env["PAX_RELIABILITY_FAULTS"] = faults
        env["PAX_RELIABILITY_MARKERS"] = str(markers)
    return env


def run(job: Path, *extra: str, faults: str = "", max_file_bytes: int | None = None, program: str = "pax_eqx.train"):
    """Runs the CLI to completion; returns the CompletedProcess (text stdout/stderr)."""
    return subprocess.run(
        command(job, *extra, program=program, max_file_bytes=max_file_bytes),
        env=environment(faults, job.parent),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=REPO,
    )


class Running:
    """A CLI run in the background, its output collected in files (no pipe to fill up)."""

    def __init__(self, job: Path, *extra: str, faults: str = ""):
        self.job = job
        self.markers = job.parent / f"{job.name}-markers-{time.time_ns()}"
        self.markers.mkdir()
        self.stdout_path, self.stderr_path = self.markers / "stdout", self.markers / "stderr"
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                command(job, *extra), env=environment(faults, self.markers), stdout=out, stderr=err, cwd=REPO
            )

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text()

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def wait_for(
        self, condition: Callable[[], bool], what: str, timeout: float = RUN_TIMEOUT_S, poll_s: float = 0.005
    ) -> None:
        """Polls `condition` every `poll_s`; fails if the run exits or time runs out first."""
        deadline = time.monotonic() + timeout
        while not condition():
            if self.proc.poll() is not None:
                raise AssertionError(f"the run exited ({self.proc.returncode}) before {what}:\n{self.stderr[-3000:]}")
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"timed out waiting for {what}:\n{self.stderr[-3000:]}")
            time.sleep(poll_s)

    def wait_for_hold(self, name: str) -> None:
        self.wait_for(lambda: (self.markers / f"hold-{name}").exists(), f"the hold at {name}")

    def release(self, name: str) -> None:
        (self.markers / f"release-{name}").touch()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def finish(self, timeout: float = RUN_TIMEOUT_S) -> int:
        return self.proc.wait(timeout=timeout)


# --------------------------------------------------------------------------- reading a job dir


def records(job: Path) -> list[dict]:
    """Every line of DIR/metrics.jsonl, in the order written (a killed run's lines included)."""
    path = job / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# What a step decides, bit for bit; tokens_per_s and steps_per_s are timings.
DETERMINED = ("loss", "grad_norm", "learning_rate", "accuracy", "skipped_steps", "num_predictions")


def trajectory(job: Path, split: str = "train") -> dict[int, dict]:
    """step -> the determined metrics of the last record of `split` at that step."""
    out = {}
    for r in records(job):
        if r["split"] == split:
            out[r["step"]] = {k: r[k] for k in DETERMINED if k in r}
    return out


def assert_every_record_matches(job: Path, reference: Path, steps=None) -> None:
    """Every train and eval line of `job` (killed runs' lines too) equals the reference's line for
    that step exactly, and every reference step is present (with `steps`: only those steps)."""
    for split in ("train", "eval"):
        want = trajectory(reference, split)
        if steps is not None:
            want = {s: v for s, v in want.items() if s in steps}
        seen = set()
        for r in records(job):
            if r["split"] != split or (steps is not None and r["step"] not in steps):
                continue
            got = {k: r[k] for k in DETERMINED if k in r}
            assert r["step"] in want, f"{split} step {r['step']} is not a reference step: {sorted(want)}"
            assert got == want[r["step"]], f"{split} step {r['step']}: {got} != reference {want[r['step']]}"
            seen.add(r["step"])
        assert seen == set(want), f"{split} steps {sorted(seen)} != reference steps {sorted(want)}"


def committed_steps(job: Path) -> list[int]:
    ckpt = job / "checkpoints"
    return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) if ckpt.exists() else []


def tmp_checkpoints(job: Path) -> list[str]:
    ckpt = job / "checkpoints"
    return sorted(p.name for p in ckpt.iterdir() if ".orbax-checkpoint-tmp" in p.name) if ckpt.exists() else []


def snapshot(job: Path) -> dict[str, bytes]:
    """DIR/config.json and every file of a committed checkpoint, by relative path, with its bytes."""
    out = {}
    for path in sorted([job / "config.json", *(job / "checkpoints").rglob("*")]):
        if path.is_file() and ".orbax-checkpoint-tmp" not in str(path):
            out[str(path.relative_to(job))] = path.read_bytes()
    return out


@functools.cache
def reference() -> Path:
    """The uninterrupted run every resumed run is compared with (once per pytest worker)."""
    job = workspace() / "reference" / "job"
    job.parent.mkdir()
    done = run(job)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Finished at step {NUM_STEPS}" in done.stdout, done.stdout
    assert committed_steps(job) == [4, 6, 8]
    assert sorted(trajectory(job)) == list(range(1, NUM_STEPS + 1))
    return job


def copy_of_reference(tmp_path: Path) -> Path:
    job = tmp_path / "job"
    shutil.copytree(reference(), job)
    return job


def assert_no_traceback(text: str) -> None:
    assert "Traceback (most recent call last)" not in text, text[-4000:]
