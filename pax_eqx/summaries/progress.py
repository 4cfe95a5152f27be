"""Progress: a live bar on a terminal (rich), plain timestamped lines everywhere else.

    progress = Progress(total_steps=2000, start_step=0)
    progress.advance(step)                                          # each compiled call: no host sync
    progress.update(step, {"loss": 1.93, "tokens_per_s": 41000.0})   # every summary interval
    progress.close()

On a terminal, rich draws one line at the bottom and redraws it in place, fitted to the
terminal's width (the bar shrinks, then the throughput and ETA go, before the line would wrap):

    ⠋ step 1200/2000 ━━━━━━━━━━━━━━━━╸━━━━━━━━━━  60% loss 1.9301 · 41,000 tok/s · ETA 1m23s

Until the first summary it says what the run is doing ("compiling the train step", then the
steps dispatched), so a long compile is not silence. Anything printed while it is live (eval
lines, checkpoints, warnings) appears above it: rich takes over stdout and stderr until `close`.
rich rather than tqdm: it is installed already (tyro depends on it), measures the terminal,
and keeps other output above the bar, which tqdm leaves to the caller.

When the stream is not a terminal (CI logs, a pipe, `> log`), redraws would be noise: each
update prints one timestamped line instead,

    [12:03:04] step 1200/2000 (60%) loss 1.9301 41,000 tok/s ETA 1m23s

or nothing at all with `plain_lines=False`. ETA comes from the steps done since this
`Progress` started (a resumed run does not count the steps it restored).

A slow model's summaries can be many minutes apart, and its compile minutes long. So the loop
also reports `completed(step, seconds_per_step)`, the steps the device has finished (no host
sync: pax_eqx.programs.train.in_flight), and when no line has been printed for `heartbeat_s`
seconds (30; PAX_EQX_HEARTBEAT_S overrides it) a thread (`start_heartbeat`) prints what is known,

    [12:03:04] step 0/500 (0%) compiling the train step, 1m00s elapsed
    [12:04:04] step 40/500 (8%) done, 6.10 s/step, 5m12s elapsed, ETA 46m46s

(`noted_output` tells it of the loop's own lines, so it never interrupts them). On a terminal,
before the first summary, the bar says the same ("step 40 done · 6.10 s/step").
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol, SupportsFloat, runtime_checkable

_LOSS_NAMES = ("loss", "total_loss")
HEARTBEAT_ENV = "PAX_EQX_HEARTBEAT_S"  # seconds of silence before a heartbeat line (default 30)


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
    """Steps, loss, tokens/s and ETA of a training run; see the module doc."""

    def __init__(
        self,
        total_steps: int,
        start_step: int = 0,
        stream: TextStream | None = None,
        *,
        plain_lines: bool = True,
        status: str = "compiling the train step",
        heartbeat_s: float = 0.0,
    ):
        if total_steps <= 0:
            raise ValueError(f"total_steps must be > 0, got {total_steps}.")
        self.total_steps = total_steps
        self.start_step = start_step
        self.stream = sys.stdout if stream is None else stream
        self.interactive = _is_terminal(self.stream)
        self.plain_lines = plain_lines
        self.heartbeat_s = heartbeat_s
        self._start_time = time.monotonic()
        self._last_line = self._start_time  # when this run last printed a line (any line)
        self._status = status  # what the run is doing until a step is done
        self._completed: tuple[int, float | None] | None = None  # (step, seconds per step) the device finished
        self._summarized = False
        self._write_lock = threading.Lock()
        self._live: Any = None
        self._heart: _Heartbeat | None = None
        if self.interactive:
            self._live = _LiveBar(self, status)

    def start_heartbeat(self) -> None:
        """Starts the thread that calls `heartbeat` (piped output with `heartbeat_s` > 0 only)."""
        if self._live is None and self.plain_lines and self.heartbeat_s > 0 and self._heart is None:
            self._heart = _Heartbeat(self)

    def eta_seconds(self, step: int) -> float | None:
        done = step - self.start_step
        if done <= 0:
            return None
        rate = done / max(time.monotonic() - self._start_time, 1e-9)
        return max(self.total_steps - step, 0) / rate

    def describe(self, step: int, metrics: Mapping[str, SupportsFloat]) -> list[str]:
        """The pieces after the step count: loss, tokens/s, ETA (those known)."""
        parts = []
        loss = next((metrics[name] for name in _LOSS_NAMES if name in metrics), None)
        if loss is not None:
            parts.append(f"loss {float(loss):.4f}")
        if "tokens_per_s" in metrics:
            parts.append(f"{float(metrics['tokens_per_s']):,.0f} tok/s")
        eta = self.eta_seconds(step)
        if eta is not None and step < self.total_steps:
            parts.append(f"ETA {format_duration(eta)}")
        return parts

    def advance(self, step: int) -> None:
        """The steps dispatched so far (no metrics, no host sync): moves a terminal's bar only."""
        if self._status == "compiling the train step":
            self._status = "running the first steps"
        if self._live is not None:
            self._live.show(step, None)

    def completed(self, step: int, seconds_per_step: float | None) -> None:
        """The newest step the device has finished and the seconds a step takes (None: not
        known yet): what a heartbeat line, or a terminal's bar before the first summary, says."""
        self._completed = (step, seconds_per_step)
        if step > self.start_step and self._status == "running the first steps":
            self._status = ""
        if self._live is not None and not self._summarized and step > self.start_step:
            rate = f" · {format_rate(seconds_per_step)}" if seconds_per_step else ""
            self._live.show(None, None, stats=f"step {step} done{rate}")

    def doing(self, status: str | None) -> None:
        """What the run is doing besides training steps ("evaluating"), for a heartbeat line;
        None when it goes back to training."""
        self._status = status or ""

    def noted_output(self) -> None:
        """The run printed a line of its own: the heartbeat waits `heartbeat_s` from now."""
        self._last_line = time.monotonic()

    def update(self, step: int, metrics: Mapping[str, SupportsFloat] | None = None) -> None:
        metrics = metrics or {}
        self._summarized = True
        if self._live is not None:
            self._live.show(step, self.describe(step, metrics))
        elif self.plain_lines:
            self._write_line(step, self.describe(step, metrics))

    def heartbeat(self) -> bool:
        """Prints what is known when no line has been printed for `heartbeat_s` (piped output
        only); whether it printed. `_Heartbeat`'s thread calls it every second or so."""
        now = time.monotonic()
        if self._live is not None or not self.plain_lines or now - self._last_line < self.heartbeat_s:
            return False
        elapsed = f"{format_duration(now - self._start_time)} elapsed"
        step, per_step = self._completed or (self.start_step, None)
        if self._status or step <= self.start_step:
            parts = [f"{self._status or 'running'}, {elapsed}"]
        else:
            parts = ["done," + (f" {format_rate(per_step)}," if per_step else ""), elapsed]
            if per_step and step < self.total_steps:
                parts[-1] += ","
                parts.append(f"ETA {format_duration(per_step * (self.total_steps - step))}")
        self._write_line(step, parts)
        return True

    def _write_line(self, step: int, parts: list[str]) -> None:
        fraction = min(max(step / self.total_steps, 0.0), 1.0)
        counter = f"step {step:>{len(str(self.total_steps))}}/{self.total_steps}"
        stamp = time.strftime("%H:%M:%S")
        with self._write_lock:
            self.stream.write(" ".join([f"[{stamp}] {counter} ({fraction:.0%})", *parts]) + "\n")
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


