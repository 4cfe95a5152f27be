"""Progress: a live bar on a terminal (rich), plain timestamped lines everywhere else.

    progress = Progress(total_steps=2000, start_step=0, events={"evaluating": 500})
    progress.advance(step)                                          # each compiled call: no host sync
    progress.completed(step, seconds_per_step)                      # the device finished `step`
    progress.update(step, {"loss": 1.93, "tokens_per_s": 41000.0})   # every summary interval
    progress.doing("evaluating") ... progress.doing(None)           # time that is no step's
    progress.close()

On a terminal, rich draws one line at the bottom and redraws it in place four times a second,
fitted to the terminal's width (the bar shrinks to 6 cells, then the elapsed time, the
throughput and the ETA go, in that order, before the line would wrap):

    ⠋ step 1200/2000 ━━━━━━━ loss 1.9301 · 6,752 tok/s · 2m01s elapsed · ETA 1m23s

The step, the loss and the throughput are the last summary's, together: the counter does not
run ahead with the steps dispatched since (it did, so the loss shown was a summary interval
older than the step beside it). The elapsed time and the ETA count with the clock between
summaries, so the line is alive while the counter waits. Until the first summary the counter is
the newest step the device has finished and the line says what the run is doing ("compiling
the train step", then the seconds a step takes), so a long compile is not silence. A terminal
of 100 columns or more also shows the percentage. Anything printed while the bar is live (eval
lines, checkpoints, warnings) appears above it: rich takes over stdout and stderr until `close`.
rich rather than tqdm: it is installed already (tyro depends on it), measures the terminal,
and keeps other output above the bar, which tqdm leaves to the caller.

When the stream is not a terminal (CI logs, a pipe, `> log`), redraws would be noise: each
summary prints one timestamped line with the same items instead (under 80 columns for the
default run),

    [12:03:04] step 1200/2000 (60%) loss 1.9301 6,752 tok/s 2m01s elapsed ETA 1m23s

or nothing at all with `plain_lines=False`. `record` (DIR/train.log's writer) gets that line at
every summary, on a terminal too, so the log file holds the run's curve in words. The ETA is
pax_eqx.summaries.eta's: the recent steps' rate after the compile, plus the scheduled events
(`events`: a `doing` status -> every how many steps) still to come; a resumed run counts only
its own steps.

A slow model's summaries can be many minutes apart, and its compile minutes long. So the loop
also reports `completed(step, seconds_per_step)`, the steps the device has finished (no host
sync: pax_eqx.programs.train.in_flight), and when no line has been printed for `heartbeat_s`
seconds (30; PAX_EQX_HEARTBEAT_S overrides it) a thread (`start_heartbeat`) prints what is known,

    [12:03:04] step 0/500 (0%) compiling the train step, 1m00s elapsed
    [12:04:04] step 40/500 (8%) done, 6.10 s/step, 5m12s elapsed, ETA 46m46s

(`noted_output` tells it of the loop's own lines, so it never interrupts them).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol, SupportsFloat, runtime_checkable

from pax_eqx.summaries.eta import Eta

_LOSS_NAMES = ("loss", "total_loss")
HEARTBEAT_ENV = "PAX_EQX_HEARTBEAT_S"  # seconds of silence before a heartbeat line (default 30)
_COMPILING = "compiling the train step"
_FIRST_STEPS = "running the first steps"


@runtime_checkable
class TextStream(Protocol):
    """What Progress writes to: sys.stdout, a file, io.StringIO, ..."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


