"""The tuner's line per running trial: formatted within 80 columns, printed piped at most every
`every` seconds, redrawn in place on a terminal, fed by run_trial from the trainer's metrics.jsonl.

The trainer here is test_trial_run.py's stand-in (train and eval lines, 0.4 s a step): issue 50
found the tuner silent for the whole of each trial.
"""

from __future__ import annotations

import functools
import io
import re

from test_trial_run import trainer

from pax_eqx.tuning.trial_lines import WIDTH, TrialLines, TrialState, trial_line
from pax_eqx.tuning.trial_run import run_trial


def test_a_trial_line_says_step_loss_eval_time_and_eta():
    state = TrialState(3, 300, started=100.0, step=120, loss=2.01342, steps_per_s=10.0, eval=(100, 2.0512))
    assert trial_line(state, "loss", now=112.0) == "trial 3: step 120/300 loss 2.013, loss 2.051 at 100, 12s, ETA 18s"
    assert trial_line(TrialState(4, 300, started=100.0), "loss", now=103.4) == "trial 4: starting, 3s"
    done = TrialState(3, 300, started=0.0, step=300, loss=1.5, steps_per_s=10.0)
    assert trial_line(done, "loss", now=75.0) == "trial 3: step 300/300 loss 1.5, 1m15s"  # no ETA at the end


def test_a_long_trial_line_drops_its_eta_then_its_eval_to_fit_80_columns():
    state = TrialState(1234, 1_000_000, started=0.0, step=123_456, loss=2.0134, steps_per_s=0.5,
                       eval=(120_000, 1.234567))  # fmt: skip
    metric = "a_very_long_metric_name_of_a_user_experiment"
    assert trial_line(state, metric, now=4000.0) == "trial 1234: step 123456/1000000 loss 2.013, 1h06m40s"
    assert trial_line(state, "loss", now=4000.0) == (
        "trial 1234: step 123456/1000000 loss 2.013, loss 1.235 at 120000, 1h06m40s"  # 75 columns; the ETA: 91
    )


def test_the_pace_is_the_trainers_own_clock_from_its_first_train_line():
    """Compile excluded; a resumed trial's older lines (read at once) keep their pace, and the
    new trainer process (its elapsed_s back near 0) starts a new count."""
    state = TrialState(0, 100, started=0.0)
    state.train_line({"step": 10, "split": "train", "loss": 3.0, "elapsed_s": 30.0})  # 30 s of compile
    assert state.steps_per_s is None
    state.train_line({"step": 20, "split": "train", "loss": 2.9, "elapsed_s": 35.0})
    assert state.steps_per_s == 2.0
    state.train_line({"step": 30, "split": "train", "loss": 2.8, "elapsed_s": 4.0})  # resumed: a new process
    assert state.steps_per_s is None and state.step == 30
    state.train_line({"step": 40, "split": "train", "loss": 2.7, "elapsed_s": 24.0})
    assert state.steps_per_s == 0.5
    assert trial_line(state, "loss", now=60.0) == "trial 0: step 40/100 loss 2.7, 1m00s, ETA 2m00s"


def test_piped_a_trial_prints_its_news_at_most_every_few_seconds_and_a_heartbeat_when_quiet():
    stream = io.StringIO()
    lines = TrialLines("loss", stream, every=1000.0, quiet=3000.0)  # its own thread never comes due here
    with lines.running(7, 10):
        state = lines._trials[7]
        start = state.started
        assert lines.due(start + 500.0) == []  # not yet `every` seconds
        assert lines.due(start + 1000.0) == ["trial 7: starting, 16m40s"]  # news: the trial started
        lines.record(7, {"step": 1, "split": "train", "loss": 4.75, "elapsed_s": 100.0})
        lines.record(7, {"step": 2, "split": "train", "loss": 4.5, "elapsed_s": 200.0})  # 100 s a step
        lines.record(7, {"step": 2, "split": "eval", "loss": 4.25})
        lines.record(7, {"step": 2, "split": "eval", "accuracy": 0.5})  # not the study's metric
        assert lines.due(start + 1500.0) == []  # news, but only 500 s after its last line
        assert lines.due(start + 2000.0) == ["trial 7: step 2/10 loss 4.5, loss 4.25 at 2, 33m20s, ETA 13m20s"]
        assert lines.due(start + 4000.0) == []  # no news
        assert lines.due(start + 5000.0) == ["trial 7: step 2/10 loss 4.5, loss 4.25 at 2, 1h23m20s, ETA 13m20s"]
    assert lines.lines() == []  # its line went with its run
    lines.log("trial 7 complete: loss 4.25 at step 10")
    lines.close()
    assert stream.getvalue() == "trial 7 complete: loss 4.25 at step 10\n"


def test_run_trial_feeds_the_line_of_a_running_trainer(tmp_path):
    """A 5-step trainer (0.4 s a step) watched with lines due every 0.3 s: piped, the steps show
    as they are logged, each line within 80 columns."""
    stream = io.StringIO()
    lines = TrialLines("loss", stream, every=0.3, quiet=60.0)
    with lines.running(0, 5):
        outcome = run_trial(trainer(tmp_path, 5, 5), tmp_path / "job", metric="loss", num_steps=5, stops_early=False,
                            report=lambda step, value: False, stopping=lambda: False,
                            watch=functools.partial(lines.record, 0))  # fmt: skip
    lines.close()
    assert outcome.state == "complete"
    printed = stream.getvalue().splitlines()
    steps = [int(m.group(1)) for line in printed if (m := re.match(r"trial 0: step (\d)/5 loss 9, loss \d+ at", line))]
    assert len(steps) >= 2 and steps == sorted(steps), printed
    assert all(len(line) <= WIDTH for line in printed)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_lines_are_redrawn_below_the_tuners_own():
    stream = _Terminal()
    lines = TrialLines("loss", stream)
    with lines.running(2, 300):
        lines.record(2, {"step": 100, "split": "train", "loss": 2.5, "elapsed_s": 10.0})
        lines.record(2, {"step": 120, "split": "train", "loss": 2.0, "elapsed_s": 12.0})
        lines._live.refresh()
        lines.log("trial 1 complete: loss 1.9 at step 300")
        lines._live.refresh()
    lines.close()
    out = stream.getvalue()
    assert "trial 2: step 120/300 loss 2, 0s, ETA 18s" in out
    assert "trial 1 complete: loss 1.9 at step 300" in out
    assert out.index("trial 1 complete") > out.index("trial 2: step 120/300")  # drawn, then printed above it
