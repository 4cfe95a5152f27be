"""One trial: `python -m pax_eqx.train` in its job dir, watched through its metrics.jsonl.

The trainer is a child process writing its output to DIR/trial.log. While it runs, the eval
lines it appends to DIR/metrics.jsonl are handed to `report(step, value)`, and every line (train
and eval) to `watch` (the tuner's line for the trial: trial_lines.py); when `report` says
prune, the trainer is sent SIGTERM, which makes it save a checkpoint and exit 0 (pruned trials
keep a resumable job dir). It stops at its next host sync: steps are dispatched ahead of the
device, up to the next `train.summary_interval_steps` (the tuner's table says where it stopped).
`stopping()` true (the tuner was interrupted) sends the same signal. On Linux the child
also gets SIGTERM if the tuner dies without a chance to send it (SIGKILL): PR_SET_PDEATHSIG,
so no trainer outlives its tuner.

The outcome is read from what the trainer left: its exit status, its last eval value, and
whether it reached `train.num_steps`. A trainer that exits 0 before the end without being
pruned was interrupted (SIGTERM from the tuner or from outside): the trial is to be resumed.
A trainer killed by a signal the tuner did not send (SIGKILL from the kernel's out-of-memory
killer or an operator's `kill -9`) is `killed`: its last checkpoint is intact, so the tuner
resumes it too, a bounded number of times (study.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from pax_eqx.config import ConfigError
from pax_eqx.programs.evaluate.eval_loop import WATCHED_METRIC_ENV, WATCHED_METRIC_ERROR

LOG_FILE = "trial.log"  # the trainer process's whole output (its own train.log has its log lines)
POLL_SECONDS = 0.2


class MetricNotFoundError(ConfigError):
    """The study's metric is not among the trainer's eval metrics (every trial would fail alike)."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """state: complete (value is the last eval's), pruned (value is the eval that pruned it, at
    `eval_step`), failed (`error` is the trainer's error line), interrupted (to be resumed from
    its checkpoint) or killed (by a signal from outside; `error` names it). step: the last step
    the trainer logged."""

    state: Literal["complete", "pruned", "failed", "interrupted", "killed"]
    value: float | None
    step: int
    error: str = ""
    eval_step: int = 0


class EvalLines:
    """The eval lines appended to a metrics.jsonl since the last call (a torn line from a killed
    writer is skipped; a line still being written waits for its newline); `watch` sees every
    line read, train lines too."""

    def __init__(self, path: Path, watch: Callable[[dict], None] = lambda record: None):
        self.path = path
        self.offset = 0
        self.last_step = 0
        self.watch = watch

    def new(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        records = []
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                self.last_step = max(self.last_step, record["step"])
                self.watch(record)
                if record.get("split") == "eval":
                    records.append(record)
        return records


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn asking Linux to SIGTERM the child when its parent dies; None elsewhere.
    prctl is looked up here, in the parent: the child only makes the one C call."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    prctl, pr_set_pdeathsig, sigterm = libc.prctl, 1, int(signal.SIGTERM)
    return lambda: prctl(pr_set_pdeathsig, sigterm)


def run_trial(
    command: Sequence[str],
    job_dir: Path,
    *,
    metric: str,
    num_steps: int,
    stops_early: bool,
    report: Callable[[int, float], bool],
    stopping: Callable[[], bool],
    heartbeat: Callable[[], None] = lambda: None,
    heartbeat_seconds: float = 30.0,
    started: Callable[[int], None] = lambda pid: None,
    watch: Callable[[dict], None] = lambda record: None,
) -> Outcome:
    """Runs `command` (a trainer writing into `job_dir`) to its end and says how it ended.

    report(step, value): each new eval value of `metric`; True prunes the trial. stops_early:
    the run has train.early_stopping, so ending before num_steps with exit 0 is a completion.
    started(pid): called with the trainer's pid once it runs. watch(record): every metrics.jsonl
    line the trainer writes, as it is read (every POLL_SECONDS). MetricNotFoundError when the
    trainer refuses `metric` at start (it gets it in WATCHED_METRIC_ENV), or, after stopping the
    trainer, when an eval line lacks it."""
    job_dir.mkdir(parents=True, exist_ok=True)
    lines = EvalLines(job_dir / "metrics.jsonl", watch)
    last: tuple[int, float] | None = None
    pruned_at: int | None = None
    pruned_value: float | None = None
    interrupted = False
    with open(job_dir / LOG_FILE, "ab") as log:
        log.write(f"$ {' '.join(command)}\n".encode())
        log.flush()
        env = {**os.environ, WATCHED_METRIC_ENV: metric}  # the trainer checks it at start
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent(), env=env)
    started(proc.pid)
    beat = time.monotonic()
    try:
        while True:
            code = proc.poll()
            for record in lines.new():
                if metric not in record:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait()
                    keys = sorted(k for k in record if k not in ("step", "split"))
                    raise MetricNotFoundError(
                        f"--metric {metric!r} is not an eval metric of this experiment; its eval lines have "
                        f"{', '.join(keys)}. Pass --metric with one of them."
                    )
                last = (record["step"], float(record[metric]))
                if pruned_at is None and not interrupted and last[0] < num_steps and report(*last):
                    pruned_at, pruned_value = last
                    proc.send_signal(signal.SIGTERM)
            if code is not None:
                break
            if stopping() and not interrupted and pruned_at is None:
                interrupted = True
                proc.send_signal(signal.SIGTERM)
            if time.monotonic() - beat >= heartbeat_seconds:
                heartbeat()
                beat = time.monotonic()
            time.sleep(POLL_SECONDS)
    except BaseException:
        if proc.poll() is None:  # the tuner itself is going down: let the trainer save first
            proc.send_signal(signal.SIGTERM)
            proc.wait()
        raise
    lines.new()  # what the trainer wrote after the last poll
    step = lines.last_step
    if pruned_at is not None:
        return Outcome("pruned", pruned_value, step, eval_step=pruned_at)
    if code == 0:
        if last is not None and (step >= num_steps or (stops_early and not interrupted)):
            return Outcome("complete", last[1], last[0])
        if last is None and step >= num_steps:
            return Outcome("failed", None, step, "the trainer logged no eval line")
        return Outcome("interrupted", None, step)
    if interrupted and code in (130, -signal.SIGINT, -signal.SIGTERM):
        return Outcome("interrupted", None, step)
    if code < 0:
        return Outcome("killed", None, step, f"killed by {_signal_name(-code)} at step {step}")
    error = _error_line(job_dir / LOG_FILE, code)
    if code == 2 and error.startswith(WATCHED_METRIC_ERROR):  # the trainer refused the study's metric at start
        raise MetricNotFoundError(error.removesuffix(f" (exit {code})"))
    return Outcome("failed", None, step, error)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _error_line(log: Path, code: int) -> str:
    """The trainer's last `error: ...` line and its exit status. Without one (a crash that printed
    a traceback), the status and where the whole output is: its last line would be whatever the
    trainer printed last, a progress line as often as not."""
    try:
        tail = log.read_bytes()[-20000:].decode(errors="replace").splitlines()
    except OSError:
        tail = []
    errors = [line for line in tail if line.startswith("error: ")]
    if errors:
        return f"{errors[-1].removeprefix('error: ')} (exit {code})"
    return f"the trainer exited {code} without an error line; its output is in {log}"
