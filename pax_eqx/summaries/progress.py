"""Progress: a one-line progress bar on a terminal, plain log lines everywhere else.

    progress = Progress(total_steps=2000, start_step=0)
    progress.update(step, {"loss": 1.93, "tokens_per_s": 41000.0})   # every summary interval
    progress.close()

On a terminal the line is redrawn in place:

    step 1200/2000 [##################------------]  60% | loss 1.9301 | 41,000 tok/s | ETA 1m23s

When the stream is not a terminal (CI logs, `> train.log`, a pipe), carriage returns and
redraws would turn into noise, so there is no bar: each update prints one plain line instead,

    step 1200/2000 (60%) loss 1.9301 41,000 tok/s ETA 1m23s

or nothing at all with `plain_lines=False`. ETA comes from the steps done since this
`Progress` started (a resumed run does not count the steps it restored).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Protocol, SupportsFloat, runtime_checkable

_BAR_WIDTH = 30
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
    ):
        if total_steps <= 0:
            raise ValueError(f"total_steps must be > 0, got {total_steps}.")
        self.total_steps = total_steps
        self.start_step = start_step
        self.stream = sys.stdout if stream is None else stream
        self.interactive = _is_terminal(self.stream)
        self.plain_lines = plain_lines
        self._start_time = time.monotonic()
        self._drawn = False

    def eta_seconds(self, step: int) -> float | None:
        done = step - self.start_step
        if done <= 0:
            return None
        rate = done / max(time.monotonic() - self._start_time, 1e-9)
        return max(self.total_steps - step, 0) / rate

    def describe(self, step: int, metrics: Mapping[str, SupportsFloat]) -> list[str]:
        """The pieces of the line after the step count: loss, tokens/s, ETA (those known)."""
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

    def update(self, step: int, metrics: Mapping[str, SupportsFloat] | None = None) -> None:
        metrics = metrics or {}
        fraction = min(max(step / self.total_steps, 0.0), 1.0)
        width = len(str(self.total_steps))
        counter = f"step {step:>{width}}/{self.total_steps}"
        parts = self.describe(step, metrics)
        if self.interactive:
            filled = int(round(fraction * _BAR_WIDTH))
            bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
            line = " | ".join([f"{counter} [{bar}] {fraction:4.0%}", *parts])
            # \r back to the start, \x1b[K clears what a longer previous line left behind.
            self.stream.write("\r" + line + "\x1b[K")
            self._drawn = True
        elif self.plain_lines:
            self.stream.write(" ".join([f"{counter} ({fraction:.0%})", *parts]) + "\n")
        else:
            return
        self.stream.flush()

    def close(self) -> None:
        """Ends the bar's line, so what is printed next starts on a fresh one."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