class _LiveBar:
    """rich's Progress, one task, columns fitted to the terminal's width at every redraw."""

    def __init__(self, progress: Progress, status: str):
        from rich.console import Console
        from rich.progress import BarColumn, SpinnerColumn, TaskProgressColumn, TextColumn
        from rich.progress import Progress as RichProgress

        console = Console(file=progress.stream, force_terminal=True, highlight=False)
        self.width = console.width
        self.total = progress.total_steps
        wide = self.width >= 100
        self.bar = RichProgress(
            SpinnerColumn(),
            TextColumn("step {task.completed:.0f}/{task.total:.0f}"),
            BarColumn(bar_width=30 if wide else max(8, self.width - 70)),
            TaskProgressColumn(),
            TextColumn("{task.fields[stats]}"),
            console=console,
            redirect_stdout=True,
            redirect_stderr=True,
            refresh_per_second=4,
        )
        self.task = self.bar.add_task("train", total=self.total, completed=progress.start_step, stats=status + " ...")
        self.bar.start()

    def show(self, step: int | None, parts: list[str] | None, stats: str | None = None) -> None:
        """The counter at `step` (None: where it is) and the stats: `parts` fitted, else `stats`."""
        fields = {} if parts is None else {"stats": self._fit(parts)}
        if stats is not None:
            fields["stats"] = self._fit([stats])
        elif parts is None and self.bar.tasks[0].fields["stats"].endswith("compiling the train step ..."):
            fields["stats"] = "running the first steps ..."
        counter = {} if step is None else {"completed": min(step, self.total)}
        self.bar.update(self.task, **counter, **fields)

    def _fit(self, parts: list[str]) -> str:
        """The parts that fit beside the counter and the bar on this terminal, most wanted first."""
        room = self.width - 60 if self.width < 100 else self.width - 70
        kept: list[str] = []
        for part in parts:
            if len(" · ".join([*kept, part])) > room:
                break
            kept.append(part)
        return " · ".join(kept)

    def stop(self) -> None:
        self.bar.stop()
