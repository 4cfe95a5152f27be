"""The CLI as a user drives it: train -> job dir files -> resume -> eval -> decode, and errors."""

import json
import os
import subprocess
import sys

import pytest
from tiny import TINY, mesh_args, tiny_args

from pax_eqx import decode, train
from pax_eqx import eval as eval_main
from pax_eqx.command_line.registry import UnknownExperimentError

ONE_DEVICE = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}


def metrics(job_dir) -> list[dict]:
    return [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    job = tmp_path_factory.mktemp("job")
    args = tiny_args(job)
    assert train.main(args) == 0
    return job, args


def test_train_writes_the_job_dir(trained):
    job, _ = trained
    config = json.loads((job / "config.json").read_text())
    assert config["model"]["num_layers"] == 1 and config["train"]["num_steps"] == 6
    assert sorted(p.name for p in (job / "checkpoints").iterdir() if p.name.isdigit()) == ["3", "6"]
    assert list((job / "summaries" / "train").iterdir()) and list((job / "summaries" / "eval").iterdir())
    rows = metrics(job)
    train_steps = [r["step"] for r in rows if r["split"] == "train"]
    assert train_steps == [2, 4, 6]
    assert [r["step"] for r in rows if r["split"] == "eval"] == [3, 6]
    assert all("loss" in r for r in rows)
    assert (job / "plots" / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_the_job_dir_records_how_it_was_made(trained):
    """command.txt (the command, where, which code and packages), train.log (the log lines),
    and every metrics row's wall time and seconds since the run started."""
    job, args = trained
    command = (job / "command.txt").read_text()
    assert "$ python -m pax_eqx.train --exp shakespeare_char --job-log-dir " in command
    assert "\ncwd: " in command and "\ncode: " in command and "; jax " in command and "; equinox " in command
    log = (job / "train.log").read_text()
    assert log.startswith("===== ") and "Finished at step 6" in log
    assert "tokens/s over the run, evals included; last window " in log
    # The banner, then the closing block with this job dir's commands.
    assert "Experiment shakespeare_char (LanguageModelConfig)\n  params   " in log
    assert "  steps    0 -> 6 (6 to go)" in log
    assert f"  evaluate     python -m pax_eqx.eval --job-log-dir {job}" in log
    assert f'  decode       python -m pax_eqx.decode --job-log-dir {job} --prompt "ROMEO:"' in log
    rows = metrics(job)
    assert all(r["time"] > 1.7e9 and r["elapsed_s"] >= 0 for r in rows)
    assert [r["elapsed_s"] for r in rows] == sorted(r["elapsed_s"] for r in rows)


def test_second_run_resumes_from_the_latest_checkpoint(trained, capsys):
    job, args = trained
    assert train.main(args + ["--train.num-steps", "8"]) == 0
    out = capsys.readouterr().out
    assert "Resuming" in out and "step 6" in out
    assert "batches 5-6" in out  # the rolling eval's count goes on across the resume (it said 1-2)
    assert [r["step"] for r in metrics(job) if r["split"] == "train"][-2:] == [6, 8]


def test_eval_and_decode_use_the_checkpoint(trained, capsys):
    """Both read the experiment and every train flag from DIR/config.json: no flag repeated."""
    job, args = trained
    assert eval_main.main(["--job-log-dir", str(job)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["step"] >= 6 and result["total_loss"] > 0
    assert eval_main.main(args) == 0  # the train command's own flags agree with the saved ones
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
    decode_args = ["--job-log-dir", str(job), "--prompt", "ROMEO:", "--max-new-tokens", "10", "--temperature", "0"]
    assert decode.main(decode_args) == 0
    out = capsys.readouterr().out
    assert "ROMEO:" in out


def test_eval_on_a_checkpoint_prints_the_number_training_printed_at_its_step(tmp_path, capsys):
    """One validation number: the default's eval is Pax's rolling window (each eval reads the next
    batches), and `eval` on checkpoint N reads the batches the training eval at step N read."""
    job = tmp_path / "job"
    assert train.main(tiny_args(job, "--train.no-sample-at-end")) == 0
    printed = capsys.readouterr().out
    assert "batches 1-2" in printed and "batches 3-4" in printed  # the evals at steps 3 and 6
    at_6 = [r for r in metrics(job) if r["split"] == "eval" and r["step"] == 6][0]
    assert eval_main.main(["--job-log-dir", str(job)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "Reading the eval batches the training eval at step 6 read" in out[0]
    assert out[-2].endswith("batches 3-4")
    result = json.loads(out[-1])
    assert result["step"] == 6
    assert result["total_loss"] == at_6["total_loss"] and result["accuracy"] == at_6["accuracy"]  # bit for bit


def test_an_exp_other_than_the_saved_one_is_refused_with_the_command_that_works(trained, capsys):
    job, _ = trained
    with pytest.raises(SystemExit) as e:
        eval_main.main(["--exp", "digits_mlp", "--job-log-dir", str(job), "--data.eval.eval-loop-num-batches", "1"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds a run of 'shakespeare_char'" in err
    assert err.endswith(f"python -m pax_eqx.eval --job-log-dir {job} --data.eval.eval-loop-num-batches 1")


def test_typo_in_a_flag_fails_with_a_suggestion(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(["--job-log-dir", str(tmp_path / "x"), "--model.num-layer", "2"])
    assert e.value.code != 0
    err = capsys.readouterr().err
    assert "num-layers" in err or "num_layers" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "flag, field, element",
    [
        (["--learner.variable-groups", ".*norm.*"], "learner.variable_groups", "VariableGroupConfig"),
        (["--checkpoint.init_from_checkpoint_rules=runs/src"], "checkpoint.init_from_checkpoint_rules",
         "InitFromCheckpointConfig"),
    ],
)  # fmt: skip
def test_a_python_only_field_as_a_flag_names_the_fix(tmp_path, capsys, flag, field, element):
    """A tuple of configs has no flag syntax (tyro leaves it out): one line naming the field and the
    Python that sets it, not tyro's bare "Unrecognized options"; nothing written; --help lists them."""
    with pytest.raises(SystemExit) as e:
        train.main(["--job-log-dir", str(tmp_path / "x"), *flag])
    assert e.value.code == 2
    err = capsys.readouterr().err
    section, name = field.split(".")
    assert f"{field} is a tuple of {element}s" in err
    assert f"exp.replace({section}=exp.{section}.replace({name}=({element}(...),)))" in err
    assert "Write your own experiment" in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()
    with pytest.raises(SystemExit):
        train.main(["--help"])
    assert f"{field} ({element})" in capsys.readouterr().out


def test_unknown_experiment_is_named(tmp_path, capsys):
    with pytest.raises(UnknownExperimentError, match="'shakespeare_chars'.*Did you mean 'shakespeare_char'"):
        train.main(["--exp", "shakespeare_chars", "--job-log-dir", str(tmp_path)])


def test_help_lists_experiments_and_fields(capsys):
    with pytest.raises(SystemExit) as e:
        train.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "shakespeare_char" in out and "num-layers" in out


def test_real_command_line_with_pax_spelling(tmp_path):
    """`python -m pax_eqx.train --job_log_dir` in a fresh process, to the sample printed at the end.
    (`python -m pax_eqx.decode` as a process of its own: README.md's decode commands, run by
    tests/test_docs_commands.py; decode.main on a checkpoint: test_eval_and_decode_use_the_checkpoint.)"""
    env = {**os.environ, **ONE_DEVICE}
    job = tmp_path / "job"
    cmd = [sys.executable, "-m", "pax_eqx.train", "--exp", "shakespeare_char", "--job_log_dir", str(job), *TINY,
           *mesh_args(1)]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Finished at step 6" in done.stdout
    assert "--- sample 0" in done.stdout
    assert sorted(p.name for p in (job / "checkpoints").iterdir() if p.name.isdigit()) == ["3", "6"]