def format_duration(seconds: float | int) -> str:
    """3725 -> '1h02m05s'; 83 -> '1m23s'; 9 -> '9s'."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def format_rate(seconds_per_step: float) -> str:
    """6.1 -> '6.10 s/step'; 0.05 -> '20.0 steps/s' (whichever reads as a number above 1)."""
    if seconds_per_step >= 1.0:
        return f"{seconds_per_step:.2f} s/step"
    return f"{1.0 / max(seconds_per_step, 1e-9):,.1f} steps/s"


def heartbeat_seconds() -> float:
    """PAX_EQX_HEARTBEAT_S, or 30; 0 turns the heartbeat off."""
    text = os.environ.get(HEARTBEAT_ENV, "").strip()
    if not text:
        return 30.0
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        from pax_eqx.config import ConfigError

        raise ConfigError(f"{HEARTBEAT_ENV}={text!r} is not a number of seconds >= 0; unset it for the default 30.")
    return seconds


def _is_terminal(stream: TextStream) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


class Progress:
    """Steps, loss, tokens/s, elapsed time and ETA of a training run; see the module doc."""

    def __init__(
        self,
        total_steps: int,
        start_step: int = 0,
        stream: TextStream | None = None,
        *,
        plain_lines: bool = True,
        status: str = _COMPILING,
        heartbeat_s: float = 0.0,
        events: Mapping[str, int] | None = None,
        record: Callable[[str], None] | None = None,
    ):
        if total_steps <= 0:
            raise ValueError(f"total_steps must be > 0, got {total_steps}.")
        self.total_steps = total_steps
        self.start_step = start_step
        self.stream = sys.stdout if stream is None else stream
        self.interactive = _is_terminal(self.stream)
        self.plain_lines = plain_lines
        self.heartbeat_s = heartbeat_s
        self.record = record
        self.eta = Eta(total_steps, events)
        self._start_time = time.monotonic()
        self._last_line = self._start_time  # when this run last printed a line (any line)
        self._status = status  # what the run is doing until a step is done
        self._completed: tuple[int, float | None] | None = None  # (step, seconds per step) the device finished
        self._summary: tuple[int, list[str]] | None = None  # the last summary's step and its loss, tok/s
        self._write_lock = threading.Lock()
        self._live: _LiveBar | None = None
        self._heart: _Heartbeat | None = None
        if self.interactive:
            self._live = _LiveBar(self)

    def start_heartbeat(self) -> None:
        """Starts the thread that calls `heartbeat` (piped output with `heartbeat_s` > 0 only)."""
        if self._live is None and self.plain_lines and self.heartbeat_s > 0 and self._heart is None:
            self._heart = _Heartbeat(self)

    def eta_seconds(self, step: int) -> float | None:
        """The seconds left now (None before a rate is known, or at the last step)."""
        if step >= self.total_steps:
            return None
        return self.eta.seconds_left(time.monotonic())

    def elapsed(self) -> str:
        return f"{format_duration(time.monotonic() - self._start_time)} elapsed"

    def describe(self, step: int, metrics: Mapping[str, SupportsFloat]) -> list[str]:
        """The pieces after the step count: loss, tokens/s, elapsed, ETA (those known)."""
        return [*_measured(metrics), *self._times(step)]

    def _times(self, step: int) -> list[str]:
        eta = self.eta_seconds(step)
        return [self.elapsed()] + ([f"ETA {format_duration(eta)}"] if eta is not None else [])

    def advance(self, step: int) -> None:
        """The steps dispatched so far (no metrics, no host sync): the compile is over. The
        counter does not move: it shows steps done, whose loss is known."""
        if self._status == _COMPILING:
            self._status = _FIRST_STEPS

    def completed(self, step: int, seconds_per_step: float | None) -> None:
        """The newest step the device has finished and the seconds a step takes (None: not
        known yet): what the ETA is measured from, and what a heartbeat line, or a terminal's
        bar before the first summary, says."""
        self._completed = (step, seconds_per_step)
        self.eta.reached(step, time.monotonic(), seconds_per_step)
        if step > self.start_step and self._status == _FIRST_STEPS:
            self._status = ""

    def doing(self, status: str | None) -> None:
        """What the run is doing besides training steps ("evaluating"), for a heartbeat line and
        the ETA (an event in `events` is timed apart from the steps); None when it goes back to
        training."""
        now = time.monotonic()
        if status:
            self.eta.pause(status, now)
        else:
            self.eta.resume(now)
        self._status = status or ""

    def noted_output(self) -> None:
        """The run printed a line of its own: the heartbeat waits `heartbeat_s` from now."""
        self._last_line = time.monotonic()

    def update(self, step: int, metrics: Mapping[str, SupportsFloat] | None = None) -> None:
        """A summary: `step`'s metrics (all steps up to it are done)."""
        metrics = metrics or {}
        self.eta.reached(step, time.monotonic())
        self._summary = (step, _measured(metrics))
        parts = self.describe(step, metrics)
        line = self._plain_line(step, parts)
        if self._live is not None:
            self._live.refresh()
        elif self.plain_lines:
            self._write(line)
        if self.record is not None:
            self.record(line)

    def live_line(self) -> tuple[int, list[str]]:
        """What the terminal's bar shows now: its step and the pieces beside it."""
        if self._summary is not None:
            step, measured = self._summary
            return step, [*measured, *self._times(step)]
        step, per_step = self._completed or (self.start_step, None)
        if self._status or step <= self.start_step:
            return step, [f"{self._status or 'running'} ...", self.elapsed()]
        return step, [*([format_rate(per_step)] if per_step else []), *self._times(step)]

    def heartbeat(self) -> bool:
        """Prints what is known when no line has been printed for `heartbeat_s` (piped output
        only); whether it printed. `_Heartbeat`'s thread calls it every second or so."""
        now = time.monotonic()
        if self._live is not None or not self.plain_lines or now - self._last_line < self.heartbeat_s:
            return False
        elapsed = self.elapsed()
        step, per_step = self._completed or (self.start_step, None)
        if self._status or step <= self.start_step:
            parts = [f"{self._status or 'running'}, {elapsed}"]
        else:
            parts = ["done," + (f" {format_rate(per_step)}," if per_step else ""), elapsed]
            eta = self.eta_seconds(step)
            if eta is not None:
                parts[-1] += ","
                parts.append(f"ETA {format_duration(eta)}")
        self._write(self._plain_line(step, parts))
        return True

    def _plain_line(self, step: int, parts: list[str]) -> str:
        fraction = min(max(step / self.total_steps, 0.0), 1.0)
        counter = f"step {step:>{len(str(self.total_steps))}}/{self.total_steps}"
        return " ".join([f"[{time.strftime('%H:%M:%S')}] {counter} ({fraction:.0%})", *parts])

    def _write(self, line: str) -> None:
        with self._write_lock:
            self.stream.write(line + "\n")
            self.stream.flush()
            self._last_line = time.monotonic()

    def close(self) -> None:
        """Stops the live bar (its last state stays on screen; stdout is the program's again)
        and the heartbeat."""
        if self._heart is not None:
            self._heart.stop()
            self._heart = None
        if self._live is not None:
            self._live.stop()
            self._live = None


