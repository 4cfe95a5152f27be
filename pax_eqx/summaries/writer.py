"""SummaryWriter: one call logs a step's metrics to TensorBoard and to DIR/metrics.jsonl.

    writer = SummaryWriter(job_dir, enabled=jax.process_index() == 0)
    writer.write(step, "train", {"total_loss": 2.31, "learning_rate": 1e-3})
    writer.close()

Two records of the same numbers, for two readers:
- `DIR/summaries/{train,eval}/events.*` -- TensorBoard event files (tensorboardX, no
  TensorFlow needed), one run per split so both curves share a chart;
- `DIR/metrics.jsonl` -- one JSON object per logged step, `{"step": 120, "split": "train",
  "loss": 2.31, "total_loss": 2.31, ..., "time": 1764116400.123, "elapsed_s": 41.7}` (the
  wall time of the write, and seconds since this process's writer opened: `TIMING_KEYS`, with
  the rates, are the keys that are not a step's results), for scripts, plots and tests. It is flushed after
  every line, so a SIGKILL loses nothing already written, and it is opened for appending, so a
  resumed run adds to it and never truncates it. A resumed run re-logs the steps after its
  checkpoint; readers keep the last record of each (split, step) (`read_metrics` does).

`loss` is always present: it is `total_loss` when the metrics do not name a `loss`, so plots
and dashboards have one name to look for. Non-finite values are written as the strings
"nan", "inf", "-inf" (bare NaN is not JSON), as the config files do.

Only process 0 should write (`enabled=False` elsewhere makes every call a no-op and creates
no files).

A separate `python -m pax_eqx.eval` run writes its own records, never the trainer's:
`SummaryWriter(job_dir, metrics_file=EVAL_RESULTS_FILE)` with split "eval_separate" appends to
DIR/eval_results.jsonl and to the TensorBoard run DIR/summaries/eval_separate/ (the trainer may
be writing metrics.jsonl and summaries/eval/ at the same time, and its resumes purge its own
TensorBoard events past the restored step).

A write that fails (disk full, a read-only or missing directory) raises SummaryWriteError
naming the file and the OS's reason; the writer is then closed quietly (tensorboardX would
otherwise retry the failing flush at exit and print a traceback).

Experiment trackers (`train.trackers`: Weights & Biases, MLflow; summaries/trackers.py) get each
step's scalars too, the same numbers as its metrics.jsonl line less the clocks (`time`,
`elapsed_s`). The trainer's writer (metrics.jsonl) starts the trackers DIR/config.json names, with
that config and the command of DIR/command.txt, both written before the writer opens; `trackers=`
passes others (or none). A tracker that cannot start raises SummaryWriteError with its reason; one
that fails later is dropped with a warning. `close` finishes their runs; a process that exits
without closing its writer (a failed run) marks them failed.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, SupportsFloat

from pax_eqx.config import ConfigError
from pax_eqx.summaries import trackers as tracking
from pax_eqx.summaries.scalars import with_loss_alias

SPLITS = ("train", "eval", "eval_separate")
METRICS_FILE = "metrics.jsonl"
EVAL_RESULTS_FILE = "eval_results.jsonl"


class SummaryWriteError(RuntimeError):
    """Writing DIR/metrics.jsonl (or eval_results.jsonl) or a TensorBoard event file failed."""


def _reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return f"{type(error).__name__}: {error}"


def _json_number(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _as_float(split: str, step: int, name: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"metric {name!r} ({split}, step {step}) must be a number (a Python float or a scalar array), "
            f"got {type(value).__name__} {value!r:.80}; reduce it to a scalar before logging."
        ) from None


# The keys of a metrics.jsonl row that are clocks and rates, not what a step computed: a resumed
# run's rows equal an uninterrupted run's once these are left out.
TIMING_KEYS = frozenset({"time", "elapsed_s", "tokens_per_s", "examples_per_s", "steps_per_s"})


class SummaryWriter:
    """Writes TensorBoard scalars and metrics.jsonl lines under `job_dir` (see module doc).

    `start_step`: the step a resumed run restarts from. TensorBoard is then told to drop the
    events of earlier runs logged after it (tensorboardX's `purge_step`), so curves do not
    double back where a killed run had logged past its last checkpoint.

    `trackers`: experiment trackers to start and send every scalar to; None = those DIR/config.json
    names (`train.trackers`) when this writer writes metrics.jsonl (the trainer's), else none.
    """

    def __init__(
        self,
        job_dir: str | os.PathLike,
        enabled: bool = True,
        *,
        start_step: int = 0,
        metrics_file: str = METRICS_FILE,
        trackers: Sequence[tracking.Tracker] | None = None,
    ):
        self.job_dir = Path(job_dir)
        self.enabled = enabled
        self.metrics_path = self.job_dir / metrics_file
        self._start_step = start_step
        self._opened = time.time()  # a row's elapsed_s counts from here (this process's run)
        self._tensorboard: dict[str, Any] = {}
        self._jsonl = None
        self._trackers: list[tracking.Tracker] = []
        self._closed = False
        if enabled:
            try:
                self.job_dir.mkdir(parents=True, exist_ok=True)
                self._jsonl = open(self.metrics_path, "a", encoding="utf-8")
                if _ends_mid_line(self.metrics_path):
                    self._jsonl.write("\n")  # a killed run's torn line must not swallow our first record
                    self._jsonl.flush()
            except OSError as e:
                self._close_quietly()
                raise SummaryWriteError(f"cannot open {self.metrics_path} for appending ({_reason(e)})") from e
            self._start_trackers(trackers, metrics_file == METRICS_FILE)

    def _start_trackers(self, trackers: Sequence[tracking.Tracker] | None, trainer: bool) -> None:
        if trackers is None and not trainer:
            return
        config, command = tracking.run_record(self.job_dir)
        if trackers is None:
            trackers = tracking.make_trackers(self.job_dir, tracking.TrackerSettings.of(config))
        for tracker in trackers:
            try:
                tracker.start(config, command)
            except tracking.TrackerError as e:
                self._close_quietly()
                raise SummaryWriteError(str(e)) from e
            self._trackers.append(tracker)
        if self._trackers:
            atexit.register(self._abandon)  # a failed run never closes its writer

    def _board(self, split: str):
        """The split's tensorboardX writer, created on first use (an unused split gets no file)."""
        if split not in self._tensorboard:
            from tensorboardX import SummaryWriter as TensorBoardWriter

            self._tensorboard[split] = TensorBoardWriter(
                logdir=str(self.job_dir / "summaries" / split),
                purge_step=self._start_step + 1 if self._start_step > 0 else None,
                # Unique per writer: tensorboardX names files by the second, and a second
                # writer in the same second would otherwise overwrite the first one's file.
                filename_suffix=f".{os.getpid()}.{time.time_ns()}",
                flush_secs=10,
            )
        return self._tensorboard[split]

    def write(self, step: int, split: str, metrics: Mapping[str, SupportsFloat]) -> None:
        """Logs `metrics` (name -> scalar) at `step` for `split` ("train" or "eval")."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
        if self._closed:
            raise RuntimeError(f"SummaryWriter for {self.job_dir} is closed; cannot log step {step}.")
        if not self.enabled:
            return
        step = int(step)
        values = {name: _as_float(split, step, name, v) for name, v in metrics.items()}
        values = with_loss_alias(values)
        record = {"step": step, "split": split, **{k: _json_number(v) for k, v in values.items()}}
        now = time.time()
        record.update(time=round(now, 3), elapsed_s=round(now - self._opened, 3))  # not metrics: not on the board

        def add_to_board(board) -> None:
            for name, value in values.items():
                board.add_scalar(name, value, global_step=step)

        self._log(step, split, record, add_to_board)
        for tracker in list(self._trackers):
            try:
                tracker.log(step, split, values)
            except Exception as e:  # noqa: BLE001 -- a dashboard's failure must not stop training
                self._drop(tracker, f"at step {step}", e)

    def _drop(self, tracker: tracking.Tracker, when: str, error: BaseException) -> None:
        self._trackers.remove(tracker)
        tracking.warn_dropped(tracker, when, error)
        try:
            tracker.finish("failed")
        except Exception:  # noqa: BLE001 -- already reported
            pass

    def _finish_trackers(self, status: str) -> None:
        """Closes each tracker's run (a failure to: one warning each)."""
        trackers, self._trackers = self._trackers, []
        atexit.unregister(self._abandon)
        for tracker in trackers:
            try:
                tracker.finish(status)
            except Exception as e:  # noqa: BLE001 -- the job dir's records are complete
                tracking.warn_dropped(tracker, "to finish its run", e)

    def _abandon(self) -> None:
        """At exit, a writer never closed: its run failed (or was interrupted)."""
        if not self._closed:
            self._close_quietly()

    def write_text(self, step: int, split: str, name: str, texts: list[str]) -> None:
        """Logs `texts` (decoded samples) at `step`: one metrics.jsonl line `{"step", "split", name:
        [texts]}` and TensorBoard text `name/<i>` under summaries/<split>/."""
        if self._closed:
            raise RuntimeError(f"SummaryWriter for {self.job_dir} is closed; cannot log step {step}.")
        if not self.enabled:
            return
        step = int(step)
        record = {"step": step, "split": split, name: list(texts)}

        def add_to_board(board) -> None:
            for i, text in enumerate(texts):
                board.add_text(f"{name}/{i}", text, global_step=step)

        self._log(step, split, record, add_to_board)

    def _log(self, step: int, split: str, record: dict, add_to_board) -> None:
        """One metrics.jsonl line, then `add_to_board(board)` on the split's TensorBoard writer;
        a failing write closes every file and raises SummaryWriteError naming the file."""
        try:
            self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()
        except OSError as e:
            self._close_quietly()
            raise SummaryWriteError(f"writing {self.metrics_path} failed at step {step} ({_reason(e)})") from e
        try:
            board = self._board(split)
            add_to_board(board)
            board.flush()
        except OSError as e:
            self._close_quietly()
            where = self.job_dir / "summaries" / split
            raise SummaryWriteError(
                f"writing the TensorBoard events in {where} failed at step {step} ({_reason(e)})"
            ) from e

    def close(self) -> None:
        """Flushes and closes every file; further writes are an error. Raises SummaryWriteError
        (after closing everything) if the last flush fails."""
        error = None
        for split, board in self._tensorboard.items():
            try:
                board.close()
            except OSError as e:
                error = error or SummaryWriteError(
                    f"writing the TensorBoard events in {self.job_dir / 'summaries' / split} failed ({_reason(e)})"
                )
        if self._jsonl is not None:
            try:
                self._jsonl.close()
            except OSError as e:
                error = error or SummaryWriteError(f"writing {self.metrics_path} failed ({_reason(e)})")
        if error is not None:
            self._close_quietly()
            raise error
        self._finish_trackers("finished")
        self._tensorboard = {}
        self._jsonl = None
        self._closed = True

    def _close_quietly(self) -> None:
        """After a failed write: release every file without flushing again, and without leaving
        tensorboardX an exit hook that would retry the flush (and print its traceback)."""
        for board in self._tensorboard.values():
            writers = list((getattr(board, "all_writers", None) or {}).values())
            try:
                board.close()
            except Exception:  # noqa: BLE001 -- the first error is the one reported
                for writer in writers:
                    event_writer = getattr(writer, "event_writer", None)
                    if event_writer is not None:
                        event_writer._closed = True
        if self._jsonl is not None:
            try:
                self._jsonl.close()
            except OSError:
                pass
        self._finish_trackers("failed")
        self._tensorboard = {}
        self._jsonl = None
        self._closed = True

    def __enter__(self) -> SummaryWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _parse_number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _ends_mid_line(path: Path) -> bool:
    with open(path, "rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def read_metrics(job_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of DIR/metrics.jsonl, the last one of each (split, step), sorted by step.

    A resumed run re-logs the steps between its checkpoint and the point where the previous
    run died; the later record wins. A torn last line (the writer was killed mid-line) is
    skipped. Non-finite values come back as float nan/inf. A line that is not UTF-8 was not
    written by pax_eqx (its lines are ASCII JSON): ConfigError, naming the line and its bytes.
    """
    path = Path(job_dir) / METRICS_FILE
    latest: dict[tuple[str, int], dict[str, Any]] = {}
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                record = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                shown = repr(raw[:40]) + ("..." if len(raw) > 40 else "")
                raise ConfigError(
                    f"{path} line {number} is not UTF-8 text ({shown}): pax_eqx writes ASCII JSON lines, so "
                    "something else wrote it; delete that line (or restore the file) and rerun."
                ) from None
            except json.JSONDecodeError:
                continue
            if not isinstance(record, dict) or "step" not in record or "split" not in record:
                continue
            for key, value in record.items():
                if key not in ("step", "split") and isinstance(value, str):
                    record[key] = _parse_number(value)
            latest[(record["split"], record["step"])] = record
    return sorted(latest.values(), key=lambda r: (r["step"], r["split"]))
