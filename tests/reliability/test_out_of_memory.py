"""Running out of memory during a run is one line with the planner's estimate and the flags that
use less memory, exit 1, and the checkpoints written before are kept.

A real out-of-memory needs a real device; the test makes one where XLA would raise it: a small
worker script wraps the jitted train step (`Programs.train_step`) so that its N-th call raises
the exception JAX raises when XLA runs out of memory (`jax.errors.JaxRuntimeError`, jaxlib's
XlaRuntimeError, "RESOURCE_EXHAUSTED: Out of memory while trying to allocate ..."), or Python's
MemoryError for the host; then runs `python -m pax_eqx.train`'s main through the same
`entry.run` as the command line. The first call stands for compiling (jit compiles on it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "programs"))

from tiny import tiny_args  # noqa: E402

WORKER = """
import os
import sys

import jax

import pax_eqx.train
from pax_eqx.command_line import entry
from pax_eqx.programs import compiled

AT, KIND = int(os.environ["OOM_AT_CALL"]), os.environ["OOM_KIND"]
build = compiled.Programs.__init__


def init(self, *args, **kwargs):
    build(self, *args, **kwargs)
    step, calls = self.train_step, [0]

    def train_step(state, batch):
        calls[0] += 1
        if calls[0] == AT:
            if KIND == "host":
                raise MemoryError()
            raise jax.errors.JaxRuntimeError(
                "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes."
            )
        return step(state, batch)

    self.train_step = train_step


compiled.Programs.__init__ = init
sys.argv = ["pax_eqx.train", *sys.argv[1:]]
entry.run(pax_eqx.train.main, memory_planner=pax_eqx.programs.planned_bytes)  # as train's __main__
"""


def run(tmp_path: Path, job: Path, *extra: str, kind: str | None, at: int = 0) -> subprocess.CompletedProcess:
    worker = tmp_path / "oom_worker.py"
    worker.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if k not in ("PAX_EQX_VERBOSE", "PAX_EQX_TRACEBACK", "XLA_FLAGS")}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), OOM_KIND=kind or "none", OOM_AT_CALL=str(at))
    args = tiny_args(job, "--train.no-sample-at-end", *extra, num_devices=1)
    command = [sys.executable, str(worker), *args] if kind else [sys.executable, "-m", "pax_eqx.train", *args]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def error_line(result: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def steps(job: Path) -> list[int]:
    return sorted(int(p.name) for p in (job / "checkpoints").iterdir() if p.name.isdigit())


def test_device_oom_mid_run_is_one_line_and_keeps_the_checkpoints(tmp_path):
    """The tiny run saves every 3 steps; step 5 runs out of device memory."""
    job = tmp_path / "job"
    result = run(tmp_path, job, kind="device", at=5)
    assert result.returncode == 1, result.stderr
    line = error_line(result)
    for part in (
        "error: out of device memory (RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.)",
        "; the planner (--dry-run) estimates ",
        " MiB per device for shakespeare_char;",
        "; to use less memory: a smaller --data.train.batch-size (now 4), --model.remat-policy full (now none: ",
        "--model.loss-chunk-size 4 (now 0: the logits of all positions at once)",
        "--learner.num-microbatches 2 (now 1: ",
        "; the checkpoints written before are intact (the newest: step 3); a rerun with the model or learner flags "
        "above resumes from it (a new batch size needs --checkpoint.allow-config-change).",
    ):
        assert part in line, (part, line)
    assert steps(job) == [3]
    # The advice taken, no fault: a memory flag changes no array of the state, so the run resumes
    # from step 3 without --checkpoint.allow-config-change and finishes.
    rerun = run(tmp_path, job, "--model.remat-policy", "full", "--learner.num-microbatches", "2", kind=None)
    assert rerun.returncode == 0, rerun.stderr
    assert "from checkpoint at step 3" in rerun.stdout
    assert steps(job)[-1] == 6


def test_host_memory_error_at_the_first_step_is_one_line(tmp_path):
    job = tmp_path / "job"
    result = run(tmp_path, job, kind="host", at=1)
    assert result.returncode == 1, result.stderr
    line = error_line(result)
    assert line.startswith("error: out of host memory (MemoryError); the planner (--dry-run) estimates "), line
    assert "--data.train.batch-size (now 4)" in line
    assert line.endswith("; no checkpoint had been written; nothing else is lost."), line
