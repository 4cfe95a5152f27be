"""Progress: a redrawn bar on a terminal; plain lines (or nothing) elsewhere."""

from __future__ import annotations

import io
import os
import re
import time

import pyte
import pytest

from pax_eqx.config import ConfigError
from pax_eqx.summaries import Progress
from pax_eqx.summaries.progress import HEARTBEAT_ENV, format_duration, format_rate, heartbeat_seconds


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("pax_eqx.summaries.progress.time.monotonic", lambda: now[0])
    return now


def test_non_terminal_prints_one_plain_timestamped_line_per_update(clock):
    """Loss, tokens/s, elapsed time and ETA, the ETA from the steps after the first call seen
    finished (the compile before it not counted); `record` (DIR/train.log) gets the same lines."""
    stream, recorded = io.StringIO(), []
    progress = Progress(total_steps=200, start_step=100, stream=stream, record=recorded.append)
    clock[0] += 5.0  # the compile and the first call
    progress.completed(110, None)
    clock[0] += 8.0  # 40 steps in 8 s: 0.2 s a step, 50 to go
    progress.update(150, {"total_loss": 1.23456, "tokens_per_s": 12345.6})
    clock[0] += 10.0
    progress.update(200, {"total_loss": 1.0})
    progress.close()
    lines = stream.getvalue().splitlines()
    assert all(re.match(r"\[\d\d:\d\d:\d\d\] ", line) for line in lines)
    assert [line[11:] for line in lines] == [
        "step 150/200 (75%) loss 1.2346 12,346 tok/s 13s elapsed ETA 10s",
        "step 200/200 (100%) loss 1.0000 23s elapsed",
    ]
    assert recorded == lines
    assert "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()


