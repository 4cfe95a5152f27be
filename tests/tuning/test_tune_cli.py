"""`python -m pax_eqx.tune` end to end: trials are real `train` runs of a tiny shakespeare_char.

- A grid study whose first trial is the experiment's own learning rate: a hopeless rate is
  pruned at its first eval, an absurd one fails (NaN) and the study goes on; the report, the best
  config (which `train` runs as it is) and the plot are written.
- Kill and resume with two processes: the tuner is SIGKILLed while trial 0 trains (its trainer
  saves and exits with it), then two tuners share the study: trial 0 resumes from its checkpoint,
  and the study has exactly --num-trials trials between them.
- Bad input (a typo in the space, a job dir, a grid over a range, another setup for a study) is
  one error line, exit 2, before anything is written.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from pax_eqx import tune
from pax_eqx.command_line import registry

TINY_TRIAL = [
    "--model.num-layers", "1", "--model.model-dims", "16", "--model.hidden-dims", "32", "--model.num-heads", "2",
    "--data.seq-len", "16", "--data.train.batch-size", "4", "--data.eval.batch-size", "4",
    "--data.eval.eval-loop-num-batches", "1", "--train.steps-per-loop", "1", "--train.summary-interval-steps", "1",
    "--train.eval-interval-steps", "5", "--learner.schedule.warmup-steps", "0",
]  # fmt: skip


def env(**extra: str) -> dict[str, str]:
    """One CPU device per trainer (no fake devices: the experiment's mesh is 1 x 1 x 1)."""
    e = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return {**e, "JAX_PLATFORMS": "cpu", **extra}


def tune_command(study_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "pax_eqx.tune", "--exp", "shakespeare_char", "--study-dir", str(study_dir), *args]


def rows(study_dir: Path) -> list[dict[str, str]]:
    with open(study_dir / "trials.csv") as f:
        return list(csv.DictReader(f))


def test_a_study_prunes_a_hopeless_trial_survives_a_failing_one_and_reports(tmp_path):
    (tmp_path / "spaces.py").write_text(
        "from pax_eqx.tuning import Choice, SearchSpace\n"
        "LR = SearchSpace({'learner.learning_rate': Choice((2e-3, 1e-7, 1e30))},\n"
        "                 overrides=('--train.no-sample-at-end',))\n"
    )
    study = tmp_path / "study"
    args = ["--search-space", "spaces.LR", "--sampler", "grid", "--num-trials", "3",
            "--pruner-startup-trials", "1", "--train.num-steps", "100", *TINY_TRIAL]  # fmt: skip
    result = subprocess.run(tune_command(study, *args), env=env(PYTHONPATH=str(tmp_path)), capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    by_rate = {float(r["learner.learning_rate"]): r for r in rows(study)}
    assert by_rate[2e-3]["trial"] == "0" and by_rate[2e-3]["state"] == "complete"  # the experiment's own rate first
    assert by_rate[2e-3]["steps"] == "100"
    assert by_rate[1e-7]["state"] == "pruned" and 5 <= int(by_rate[1e-7]["steps"]) < 100  # after its first eval
    assert "pruned: loss 5.5" in result.stdout and "at its step-5 eval" in result.stdout
    assert by_rate[1e30]["state"] == "failed" and "is nan at step 2" in by_rate[1e30]["error"]
    assert "the study goes on" in result.stdout
    # the best config is the complete trial's resolved experiment, and train runs it as it is
    best = study / "best" / "config.json"
    assert json.loads(best.read_text()) == json.loads((study / "trials" / "0000" / "config.json").read_text())
    assert registry.load_experiment(str(best)).learner.learning_rate == 2e-3
    assert (study / "best" / "command.txt").read_text().startswith("python -m pax_eqx.train --exp shakespeare_char")
    assert (study / "plots" / "optimization_history.png").stat().st_size > 1000
    assert "param_importances.png needs 2 complete trials" in result.stdout
    # each trial is a job dir of its own, with the trainer's output beside it
    pruned_dir = study / by_rate[1e-7]["job_dir"]
    assert json.loads((pruned_dir / "config.json").read_text())["learner"]["learning_rate"] == 1e-7
    assert "Stop requested" in (pruned_dir / "trial.log").read_text()  # SIGTERM: it saved, then exited


def _trainers_of(job_dir: Path) -> list[int]:
    """Pids of processes training in `job_dir`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"pax_eqx.train" in cmdline and str(job_dir).encode() in cmdline:
            found.append(int(proc.name))
    return found


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and PR_SET_PDEATHSIG")
def test_a_killed_study_resumes_its_trial_and_two_processes_share_it(tmp_path):
    study = tmp_path / "study"
    command = tune_command(study, "--num-trials", "3", "--pruner", "none", "--sampler", "random", "--seed", "1",
                           "--train.num-steps", "30", "--checkpoint.every-n-steps", "5", *TINY_TRIAL)  # fmt: skip
    first = subprocess.Popen(command, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    checkpoints = study / "trials" / "0000" / "checkpoints"
    _wait(lambda: checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir()), 300, "a checkpoint")
    first.kill()  # SIGKILL: the tuner gets no chance to stop its trainer
    first.communicate()
    _wait(lambda: not _trainers_of(study / "trials" / "0000"), 120, "the orphaned trainer to exit")  # PDEATHSIG

    second = [subprocess.Popen(command + extra, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True) for extra in (["--num-workers", "2"], [])]  # fmt: skip
    outputs = [p.communicate(timeout=600)[0] for p in second]
    if [p.returncode for p in second] != [0, 0]:
        print(*outputs, sep="\n--- the other tuner ---\n")  # whole, in "Captured stdout" (the assert truncates)
    assert [p.returncode for p in second] == [0, 0], outputs
    log = (study / "trials" / "0000" / "trial.log").read_text()
    assert "Resuming shakespeare_char from checkpoint at step" in log

    states = [(r["trial"], r["state"], r["job_dir"], r["resumes"]) for r in rows(study)]
    assert states[0] == ("0", "interrupted", "trials/0000", "")
    complete = [s for s in states if s[1] == "complete"]
    assert len(complete) == 3 and len(states) == 4  # --num-trials 3 between the two processes
    assert ("trials/0000", "0") in {(s[2], s[3]) for s in complete}  # trial 0 went on in its own job dir
    assert len({s[2] for s in complete}) == 3

    loaded = optuna.load_study(study_name="shakespeare_char", storage=f"sqlite:///{study / 'study.db'}")
    workers = {t.user_attrs["worker"]["pid"] for t in loaded.trials if t.state.name == "COMPLETE"}
    assert workers == {p.pid for p in second}  # both processes ran trials of the one study


@pytest.mark.parametrize(
    "args, message",
    [
        (["--param", "learner.learnin-rate=loguniform:1e-4:1e-2"],
         "learner: LearnerConfig has no field 'learnin_rate'. Did you mean 'learning_rate'?"),
        (["--job-log-dir", "x"], "the tuner gives each trial a job dir under --study-dir"),
        (["--sampler", "grid"], "--sampler grid takes choices only"),
        (["--num-trials", "0"], "--num-trials 0 is out of range"),
        (["--param", "train.steps-per-loop=int:1:20000"], "the experiment refuses train.steps_per_loop=20000"),
        (["--storage", "postgresql://u:secret@127.0.0.1:1/db"],  # the password is not printed
         "--storage 'postgresql://u:***@127.0.0.1:1/db': its driver, psycopg2, is not installed; pip install "
         "psycopg2-binary."),
        (["--storage", "bogus://x"], "--storage 'bogus://x' is not a database URL SQLAlchemy knows"),
        (["--pruner", "none", "--pruner-startup-trials", "5"],
         "--pruner-startup-trials would do nothing: --pruner none has no startup trials"),
        (["--pruner", "asha", "--pruner-warmup-steps", "100"],
         "--pruner-warmup-steps would do nothing: --pruner asha has no warmup steps"),
        (["--sampler", "grid", "--param", "learner.learning_rate=choice:1e-3,2e-3", "--seed", "3"],
         "--seed would do nothing: --sampler grid runs every combination in order and draws nothing"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_before_anything_is_written(tmp_path, capsys, args, message):
    study = tmp_path / "study"
    with pytest.raises(SystemExit) as info:
        from pax_eqx.command_line import entry

        entry.run(lambda: tune.main(["--exp", "shakespeare_char", "--study-dir", str(study), *args]))
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert err.count("error:") == 1 and message in err and "Traceback" not in err
    assert not study.exists()


def test_a_study_started_with_another_setup_is_refused(tmp_path, capsys):
    from pax_eqx.command_line import entry
    from pax_eqx.tuning.study import open_storage, open_study, setup_attrs, storage_url

    study = tmp_path / "study"
    study.mkdir()
    space = registry.search_space("shakespeare_char")
    storage = open_storage(storage_url(study, None), 30)
    open_study(storage, "shakespeare_char", setup_attrs("shakespeare_char", ["--train.num-steps", "300"], space),
               None, None)  # fmt: skip
    with pytest.raises(SystemExit) as info:
        entry.run(lambda: tune.main(["--exp", "shakespeare_char", "--study-dir", str(study), "--train.num-steps", "9"]))
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert "was started with another setup (args: ['--train.num-steps', '300'] -> ['--train.num-steps', '9'])" in err
    assert sorted(p.name for p in study.iterdir()) == ["study.db"]  # no trial was started


def test_a_study_dir_that_cannot_be_created_is_one_line(tmp_path, capsys):
    """It was a raw sqlalchemy / optuna traceback (an unwritable study dir, as root cannot be
    tested here: root writes anywhere, so the path runs through a file instead)."""
    from pax_eqx.command_line import entry

    (tmp_path / "a_file").write_text("")
    study = tmp_path / "a_file" / "study"
    with pytest.raises(SystemExit) as info:
        entry.run(lambda: tune.main(["--exp", "shakespeare_char", "--study-dir", str(study)]))
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.count("error:") == 1 and "cannot be created (Not a directory); choose a writable path" in err
    assert "Traceback" not in err


def test_a_misspelt_metric_stops_the_study_at_its_first_trainers_start_and_can_be_corrected(tmp_path):
    """It was found at the first eval, after steps and checkpoints, and the corrected metric was
    then refused as another setup for the study."""
    study = tmp_path / "study"
    args = ["--metric", "losss", "--num-trials", "2", "--train.num-steps", "10000", *TINY_TRIAL]
    result = subprocess.run(tune_command(study, *args), env=env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("error:") == 1 and "Traceback" not in result.stderr
    assert "error: --metric 'losss' is not an eval metric of this experiment; its evals report " in result.stderr
    assert ", loss, " in result.stderr and "Pass --metric with one of them." in result.stderr
    assert not (study / "trials" / "0000" / "checkpoints").exists()  # refused before the first step

    from pax_eqx.tuning.study import StudyMismatchError, open_storage, open_study, setup_attrs, storage_url

    storage = open_storage(storage_url(study, None), 30)
    space = registry.search_space("shakespeare_char")
    user_args = args[4:]  # what is passed to the trainers: all but --metric and --num-trials
    corrected = open_study(storage, "shakespeare_char", setup_attrs("shakespeare_char", user_args, space), None, None)
    assert corrected.user_attrs["metric"] == "loss"  # nothing was scored: the objective may change
    trial = corrected.ask()
    corrected.tell(trial, 1.0)
    with pytest.raises(StudyMismatchError, match="metric: 'loss' -> 'log_pplx'"):
        another = setup_attrs("shakespeare_char", user_args, space.replace(metric="log_pplx"))
        open_study(storage, "shakespeare_char", another, None, None)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_a_trial_whose_trainer_is_killed_resumes_from_its_checkpoint(tmp_path):
    """It was failed for good, its error a progress line, and a rerun said 'no trial completed'."""
    study = tmp_path / "study"
    command = tune_command(study, "--num-trials", "1", "--pruner", "none", "--no-baseline", "--sampler", "random",
                           "--seed", "0", "--train.num-steps", "12", "--checkpoint.every-n-steps", "3",
                           "--train.no-sample-at-end", *TINY_TRIAL)  # fmt: skip
    tuner = subprocess.Popen(command, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    checkpoints = study / "trials" / "0000" / "checkpoints"
    _wait(lambda: checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir()), 300, "a checkpoint")
    trainers = _trainers_of(study / "trials" / "0000")
    assert len(trainers) == 1
    os.kill(trainers[0], 9)
    output = tuner.communicate(timeout=600)[0]
    assert tuner.returncode == 0, output
    assert "trial 0: its trainer was killed by SIGKILL at step " in output
    assert "queued to resume from its checkpoint (1 of 2 resumes after a kill)" in output
    assert "Resuming shakespeare_char from checkpoint at step" in (study / "trials" / "0000" / "trial.log").read_text()
    states = [(r["trial"], r["state"], r["job_dir"], r["resumes"], r["steps"]) for r in rows(study)]
    assert states == [
        ("0", "interrupted", "trials/0000", "", states[0][4]),
        ("1", "complete", "trials/0000", "0", "12"),
    ]
