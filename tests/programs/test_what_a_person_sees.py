"""The default run as a person sees it: in a terminal of 80 columns, rendered by a terminal
emulator (pyte), and piped into a file.

In the terminal the progress bar is one line at the bottom, redrawn in place and never wider
than the terminal: the step, that step's loss, tokens/s, the elapsed time and the ETA; the eval
lines, the banner, the sample and the closing block stand above or after it, every line within
80 columns and none broken mid-word, and the closing block ends the screen. Piped, the same run
prints plain timestamped progress lines and no escape codes; DIR/train.log has those lines
either way.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from terminal import run_in_a_terminal
from tiny import tiny_args

COLUMNS = 80
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
PROGRESS_LINE = r"\[\d\d:\d\d:\d\d\] step \d/6 \(\d+%\) loss \d\.\d{4} [\d,]+ tok/s \d+s elapsed( ETA \d+s)?"


def test_the_default_run_in_an_80_column_terminal(tmp_path):
    job = tmp_path / "runs" / "shakespeare"
    args = tiny_args("runs/shakespeare", num_devices=1)  # as README.md's command names it (a long one: a wrapped line)
    one_device = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    code, shown, raw = run_in_a_terminal(["-m", "pax_eqx.train", *args], tmp_path, columns=COLUMNS, env=one_device)
    assert code == 0, raw[-3000:]
    bars = [line for line in shown if "step " in line and "/6" in line and "━" in line]
    assert len(bars) == 1, "\n".join(shown)  # one bar line, however many updates
    assert re.search(r"step 6/6 ━+ loss \d\.\d{4} · [\d,]+ tok/s · \d+s elapsed$", bars[0]), bars[0]
    assert raw.count("step ") > 3  # it was redrawn
    # Before the end it showed the ETA too, beside the loss of the step it shows.
    assert re.search(r"step [245]/6 [━╸ ]*(\x1b\[[\d;]*m[━╸]*)*\x1b\[0m loss \d\.\d{4} · [\d,]+ tok/s · \d+s elapsed · "
                     r"ETA \d+s", raw), raw[-3000:]  # fmt: skip

    # Every line within 80 columns, on the screen and as written (so none was wrapped mid-word).
    assert all(len(line) <= COLUMNS for line in shown)
    written = [part for line in ESCAPES.sub("", raw).split("\n") for part in line.split("\r")]
    assert max(len(part) for part in written) <= COLUMNS, max(written, key=len)

    bar = shown.index(bars[0])
    evals = [i for i, line in enumerate(shown) if line.startswith("eval: loss")]
    assert len(evals) == 2 and max(evals) < bar  # the evals at steps 3 and 6 stand above the bar
    assert shown.index("Experiment shakespeare_char (LanguageModelConfig)") < min(evals)
    sample = shown.index("--- sample 0 (temperature 0.8, top_k 40, top_p 1.0) ---")
    finished = next(i for i, line in enumerate(shown) if line.startswith("Finished at step 6"))
    assert bar < sample < finished  # the sample, then the result and what next, which end the screen
    assert (
        shown[finished + 1].startswith("  wall time    ") and shown[-1] == "  resume       the same train command again"
    )
    decode = '  decode       python -m pax_eqx.decode --job-log-dir runs/shakespeare --prompt "ROMEO:"'  # 88 columns
    first = next(i for i, line in enumerate(shown) if line.startswith("  decode  "))
    assert shown[first].endswith(" \\") and shown[first + 1].startswith(" " * 17)  # continued: it pastes as one
    assert " ".join(shown[first].removesuffix(" \\").split() + shown[first + 1].split()) == " ".join(decode.split())

    # DIR/train.log: the progress lines the bar showed, one per summary, with the rest unwrapped.
    log = (job / "train.log").read_text().splitlines()
    progress = [line for line in log if re.fullmatch(PROGRESS_LINE, line)]
    assert [line[11:25] for line in progress] == ["step 2/6 (33%)", "step 4/6 (67%)", "step 6/6 (100%"]
    assert log.index(progress[1]) < next(i for i, line in enumerate(log) if "batches 3-4" in line)
    assert decode in log


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
    said = r"(compiling the train step|running the first steps|evaluating|saving a checkpoint|drawing the plots"
    said += r"|done(, [\d.,]+ (s/step|steps/s))?)"
    assert all(re.fullmatch(rf"step \d/6 \(\d+%\) {said}, \d+s elapsed(, ETA \d+s)?", x) for x in heartbeats), lines
    assert all(re.fullmatch(PROGRESS_LINE, line) and len(line) <= COLUMNS for line in progress), progress
    assert [line[11:].split(")")[0] + ")" for line in progress] == [
        "step 2/6 (33%)",
        "step 4/6 (67%)",
        "step 6/6 (100%)",
    ]
    assert " ETA " in progress[0] and " ETA " not in progress[-1]
    log = (tmp_path / "job" / "train.log").read_text().splitlines()
    assert [line for line in log if " loss " in line and line.startswith("[")] == progress  # no heartbeats
