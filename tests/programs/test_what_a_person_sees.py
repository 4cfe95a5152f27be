"""The default run as a person sees it: in a terminal of 80 columns, rendered by a terminal
emulator (pyte), and piped into a file.

In the terminal the progress bar is one line at the bottom, redrawn in place and never wider
than the terminal, with the eval lines, the banner and the closing block above it; piped, the
same run prints plain timestamped progress lines and no escape codes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from terminal import run_in_a_terminal
from tiny import tiny_args

COLUMNS = 80


def test_the_default_run_in_an_80_column_terminal(tmp_path):
    args = tiny_args(tmp_path / "job", "--train.no-sample-at-end", num_devices=1)
    one_device = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    code, shown, raw = run_in_a_terminal(["-m", "pax_eqx.train", *args], tmp_path, columns=COLUMNS, env=one_device)
    assert code == 0, raw[-3000:]
    bars = [line for line in shown if "step " in line and "/6" in line and "%" in line]
    assert len(bars) == 1, "\n".join(shown)  # one bar line, however many updates
    assert "step 6/6" in bars[0] and "100%" in bars[0] and "loss " in bars[0]
    assert all(len(line) <= COLUMNS for line in shown)
    assert raw.count("step ") > 3  # it was redrawn
    bar = shown.index(bars[0])
    evals = [i for i, line in enumerate(shown) if line.startswith("eval: loss")]
    assert len(evals) == 2 and max(evals) < bar  # the evals at steps 3 and 6 stand above the bar
    assert shown.index("Experiment shakespeare_char (LanguageModelConfig)") < min(evals)
    assert any(line.startswith("Finished at step 6") for line in shown[bar:])


def test_the_default_run_piped_is_plain_lines(tmp_path):
    """... with heartbeat lines where it would be silent (every 0.2 s here, 30 s by default)."""
    args = tiny_args(tmp_path / "job", "--train.no-sample-at-end", num_devices=1)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", PAX_EQX_HEARTBEAT_S="0.2")
    done = subprocess.run([sys.executable, "-m", "pax_eqx.train", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\r" not in done.stdout
    lines = [line for line in done.stdout.splitlines() if " step " in line and "%)" in line]
    progress = [line for line in lines if " loss " in line]
    heartbeats = [line[11:] for line in lines if " loss " not in line]
    assert any(line.startswith("step 0/6 (0%) compiling the train step, ") for line in heartbeats), lines
    said = r"(compiling the train step|running the first steps|evaluating|done(, [\d.,]+ (s/step|steps/s))?)"
    assert all(re.fullmatch(rf"step \d/6 \(\d+%\) {said}, \d+s elapsed(, ETA \d+s)?", x) for x in heartbeats), lines
    assert [line[11:].split(")")[0] + ")" for line in progress] == [
        "step 2/6 (33%)",
        "step 4/6 (67%)",
        "step 6/6 (100%)",
    ]
    assert all(line.startswith("[") and line[9] == "]" for line in progress)  # [HH:MM:SS]
