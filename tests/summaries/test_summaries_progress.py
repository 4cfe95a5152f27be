"""Progress: a redrawn bar on a terminal; plain lines (or nothing) elsewhere."""

from __future__ import annotations

import io
import os

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


def test_non_terminal_prints_one_plain_line_per_update(clock):
    stream = io.StringIO()
    progress = Progress(total_steps=200, start_step=100, stream=stream)
    clock[0] += 10.0
    progress.update(150, {"total_loss": 1.23456, "tokens_per_s": 12345.6})
    clock[0] += 10.0
    progress.update(200, {"total_loss": 1.0})
    progress.close()
    assert stream.getvalue().splitlines() == [
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


def test_terminal_redraws_one_line(clock):
    stream = FakeTerminal()
    progress = Progress(total_steps=2000, stream=stream)
    clock[0] += 60.0
    progress.update(1200, {"loss": 1.9301, "tokens_per_s": 41000.0})
    progress.close()
    out = stream.getvalue()
    assert out.startswith("\r") and out.endswith("\n") and out.count("\n") == 1
    line = out.strip("\r\n").replace("\x1b[K", "")
    assert line == f"step 1200/2000 [{'#' * 18}{'-' * 12}]  60% | loss 1.9301 | 41,000 tok/s | ETA 40s"


def test_format_duration():
    assert [format_duration(s) for s in (9.4, 83, 3725)] == ["9s", "1m23s", "1h02m05s"]


def test_total_steps_must_be_positive():
    with pytest.raises(ValueError, match="total_steps must be > 0, got 0"):
        Progress(total_steps=0)
