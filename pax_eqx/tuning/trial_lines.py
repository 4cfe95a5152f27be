"""What `tune` shows while its trials train: one line per running trial, from its metrics.jsonl.

A trial's trainer writes its output to trial.log (trial_run.py), so without these lines the
tuner said nothing for a whole trial: 35 - 49 s of a 300-step shakespeare_char trial, minutes on
a larger experiment. The tuner reads each trial's metrics.jsonl for the pruner already; its
train lines (step, loss, steps/s, every train.summary_interval_steps) and eval lines (the
study's metric) are what a person wants to see of a trial:

    trial 3: step 120/300 loss 2.013, eval loss 2.051 at 100, 12s, ETA 18s
    trial 4: starting, 3s

On a terminal the running trials' lines are redrawn in place at the bottom (rich's Live, as
train's bar is; `summaries/progress.py`), and the tuner's own lines ("trial 3 complete: ...")
print above them (`log`). Piped (a log file, CI), a trial's line is printed when it has news
and `every` seconds (10) have passed since its last one, or after `quiet` seconds (30) without
news, so a long compile is not silence either, and a summary every step is not a flood.
Either way a line is at most 80 columns: the ETA, then the eval, give way first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from pax_eqx.summaries.progress import TextStream, format_duration

WIDTH = 80


@dataclasses.dataclass
class TrialState:
    """What the tuner knows of one running trial: `started` is time.monotonic() at its start;
    step / loss from its newest train line; steps_per_s its trainer's pace since its first train
    line, evals and checkpoints included; eval (step, value) its newest eval of the study's
    metric."""

    number: int
    total_steps: int
    started: float
    step: int | None = None
    loss: float | None = None
    steps_per_s: float | None = None
    eval: tuple[int, float] | None = None
    news: bool = True  # changed since its last printed line
    printed: float = 0.0  # time.monotonic() of its last printed line (piped)
    first: tuple[int, float] | None = None  # (step, elapsed_s) of the trainer process's first train line

    def train_line(self, record: dict) -> None:
        """Takes a metrics.jsonl train line. The pace is the trainer's own clock (each line's
        elapsed_s): a resumed trial's older lines, read all at once, keep their own pace, and a
        new trainer process (elapsed_s going back) starts a new count, its compile excluded."""
        self.step = record["step"]
        loss = record.get("loss", record.get("total_loss"))
        self.loss = None if loss is None else float(loss)
        elapsed = record.get("elapsed_s")
        if not isinstance(elapsed, (int, float)):
            return
        if self.first is None or elapsed < self.first[1]:
            self.first, self.steps_per_s = (self.step, elapsed), None
        elif self.step > self.first[0] and elapsed > self.first[1]:
            self.steps_per_s = (self.step - self.first[0]) / (elapsed - self.first[1])


def trial_line(state: TrialState, metric: str, now: float) -> str:
    """The trial's line, at most WIDTH columns (the ETA, then the eval, dropped to fit)."""
    elapsed = format_duration(now - state.started)
    if state.step is None:
        return f"trial {state.number}: starting, {elapsed}"[:WIDTH]
    head = f"trial {state.number}: step {state.step}/{state.total_steps}"
    if state.loss is not None:
        head += f" loss {state.loss:.4g}"
    evaluated = f"{metric} {state.eval[1]:.4g} at {state.eval[0]}" if state.eval else None
    eta = None
    if state.steps_per_s and state.step < state.total_steps:
        eta = f"ETA {format_duration((state.total_steps - state.step) / state.steps_per_s)}"
    for parts in ([head, evaluated, elapsed, eta], [head, evaluated, elapsed], [head, elapsed]):
        line = ", ".join(p for p in parts if p)
        if len(line) <= WIDTH:
            return line
    return line[:WIDTH]


class TrialLines:
    """The running trials' lines (see the module doc). `running` and `record` come from the
    tuner's worker threads; `log` prints a line of the tuner's own above them; close at the end."""

    def __init__(
        self, metric: str, stream: TextStream | None = None, *, every: float = 10.0, quiet: float = 30.0
    ) -> None:
        self.metric = metric
        self.stream = sys.stdout if stream is None else stream
        self.every, self.quiet = every, quiet
        self._trials: dict[int, TrialState] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._live: Any = None
        self._thread: threading.Thread | None = None
        isatty = getattr(self.stream, "isatty", None)
        if isatty is not None and isatty():
            self._live = _live(self)
        else:
            self._thread = threading.Thread(target=self._tick, name="tune-trial-lines", daemon=True)
            self._thread.start()

    @contextlib.contextmanager
    def running(self, number: int, total_steps: int) -> Iterator[None]:
        """Trial `number` has a line while the block runs (its trainer's run)."""
        now = time.monotonic()
        with self._lock:
            self._trials[number] = TrialState(number, total_steps, now, printed=now)
        try:
            yield
        finally:
            with self._lock:
                self._trials.pop(number, None)

    def record(self, number: int, record: dict) -> None:
        """A metrics.jsonl line of the trial's trainer (train or eval)."""
        with self._lock:
            state = self._trials.get(number)
            if state is None:
                return
            if record.get("split") == "eval" and self.metric in record:
                state.eval = (record["step"], float(record[self.metric]))
            elif record.get("split") == "train":
                state.train_line(record)
            state.news = True

    def log(self, line: str) -> None:
        """A line of the tuner's: above the live lines on a terminal, else at once (flushed)."""
        if self._live is not None:
            self._live.console.print(line, highlight=False, markup=False, soft_wrap=True)
            return
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()

    def lines(self, now: float | None = None) -> list[str]:
        """Every running trial's line, by trial number."""
        now = time.monotonic() if now is None else now
        with self._lock:
            return [trial_line(s, self.metric, now) for _, s in sorted(self._trials.items())]

    def due(self, now: float) -> list[str]:
        """Piped: the lines to print now (news and `every` s since its last line, or `quiet` s
        since it), each marked printed."""
        out = []
        with self._lock:
            for _, state in sorted(self._trials.items()):
                waited = now - state.printed
                if (state.news and waited >= self.every) or waited >= self.quiet:
                    out.append(trial_line(state, self.metric, now))
                    state.news, state.printed = False, now
        return out

    def close(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _tick(self) -> None:
        while not self._stopped.wait(min(1.0, self.every / 4)):
            lines = self.due(time.monotonic())
            if not lines:
                continue
            try:
                with self._lock:
                    self.stream.write("".join(line + "\n" for line in lines))
                    self.stream.flush()
            except (OSError, ValueError):  # a closed pipe: the tuner's own writes report it
                return


def _live(lines: TrialLines) -> Any:
    """rich's Live over the running trials' lines, redrawn twice a second (the elapsed time
    moves), cleared when it stops; stdout and stderr print above it while it runs."""
    from rich.console import Console, Group
    from rich.live import Live
    from rich.text import Text

    class _Lines:
        def __rich__(self) -> Group:
            return Group(*(Text(line, no_wrap=True, overflow="ellipsis") for line in lines.lines()))

    console = Console(file=lines.stream, force_terminal=True, highlight=False)
    live = Live(_Lines(), console=console, refresh_per_second=2, transient=True, redirect_stdout=True,
                redirect_stderr=True)  # fmt: skip
    live.start()
    return live
