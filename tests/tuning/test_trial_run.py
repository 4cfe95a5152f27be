"""run_trial's protocol with a process that behaves as the trainer does: it appends eval lines
to metrics.jsonl, saves and exits 0 on SIGTERM, exits 1 with an `error:` line on a failure.

The real trainer runs in test_tune_cli.py; here each way a trial can end is driven exactly.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from pax_eqx.tuning.trial_run import MetricNotFoundError, run_trial

TRAINER = """
import json, signal, sys, time
from pathlib import Path
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
out = Path(sys.argv[1]) / "metrics.jsonl"
steps, last, key, code = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
with open(out, "a") as f:
    f.write('{"step": 0, "split": "ev')  # a torn line, as a killed writer leaves it
    f.write("\\n")
    for step in range(1, last + 1):
        f.write(json.dumps({"step": step, "split": "train", "loss": 9.0}) + "\\n")
        f.write(json.dumps({"step": step, "split": "eval", key: 10.0 - step}) + "\\n")
        f.flush()
        time.sleep(0.4)
        if stop:
            print("saved a checkpoint at step", step)
            sys.exit(0)
if code:
    print("error: loss is NaN at step", last)
sys.exit(code)
"""


def trainer(tmp_path, steps: int, last: int, key: str = "loss", code: int = 0) -> list[str]:
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent(TRAINER))
    return [sys.executable, str(script), str(tmp_path / "job"), str(steps), str(last), key, str(code)]


def run(tmp_path, command, prune_at=None, stops_early=False):
    reported = []

    def report(step, value):
        reported.append((step, value))
        return step == prune_at

    outcome = run_trial(command, tmp_path / "job", metric="loss", num_steps=5, stops_early=stops_early,
                        report=report, stopping=lambda: False)  # fmt: skip
    return outcome, reported


def test_a_trial_that_reaches_its_last_step_completes_with_its_last_eval(tmp_path):
    outcome, reported = run(tmp_path, trainer(tmp_path, 5, 5))
    assert (outcome.state, outcome.value, outcome.step) == ("complete", 5.0, 5)
    assert reported == [(1, 9.0), (2, 8.0), (3, 7.0), (4, 6.0)]  # the last step's is the result, not a report
    assert (tmp_path / "job" / "trial.log").read_text().startswith("$ ")  # the command heads the log


def test_a_pruned_trial_is_stopped_with_sigterm_and_saves(tmp_path):
    outcome, reported = run(tmp_path, trainer(tmp_path, 5, 5), prune_at=2)
    assert (outcome.state, outcome.eval_step, outcome.value) == ("pruned", 2, 8.0)
    assert 2 <= outcome.step < 5  # stopped where the signal found it
    assert reported[-1][0] <= 3  # nothing is reported once the trial is pruned
    assert "saved a checkpoint at step" in (tmp_path / "job" / "trial.log").read_text()


def test_a_failing_trainer_fails_the_trial_with_its_error_line(tmp_path):
    outcome, _ = run(tmp_path, trainer(tmp_path, 5, 2, code=1))
    assert outcome.state == "failed" and outcome.error == "loss is NaN at step 2 (exit 1)"


def test_a_trainer_that_stops_early_without_being_told_was_interrupted(tmp_path):
    outcome, _ = run(tmp_path, trainer(tmp_path, 5, 3))
    assert outcome.state == "interrupted" and outcome.step == 3
    # ... unless the run has train.early_stopping: then it completed at its last eval
    outcome, _ = run(tmp_path, trainer(tmp_path, 5, 3), stops_early=True)
    assert (outcome.state, outcome.value) == ("complete", 7.0)


def test_a_metric_the_trainer_does_not_log_is_named_with_the_ones_it_does(tmp_path):
    with pytest.raises(MetricNotFoundError, match=r"--metric 'loss' is not an eval metric .* have accuracy"):
        run(tmp_path, trainer(tmp_path, 5, 5, key="accuracy"))


KILLED = """
import json, os, signal, sys
from pathlib import Path
with open(Path(sys.argv[1]) / "metrics.jsonl", "a") as f:
    f.write(json.dumps({"step": 3, "split": "train", "loss": 9.0}) + "\\n")
print("step 3 | loss 9.0", flush=True)  # the progress line a killed trainer printed last
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_trainer_killed_from_outside_is_killed_not_failed_with_its_progress_line(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(KILLED))
    (tmp_path / "job").mkdir()
    outcome, _ = run(tmp_path, [sys.executable, str(script), str(tmp_path / "job")])
    assert (outcome.state, outcome.step, outcome.error) == ("killed", 3, "killed by SIGKILL at step 3")


def test_a_crash_without_an_error_line_points_to_the_log_not_its_last_line(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("print('step 1 | loss 9.0')\nraise SystemExit(3)\n")
    outcome, _ = run(tmp_path, [sys.executable, str(script)])
    assert outcome.state == "failed"
    assert (
        outcome.error
        == f"the trainer exited 3 without an error line; its output is in {tmp_path / 'job' / 'trial.log'}"
    )


def test_a_killed_trial_is_resumed_in_its_job_dir_until_the_third_kill_in_a_row(tmp_path):
    import optuna

    from pax_eqx.tuning.space import SearchSpace, Uniform
    from pax_eqx.tuning.study import MAX_KILLS, Tuner
    from pax_eqx.tuning.trial_run import Outcome

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    space = SearchSpace({"learner.learning_rate": Uniform(0.1, 0.2)})
    lines = []
    from pax_eqx.experiment import ExperimentConfig

    tuner = Tuner(study, "e", space, ExperimentConfig(), [], tmp_path, 1, heartbeat_seconds=30, log=lines.append)
    trial = study.ask()
    trial.set_user_attr("job_dir", "trials/0000")
    values = space.suggest(trial)
    for kill in range(1, MAX_KILLS + 1):
        tuner._finish(trial, values, Outcome("killed", None, 4, "killed by SIGKILL at step 4"), 1.0)
        if kill < MAX_KILLS:
            trial = study.ask()  # the queued resume: same params, same job dir
            assert trial.user_attrs["job_dir"] == "trials/0000" and trial.user_attrs["kills"] == kill
            assert space.suggest(trial) == values  # the enqueued params, not a new draw
    assert [t.state.name for t in study.trials] == ["FAIL"] * MAX_KILLS
    assert "queued to resume from its checkpoint (1 of 2 resumes after a kill)" in lines[0]
    assert "its trainer killed 3 times in a row, so not resumed again" in lines[-1]
    assert not [t for t in study.trials if t.state.name == "WAITING"]