def _measured(metrics: Mapping[str, SupportsFloat]) -> list[str]:
    """A summary's loss and tokens/s, as shown."""
    parts = []
    loss = next((metrics[name] for name in _LOSS_NAMES if name in metrics), None)
    if loss is not None:
        parts.append(f"loss {float(loss):.4f}")
    if "tokens_per_s" in metrics:
        parts.append(f"{float(metrics['tokens_per_s']):,.0f} tok/s")
    return parts


class _Heartbeat:
    """A daemon thread calling `progress.heartbeat()` about once a second until `stop`. A thread,
    since the loop itself is silent exactly when it is stuck: compiling, or waiting on a step."""

    def __init__(self, progress: Progress):
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(progress,), name="progress-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self, progress: Progress) -> None:
        tick = min(1.0, progress.heartbeat_s / 4)
        while not self._stopped.wait(tick):
            try:
                progress.heartbeat()
            except (OSError, ValueError):  # a closed or full stream: the loop's own writes report it
                return

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()


_MIN_BAR, _MAX_BAR = 6, 30
_TYPICAL = len("loss 0.0000 · 00,000 tok/s · 0m00s elapsed · ETA 0m00s")  # the room the bar leaves them
_GIVE_WAY = ("elapsed", "tok/s", "ETA")  # what goes first, then next, on a narrow terminal


class _Layout(NamedTuple):
    step: int
    counter: str  # "step 1200/2000"
    bar: int  # the bar's width in cells
    percent: str  # "60%" on a terminal of 100 columns or more, else ""
    stats: str  # the pieces that fit, joined by " · "


class _LiveBar:
    """rich's Progress drawing `Progress.live_line` at every refresh (four a second), laid out
    for the terminal's width then, with one column to spare so the line never reaches the edge."""

    def __init__(self, progress: Progress):
        from rich.console import Console
        from rich.progress import Progress as RichProgress
        from rich.progress import SpinnerColumn

        self.progress = progress
        console = Console(file=progress.stream, force_terminal=True, highlight=False)
        self.width = console.width
        self.bar = RichProgress(
            SpinnerColumn(),
            _line_column(self),
            console=console,
            redirect_stdout=True,
            redirect_stderr=True,
            refresh_per_second=4,
        )
        self.task = self.bar.add_task("train", total=progress.total_steps)
        self.bar.start()

    def layout(self) -> _Layout:
        """The line now: the pieces that fit beside the counter and a bar of at least 6 cells
        (dropping the elapsed time, then the throughput, then the ETA). The bar's width is set
        by the terminal's (what a summary's pieces usually leave, 6 to 30 cells), so it does
        not jump as they change; it shrinks only for pieces longer than usual."""
        step, parts = self.progress.live_line()
        total = self.progress.total_steps
        counter = f"step {step:>{len(str(total))}}/{total}"  # as wide at step 0 as at the end
        percent = f"{min(step / total, 1.0):.0%}" if self.width >= 100 else ""
        room = self.width - 3 - len(counter) - 1 - (len(percent) + 1 if percent else 0) - 1  # spinner, spare
        for name in _GIVE_WAY:
            if len(" · ".join(parts)) <= room - _MIN_BAR:
                break
            parts = [part for part in parts if name not in part.split()]
        while parts and len(" · ".join(parts)) > room - _MIN_BAR:
            parts = parts[:-1]
        stats = " · ".join(parts)
        bar = min(max(_MIN_BAR, min(_MAX_BAR, room - _TYPICAL)), room - len(stats))
        return _Layout(step, counter, bar, percent, stats)

    def text(self) -> str:
        """The line as plain text, the bar drawn as '━' (what tests read)."""
        line = self.layout()
        return " ".join(x for x in (line.counter, "━" * line.bar, line.percent, line.stats) if x)

    def refresh(self) -> None:
        self.bar.refresh()

    def stop(self) -> None:
        self.bar.stop()


def _line_column(live: _LiveBar) -> Any:
    """A rich column drawing `live.layout()`: one column for the counter, the bar and the
    pieces, so the pieces and the bar share the width between them."""
    from rich.progress import ProgressColumn
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    class LineColumn(ProgressColumn):
        def render(self, task: Any) -> Table:
            line = live.layout()
            cells: list[Any] = [line.counter, ProgressBar(total=task.total, completed=line.step, width=line.bar)]
            cells += [x for x in (line.percent, line.stats) if x]
            grid = Table.grid(padding=(0, 1))
            for _ in cells:
                grid.add_column(no_wrap=True)
            grid.add_row(*cells)
            return grid

    return LineColumn()