def test_a_terminal_records_the_plain_lines_too(clock, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    recorded: list[str] = []
    progress = Progress(total_steps=10, stream=FakeTerminal(), record=recorded.append)
    progress.update(5, {"total_loss": 1.0})
    progress.close()
    assert [line[11:] for line in recorded] == ["step  5/10 (50%) loss 1.0000 0s elapsed"]


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
    never wider than the terminal, with the loss of the step it shows, tokens/s, elapsed time and
    ETA; lines printed meanwhile stand above it."""
    monkeypatch.setenv("COLUMNS", str(columns))
    stream = FakeTerminal()
    progress = Progress(total_steps=2000, stream=stream)
    for step in (200, 600, 1200):
        clock[0] += 10.0
        progress.advance(step + 300)  # dispatched ahead: the counter stays at the summary's step
        progress.update(step, {"loss": 1.9301, "tokens_per_s": 41000.0})
        print(f"eval at step {step}")  # rich holds stdout while the bar is live: it goes above the bar
    progress.close()
    screen = pyte.Screen(columns, 24)
    pyte.Stream(screen).feed(stream.getvalue().replace("\n", "\r\n"))
    shown = [line.rstrip() for line in screen.display if line.strip()]
    bars = [line for line in shown if "step " in line and "/2000" in line]
    assert len(bars) == 1, shown
    assert bars[0].lstrip(" ⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏").startswith("step 1200/2000") and len(bars[0]) < columns
    # 1000 steps in the last 20 s: 800 to go in 16 s; 30 s since the start
    assert bars[0].endswith("━ loss 1.9301 · 41,000 tok/s · 30s elapsed · ETA 16s" if columns < 100 else
                            "━ 60% loss 1.9301 · 41,000 tok/s · 30s elapsed · ETA 16s")  # fmt: skip
    evals = [i for i, line in enumerate(shown) if line.startswith("eval at step")]
    assert len(evals) == 3 and max(evals) < shown.index(bars[0])
    assert stream.getvalue().count("step ") > 3  # drawn again and again, yet one line on the screen


@pytest.mark.parametrize(
    ("columns", "shown"),
    [
        (80, "step 1200/2000 ━━━━━━ loss 1.9301 · 41,000 tok/s · 1h00m20s elapsed · ETA 16s"),
        (61, "step 1200/2000 ━━━━━━ loss 1.9301 · 41,000 tok/s · ETA 16s"),
        (60, "step 1200/2000 ━━━━━━ loss 1.9301 · ETA 16s"),
        (50, "step 1200/2000 ━━━━━━ loss 1.9301 · ETA 16s"),
        (30, "step 1200/2000 ━━━━━━"),
    ],
)
def test_a_narrow_terminal_drops_the_elapsed_time_then_the_throughput(clock, monkeypatch, columns, shown):
    monkeypatch.setenv("COLUMNS", str(columns))
    progress = Progress(total_steps=2000, stream=FakeTerminal())
    clock[0] += 3600.0
    progress.update(200, {"loss": 1.9301, "tokens_per_s": 41000.0})
    clock[0] += 20.0
    progress.update(1200, {"loss": 1.9301, "tokens_per_s": 41000.0})
    assert progress._live.text() == shown
    assert len(shown) + 2 < columns  # the spinner and its space, and a spare column
    progress.close()


def test_format_duration():
    assert [format_duration(s) for s in (9.4, 83, 3725)] == ["9s", "1m23s", "1h02m05s"]


def test_total_steps_must_be_positive():
    with pytest.raises(ValueError, match="total_steps must be > 0, got 0"):
        Progress(total_steps=0)


def test_a_heartbeat_after_the_interval_of_silence_says_what_is_known(clock):
    """Piped, a line every `heartbeat_s` of silence: compiling, then the first steps, then the
    steps done with their rate and ETA; the run's own lines (a summary, a log line) reset it."""
    stream = io.StringIO()
    progress = Progress(total_steps=500, stream=stream, heartbeat_s=30.0)

    def beat_after(seconds: float) -> str:
        clock[0] += seconds
        before = stream.getvalue()
        progress.heartbeat()
        return stream.getvalue()[len(before) :].rstrip("\n")[11:]

    assert beat_after(29.0) == ""  # not yet
    assert beat_after(1.0) == "step   0/500 (0%) compiling the train step, 30s elapsed"
    assert beat_after(29.0) == ""  # the interval counts from the last line
    progress.advance(10)  # the first call dispatched: compiled
    assert beat_after(1.0) == "step   0/500 (0%) running the first steps, 1m00s elapsed"
    progress.completed(40, 6.1)  # 460 steps of 6.1 s to go: 46m46s, counting down from here
    assert beat_after(30.0) == "step  40/500 (8%) done, 6.10 s/step, 1m30s elapsed, ETA 46m16s"
    progress.update(50, {"total_loss": 2.5})
    assert beat_after(20.0) == ""  # the summary line was 20 s ago
    progress.noted_output()  # e.g. an eval line
    assert beat_after(29.0) == ""
    progress.doing("evaluating")
    assert beat_after(1.0) == "step  40/500 (8%) evaluating, 2m20s elapsed"
    progress.doing(None)
    progress.completed(500, 0.05)
    assert beat_after(30.0) == "step 500/500 (100%) done, 20.0 steps/s, 2m50s elapsed"
    progress.close()


def test_no_heartbeat_when_silent_or_on_a_terminal(clock):
    silent, terminal = io.StringIO(), FakeTerminal()
    for stream, kwargs in ((silent, {"plain_lines": False}), (terminal, {})):
        progress = Progress(total_steps=10, stream=stream, heartbeat_s=30.0, **kwargs)
        clock[0] += 100.0
        assert not progress.heartbeat()
        progress.close()
    assert silent.getvalue() == ""


def test_a_terminal_shows_the_steps_done_before_the_first_summary(clock, monkeypatch):
    """Compiling, then the steps the device has finished with their rate and an ETA; after a
    summary, the summary's step and numbers (the steps finished since do not move the counter)."""
    monkeypatch.setenv("COLUMNS", "100")
    progress = Progress(total_steps=500, stream=FakeTerminal())
    clock[0] += 12.0
    assert progress._live.text() == f"step   0/500 {'━' * 26} 0% compiling the train step ... · 12s elapsed"
    progress.advance(20)
    progress.completed(10, 6.1)
    assert progress._live.text().endswith(" 2% 6.10 s/step · 12s elapsed · ETA 49m49s")  # 490 steps of 6.1 s
    assert progress._live.text().startswith("step  10/500 ")
    progress.update(50, {"loss": 2.5})
    progress.completed(60, 6.1)
    assert progress._live.text().startswith("step  50/500 ")
    assert " 10% loss 2.5000 · 12s elapsed · ETA " in progress._live.text()
    progress.close()


def test_the_heartbeat_thread_prints_while_the_caller_is_stuck():
    """The thread, on the real clock: a caller blocked (as in a compile) for 0.5 s with a
    0.1 s heartbeat still gets lines; none after close."""
    stream = io.StringIO()
    progress = Progress(total_steps=10, stream=stream, heartbeat_s=0.1)
    progress.start_heartbeat()
    time.sleep(0.5)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 2 and all("compiling the train step" in line for line in lines)
    time.sleep(0.2)
    assert stream.getvalue().splitlines() == lines


def test_format_rate():
    assert [format_rate(s) for s in (6.1, 1.0, 0.05)] == ["6.10 s/step", "1.00 s/step", "20.0 steps/s"]


@pytest.mark.parametrize("text", ["soon", "-1", "nan"])
def test_a_bad_heartbeat_setting_is_one_clear_error(monkeypatch, text):
    monkeypatch.setenv(HEARTBEAT_ENV, text)
    with pytest.raises(ConfigError, match=f"PAX_EQX_HEARTBEAT_S='{text}' is not a number of seconds >= 0"):
        heartbeat_seconds()


def test_the_heartbeat_setting(monkeypatch):
    monkeypatch.delenv(HEARTBEAT_ENV, raising=False)
    assert heartbeat_seconds() == 30.0
    monkeypatch.setenv(HEARTBEAT_ENV, "0")
    assert heartbeat_seconds() == 0.0  # off


def test_the_bar_keeps_its_width_as_the_pieces_change(clock, monkeypatch):
    """Compiling, then a step's rate, then a summary's four pieces: the bar does not jump."""
    monkeypatch.setenv("COLUMNS", "80")
    progress = Progress(total_steps=2000, stream=FakeTerminal())
    widths = [progress._live.layout().bar]
    progress.completed(10, 0.14)
    clock[0] += 8.0
    progress.completed(60, 0.14)
    widths.append(progress._live.layout().bar)
    progress.update(100, {"loss": 1.9301, "tokens_per_s": 6752.0})
    widths.append(progress._live.layout().bar)
    assert widths == [7, 7, 7], widths
    progress.close()
