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
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any, Protocol, SupportsFloat, runtime_checkable

_LOSS_NAMES = ("loss", "total_loss")


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
    ):
        if total_steps <= 0:
            raise ValueError(f"total_steps must be > 0, got {total_steps}.")
        self.total_steps = total_steps
        self.start_step = start_step
        self.stream = sys.stdout if stream is None else stream
        self.interactive = _is_terminal(self.stream)
        self.plain_lines = plain_lines
        self._start_time = time.monotonic()
        self._live: Any = None
        if self.interactive:
            self._live = _LiveBar(self, status)

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
        if self._live is not None:
            self._live.show(step, None)

    def update(self, step: int, metrics: Mapping[str, SupportsFloat] | None = None) -> None:
        metrics = metrics or {}
        if self._live is not None:
            self._live.show(step, self.describe(step, metrics))
        elif self.plain_lines:
            fraction = min(max(step / self.total_steps, 0.0), 1.0)
            counter = f"step {step:>{len(str(self.total_steps))}}/{self.total_steps}"
            stamp = time.strftime("%H:%M:%S")
            self.stream.write(" ".join([f"[{stamp}] {counter} ({fraction:.0%})", *self.describe(step, metrics)]) + "\n")
            self.stream.flush()

    def close(self) -> None:
        """Stops the live bar (its last state stays on screen; stdout is the program's again)."""
        if self._live is not None:
            self._live.stop()
            self._live = None


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

    def show(self, step: int, parts: list[str] | None) -> None:
        fields = {} if parts is None else {"stats": self._fit(parts)}
        if parts is None and self.bar.tasks[0].fields["stats"].endswith("compiling the train step ..."):
            fields["stats"] = "running the first steps ..."
        self.bar.update(self.task, completed=min(step, self.total), **fields)

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
