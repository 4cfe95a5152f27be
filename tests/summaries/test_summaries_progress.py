"""Progress: a redrawn bar on a terminal; plain lines (or nothing) elsewhere."""

from __future__ import annotations

import io
import os
import re

import pyte
import pytest

from pax_eqx.summaries import Progress
from pax_eqx.summaries.progress import format_duration


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("pax_eqx.summaries.progress.time.monotonic", lambda: now[0])
    return now


def test_non_terminal_prints_one_plain_timestamped_line_per_update(clock):
    stream = io.StringIO()
    progress = Progress(total_steps=200, start_step=100, stream=stream)
    clock[0] += 10.0
    progress.update(150, {"total_loss": 1.23456, "tokens_per_s": 12345.6})
    clock[0] += 10.0
    progress.update(200, {"total_loss": 1.0})
    progress.close()
    lines = stream.getvalue().splitlines()
    assert all(re.match(r"\[\d\d:\d\d:\d\d\] ", line) for line in lines)
    assert [line[11:] for line in lines] == [
        "step 150/200 (75%) loss 1.2346 12,346 tok/s ETA 10s",  # 50 steps in 10 s, 50 to go
        "step 200/200 (100%) loss 1.0000",
    ]
    assert "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()


def test_non_terminal_can_be_fully_silent():
    stream = io.StringIO()
    progress = Progress(total_steps=10, stream=stream, plain_lines=False)
    progress.update(5, {"total_loss": 1.0})
    progress.close()
    assert stream.getvalue() == ""


def test_a_pipe_is_not_a_terminal():
    read_fd, write_fd = os.pipe()
    with os.fdopen(write_fd, "w") as pipe, os.fdopen(read_fd) as reader:
        progress = Progress(total_steps=4, stream=pipe, plain_lines=False)
        progress.update(2, {"total_loss": 1.0})
        progress.close()
        assert not progress.interactive
        pipe.close()
        assert reader.read() == ""


@pytest.mark.parametrize("columns", [80, 200])
def test_a_terminal_shows_one_line_redrawn_in_place_within_its_width(clock, columns, monkeypatch):
    """What a person sees, rendered by a terminal emulator: one bar line, however many updates,
    never wider than the terminal; lines printed meanwhile stand above it."""
    monkeypatch.setenv("COLUMNS", str(columns))
    stream = FakeTerminal()
    progress = Progress(total_steps=2000, stream=stream)
    for step in (200, 600, 1200):
        clock[0] += 10.0
        progress.advance(step)
        progress.update(step, {"loss": 1.9301, "tokens_per_s": 41000.0})
        print(f"eval at step {step}")  # rich holds stdout while the bar is live: it goes above the bar
    progress.close()
    screen = pyte.Screen(columns, 24)
    pyte.Stream(screen).feed(stream.getvalue().replace("\n", "\r\n"))
    shown = [line.rstrip() for line in screen.display if line.strip()]
    bars = [line for line in shown if "step " in line and "/2000" in line]
    assert len(bars) == 1, shown
    assert bars[0].lstrip(" ⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏").startswith("step 1200/2000") and "60%" in bars[0]
    assert "loss 1.9301" in bars[0] and len(bars[0]) <= columns
    assert ("41,000 tok/s" in bars[0]) == (columns >= 100)  # throughput and ETA give way on a narrow one
    evals = [i for i, line in enumerate(shown) if line.startswith("eval at step")]
    assert len(evals) == 3 and max(evals) < shown.index(bars[0])
    assert stream.getvalue().count("step ") > 3  # drawn again and again, yet one line on the screen


def test_format_duration():
    assert [format_duration(s) for s in (9.4, 83, 3725)] == ["9s", "1m23s", "1h02m05s"]


def test_total_steps_must_be_positive():
    with pytest.raises(ValueError, match="total_steps must be > 0, got 0"):
        Progress(total_steps=0)
