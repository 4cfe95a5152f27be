"""Every bad input of the issue: one `error:` line that names the field, the value and the fix,
a non-zero exit, no traceback, and nothing already written lost or changed.

Most cases need no training, so they call the CLI's `main()` in this process through
`pax_eqx.command_line.entry.run` -- the same wrapper `python -m` uses, so an exception that escaped it would
fail the test with its traceback. A few run as real subprocesses to prove the exit status and
the output of the actual command line. Cases that resume a job dir use a copy of the reference
run's job dir and compare its config.json and checkpoints byte for byte before and after.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import jax
import pytest
from reliability_faults import CORPUS_ENV
from reliability_harness import (
    ARGS,
    assert_no_traceback,
    copy_of_reference,
    corpus,
    run,
    snapshot,
)

from pax_eqx import decode, train
from pax_eqx import eval as eval_main
from pax_eqx.command_line import entry
from pax_eqx.data import DataConfig, TextFilesSource, build_tokenizer
from pax_eqx.data.tokenizers import SentencePieceConfig


def args(job, *extra: str) -> list[str]:
    """The reliability experiment for this process's devices (tensor-parallel over all of them,
    so the per-host batch of 4 still splits over data x fsdp = 1)."""
    mesh = ["--mesh.ici-mesh-shape", "1", "1", str(jax.device_count())]
    base = list(ARGS)
    if "--data.source" in extra:  # another source than the fault-injecting custom input: not its flag
        i = base.index("--data.custom-input")
        del base[i : i + 2]
    return [*base, "--job-log-dir", str(job), *mesh, *extra]


@pytest.fixture(autouse=True)
def _corpus_of_the_custom_input(monkeypatch):
    """The corpus the fault-injecting custom input reads, as `reliability_harness.environment()`
    names it to a subprocess."""
    monkeypatch.setenv(CORPUS_ENV, str(corpus()))


pytestmark = pytest.mark.usefixtures("entry_hooks_restored")  # it calls entry.run in this process


def cli(main, argv, capsys) -> tuple[int, str]:
    """(exit status, the error message) of `python -m pax_eqx.<main> argv`, run in this process.

    The message is one `error:` line; only a list it announces (the changed fields of a config
    diff, the mismatched leaves of a checkpoint) continues on indented lines after it.
    """
    with pytest.raises(SystemExit) as exit_info:
        entry.run(lambda: main(argv))
    err = capsys.readouterr().err
    assert_no_traceback(err)
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("warning:")]
    assert lines and lines[0].startswith("error: "), err
    assert sum(line.startswith("error:") for line in lines) == 1, err
    return exit_info.value.code, "\n".join(lines)


def assert_says(message: str, *parts: str) -> None:
    for part in parts:
        assert part in message, f"{part!r} not in: {message}"


# --------------------------------------------------------------- flags, fields and values


def test_unknown_experiment(tmp_path, capsys):
    code, message = cli(train.main, ["--exp", "shakespeare_chars", "--job-log-dir", str(tmp_path / "j")], capsys)
    assert code == 2
    assert_says(message, "--exp 'shakespeare_chars' is not a registered experiment", "Did you mean 'shakespeare_char'")
    assert not (tmp_path / "j").exists()


@pytest.mark.parametrize(
    "flag, says",
    [
        (
            ["--model.num-layer", "2"],
            ["Unrecognized options: --model.num-layer", "Perhaps you meant", "--model.num-layers"],
        ),
        (["--model.num-layers", "two"], ["--model.num-layers", "'two'", "--model.num-layers INT"]),
        (
            ["--data.source", "files"],
            ["--data.source 'files' is not one of", "shakespeare", "Did you mean 'text_files'?"],
        ),
        (["--mesh.ici-mesh-shape", "1", "x", "1"], ["--mesh.ici-mesh-shape", "'x'", "INT [INT ...]"]),
        (["--checkpoint.every-n-steps", "-1"], ["checkpoint.every_n_steps must be >= 0", "got -1"]),
    ],
    ids=["misspelt-flag", "wrong-type", "bad-choice", "wrong-tuple", "negative-interval"],
)
def test_flags_and_values(flag, says, tmp_path, capsys):
    code, message = cli(train.main, args(tmp_path / "j", *flag), capsys)
    assert code == 2 and "\n" not in message  # one line
    assert_says(message, *says)
    assert not (tmp_path / "j").exists()


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--train.num-steps", "0"], ["train.num_steps must be > 0", "got 0", "--train.num-steps 1000"]),
        (["--train.num-steps", "-5"], ["train.num_steps must be > 0", "got -5"]),
        (["--data.seq-len", "128"], ["data.seq_len=128 is longer than model.max_seq_len=64", "lower data.seq_len"]),
        (["--mesh.ici-mesh-shape", "2", "1", "1"], ["mesh.ici_mesh_shape (2, 1, 1)", "choose shapes whose product"]),
        (["--mesh.ici-mesh-shape", "0", "1", "1"], ["mesh.ici_mesh_shape must be 3 positive sizes", "(0, 1, 1)"]),
        (["--data.eval.reset-for-eval"], ["data.eval.reset_for_eval=True", "eval_loop_num_batches=2", "not supported"]),
        (["--data.source", "text_files", "--data.path", "/nonexistent/corpus.txt"], ["data.path=", "does not exist"]),
    ],
    ids=["zero-steps", "negative-steps", "seq-past-max-position", "mesh-vs-devices", "zero-mesh-axis",
         "forbidden-eval-combination", "missing-data-file"],
)  # fmt: skip
def test_config_errors_before_anything_is_written(extra, says, tmp_path, capsys):
    code, message = cli(train.main, args(tmp_path / "j", *extra), capsys)
    assert code == 2
    assert_says(message, *says)
    assert not (tmp_path / "j").exists()


def test_batch_not_divisible_by_the_data_axes(tmp_path, capsys):
    n = jax.device_count()
    code, message = cli(train.main, args(tmp_path / "j", "--mesh.ici-mesh-shape", str(n), "1", "1"), capsys)
    assert code == 2
    assert_says(message, "data.train.batch_size=4", f"is not divisible by the mesh's data x fsdp = {n}",
                "change the batch size or the mesh shape")  # fmt: skip
    assert not (tmp_path / "j").exists()


def test_dry_run_on_an_impossible_mesh(tmp_path, capsys):
    code, message = cli(train.main, args(tmp_path / "j", "--dry-run", "--mesh.ici-mesh-shape", "3", "1", "1"), capsys)
    assert code == 2
    assert_says(message, "--dry-run: data.train.batch_size=4 is not divisible", "= 3", "mesh.ici_mesh_shape")
    assert not (tmp_path / "j").exists()


# ------------------------------------------------------------------------------- data


@pytest.mark.parametrize(
    "text, says",
    [("", ["data.path=", "the files are empty", "point data.path at files"]),
     ("hi\n", ["the text has 3 tokens", "data.seq_len=16", "use more text or a shorter data.seq_len"])],
    ids=["empty-file", "too-short-file"],
)  # fmt: skip
def test_empty_data_file(text, says, tmp_path, capsys):
    data = tmp_path / "corpus.txt"
    data.write_text(text)
    job = tmp_path / "j"
    code, message = cli(train.main, args(job, "--data.source", "text_files", "--data.path", str(data)), capsys)
    assert code == 2
    assert_says(message, *says)
    assert not job.exists()  # the job dir train created for the run is removed again


def test_train_and_eval_inputs_with_different_tokenizers(tmp_path, capsys):
    job = tmp_path / "j"
    custom = ["--data.custom-input", "reliability_faults.mismatched_tokenizer_input"]
    code, message = cli(train.main, args(job, *custom), capsys)
    assert code == 2
    assert_says(message, "different tokenizers", "experiment: byte-v1", "data.custom_input (eval): other-vocabulary")
    assert not job.exists()


# ------------------------------------------------------------------ job dirs and resumes


def test_resume_with_a_changed_model_shape_is_refused_with_a_diff(tmp_path, capsys):
    job = copy_of_reference(tmp_path)
    before = snapshot(job)
    code, message = cli(train.main, args(job, "--model.model-dims", "64", "--model.num-heads", "4"), capsys)
    assert code == 2
    assert_says(message, "changed fields (saved -> given)", "model.model_dims: 32 -> 64", "model.num_heads: 2 -> 4",
                "--checkpoint.allow-config-change")  # fmt: skip
    assert "mesh." not in message  # the mesh may change on resume
    assert snapshot(job) == before


def test_a_resume_after_config_json_was_deleted_is_checked_against_the_checkpoints_config(tmp_path, capsys):
    """It was accepted silently: with config.json gone, nothing was compared. Each checkpoint's
    manifest now holds the experiment that wrote it."""
    job = copy_of_reference(tmp_path)
    (job / "config.json").unlink()
    before = snapshot(job)
    code, message = cli(train.main, args(job, "--data.train.batch-size", "8"), capsys)
    assert code == 2
    assert_says(message, "cannot resume", "changed fields (config.json is missing; saved in the step-8 checkpoint "
                "-> given)", "data.train.batch_size: 4 -> 8")  # fmt: skip
    assert snapshot(job) == before


def test_checkpoint_shapes_that_do_not_match_the_model(tmp_path, capsys):
    job = copy_of_reference(tmp_path)
    before = snapshot(job)
    extra = ("--model.model-dims", "64", "--checkpoint.allow-config-change")
    code, message = cli(train.main, args(job, *extra), capsys)
    assert code == 2
    assert_says(message, "checkpoint " + str(job / "checkpoints" / "8") + " does not match",
                "params/embedding/w: checkpoint has shape (260, 32), the model expects (260, 64)",
                "restore with the config it was saved with")  # fmt: skip
    assert snapshot(job) == before  # config.json too: a refused restore does not rewrite it

    # an allowed change that adds parameters (it said "none of the committed checkpoints could be read")
    extra = ("--model.position-embedding", "trainable", "--checkpoint.allow-config-change")
    code, message = cli(train.main, args(job, *extra), capsys)
    assert code == 2
    assert_says(message, "does not match the state being restored (3 differences)",
                "params/position/emb_var: in the model but not in the checkpoint")  # fmt: skip
    assert "could be read" not in message
    assert snapshot(job) == before


def test_eval_with_another_tokenizer_than_training_is_refused(tmp_path, capsys):
    job = copy_of_reference(tmp_path)
    before = snapshot(job)
    spm = ["--data.tokenizer.kind", "sentencepiece", "--data.tokenizer.vocab-size", "64"]
    code, message = cli(eval_main.main, args(job, *spm), capsys)
    assert code == 2
    assert_says(message, "cannot evaluate --job-log-dir", "data.tokenizer.kind: 'byte' -> 'sentencepiece'")
    assert snapshot(job) == before and not (job / "tokenizer").exists()


def test_job_dir_that_is_a_file(tmp_path, capsys):
    file = tmp_path / "job"
    file.write_text("not a directory")
    code, message = cli(train.main, args(file), capsys)
    assert code == 2
    assert_says(message, f"--job-log-dir {str(file)!r} is a file, not a directory", "choose another path")
    assert file.read_text() == "not a directory"


def test_eval_of_a_job_dir_that_does_not_exist(tmp_path, capsys):
    code, message = cli(eval_main.main, args(tmp_path / "missing"), capsys)
    assert code == 2
    assert_says(message, "does not exist; train first, or check the path")


# ------------------------------------------------------------------------------ decode


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory) -> Path:
    """A small SentencePiece model of the (ASCII) corpus: no "é", no "☃" in its vocabulary."""
    where = tmp_path_factory.mktemp("spm")
    data = DataConfig(source=TextFilesSource(path=str(corpus())), tokenizer=SentencePieceConfig(vocab_size=128))
    build_tokenizer(data, where)
    return where / "tokenizer" / "spm.model"


@pytest.mark.parametrize("main", [decode.main, train.main], ids=["decode", "train-sample-at-end"])
def test_prompt_outside_the_vocabulary(main, spm_model, tmp_path, capsys):
    job = tmp_path / "j"
    job.mkdir()
    spm = ["--data.tokenizer.kind", "sentencepiece", "--data.tokenizer.model-path", str(spm_model)]
    sample = ["--train.sample-at-end"] if main is train.main else []
    code, message = cli(main, args(job, *spm, *sample, "--decode.prompt", "ROMEO: café ☃"), capsys)
    assert code == 2
    assert_says(message, "decode.prompt (--prompt) 'ROMEO: café ☃' has characters outside the vocabulary", "é",
                "☃", "remove them")  # fmt: skip
    assert list(job.iterdir()) == []


# ------------------------------------------------------------- real command lines


def _one_error_line(stderr: str) -> str:
    assert_no_traceback(stderr)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def test_subprocess_misspelt_flag_exits_2_with_one_line(tmp_path):
    done = run(tmp_path / "j", "--train.num-step", "3")
    assert done.returncode == 2
    assert_says(_one_error_line(done.stderr), "Unrecognized options: --train.num-step", "--train.num-steps")
    assert not (tmp_path / "j").exists()


def test_subprocess_mesh_that_is_not_the_device_count_exits_2(tmp_path):
    done = run(tmp_path / "j", "--mesh.ici-mesh-shape", "2", "1", "1")  # the subprocess has 1 device
    assert done.returncode == 2
    assert_says(_one_error_line(done.stderr), "mesh.ici_mesh_shape (2, 1, 1)", "but 1 are available")
    assert not (tmp_path / "j").exists()


def test_subprocess_resume_with_a_changed_model_exits_2_and_changes_nothing(tmp_path):
    job = copy_of_reference(tmp_path)
    before = snapshot(job)
    done = run(job, "--model.num-layers", "2")
    assert done.returncode == 2
    assert_no_traceback(done.stderr)
    assert_says(done.stderr, "error: cannot resume", "model.num_layers: 1 -> 2")
    assert snapshot(job) == before


def test_subprocess_job_dir_that_is_not_writable_exits_2(tmp_path):
    """Permissions do not stop root, so as root the parent is made immutable (chattr +i) instead."""
    parent = tmp_path / "readonly"
    parent.mkdir()
    root = os.geteuid() == 0
    if root and subprocess.run(["chattr", "+i", str(parent)], capture_output=True).returncode != 0:
        pytest.skip("running as root on a file system without chattr +i: cannot make a directory read-only")
    if not root:
        parent.chmod(0o555)
    try:
        for job, says in [(parent, "is not writable"), (parent / "new", "cannot be created")]:
            done = run(job)
            assert done.returncode == 2, done.stderr[-3000:]
            assert_says(_one_error_line(done.stderr), f"--job-log-dir {str(job)!r}", says, "writable")
        assert list(parent.iterdir()) == []
    finally:
        if root:
            subprocess.run(["chattr", "-i", str(parent)], check=True)
        parent.chmod(0o755)


# --------------------------------------------------------------- new surfaces (Reliability III)


def test_a_prompt_that_is_not_utf8_is_refused_before_the_run(tmp_path, capsys):
    """Bytes that are not UTF-8 reach argv as lone surrogates: refused at start, not after a
    whole run at the final sample (nor with a UnicodeEncodeError traceback from decode)."""
    job = tmp_path / "j"
    code, message = cli(train.main, args(job, "--decode.prompt", "RO\udcff\udcfeMEO"), capsys)
    assert code == 2
    assert_says(message, "decode.prompt=b'RO\\xff\\xfeMEO' is not UTF-8 text", "give the prompt as UTF-8 text")
    assert not (job / "config.json").exists() and not (job / "checkpoints").exists()


@pytest.mark.parametrize(
    "exp, flags, says",
    [
        ("digits_resnet", ["--model.num-classes", "5"], "model.num_classes=5 but data.source='digits_images' has 10"),
        ("digits_mlp", ["--model.num-classes", "3"], "labels >= 3 would have no logit; set --model.num-classes 10"),
        ("digits_resnet", ["--model.input-shape", "16", "16", "1"], "set --model.input-shape 8 8 1"),
        ("digits_mlp", ["--model.input-shape", "32"], "gives examples of shape (64,)"),
    ],
)
def test_a_classifier_that_does_not_fit_the_digits_is_refused(tmp_path, capsys, exp, flags, says):
    """It trained on labels 5-9 without a word, stopped on a NaN blaming the learning rate, or
    trained a 16x16 model on 8x8 images."""
    job = tmp_path / "j"
    mesh = ["--mesh.ici-mesh-shape", "1", "1", str(jax.device_count())]
    code, message = cli(train.main, ["--exp", exp, "--job-log-dir", str(job), *mesh, *flags], capsys)
    assert code == 2
    assert_says(message, says)
    assert not job.exists() or not any(job.iterdir())


def test_a_checkpoints_link_to_nothing_is_named(tmp_path, capsys):
    job = tmp_path / "j"
    job.mkdir()
    (job / "checkpoints").symlink_to(tmp_path / "gone")
    code, message = cli(train.main, args(job), capsys)
    assert code == 2
    assert_says(message, "checkpoints' is a link to", "gone', which does not exist; create that directory or remove")
    assert not (job / "config.json").exists()


def test_a_paxml_job_dir_points_to_import_pax(tmp_path, capsys):
    """Pax's `checkpoints/checkpoint_00000003/`: not "unreadable ... move the directory aside"."""
    job = tmp_path / "pax"
    (job / "checkpoints" / "checkpoint_00000003" / "state").mkdir(parents=True)
    for main in (train.main, eval_main.main):
        code, message = cli(main, args(job), capsys)
        assert code == 2
        assert_says(message, "is a Paxml job dir (checkpoints/checkpoint_00000003)", "python -m pax_eqx.import_pax")
    assert sorted(os.listdir(job)) == ["checkpoints"]


def test_a_digits_batch_larger_than_the_training_split_is_refused(tmp_path, capsys):
    """`--data.train.batch-size 100000` on 1,617 examples: accepted, each batch the split ~61
    times over, and a SIGTERM then took minutes to save."""
    job = tmp_path / "j"
    mesh = ["--mesh.ici-mesh-shape", "1", "1", str(jax.device_count())]
    argv = ["--exp", "digits_resnet", "--job-log-dir", str(job), *mesh, "--data.train.batch-size", "100000"]
    code, message = cli(train.main, argv, capsys)
    assert code == 2
    assert_says(message, "data.train.batch_size=100000 but data.source='digits_images' has 1617 training examples",
                "use a batch size of at most 1617")  # fmt: skip
    assert not job.exists() or not any(job.iterdir())


def test_a_job_dir_without_a_checkpoint_takes_a_changed_config(tmp_path, capsys):
    """A run stopped before its first save (out of memory, say) leaves config.json and no
    checkpoint: rerunning with the advised smaller batch is not a resume, so it is not refused."""

    job = copy_of_reference(tmp_path)
    shutil.rmtree(job / "checkpoints")
    saved = json.loads((job / "config.json").read_text())
    with pytest.raises(SystemExit) as done:
        entry.run(lambda: train.main(args(job, "--data.train.batch-size", "8", "--train.num-steps", "2")))
    out = capsys.readouterr().out
    assert done.value.code == 0, out
    assert_says(out, "Config changes since the last run in this job dir (no checkpoint to resume: this run starts "
                "afresh with them)", "data.train.batch_size: 4 -> 8", "Starting")  # fmt: skip
    assert (
        json.loads((job / "config.json").read_text())["data"]["train"]["batch_size"]
        == 8
        != saved["data"]["train"]["batch_size"]
    )


def test_a_job_dir_without_a_checkpoint_still_refuses_another_experiment(tmp_path, capsys):
    """Nothing to resume, but the dir's config.json and metrics are another experiment's."""
    job = copy_of_reference(tmp_path)
    shutil.rmtree(job / "checkpoints")
    config = job / "config.json"
    saved = json.loads(config.read_text())
    config.write_text(json.dumps({**saved, "name": "another_" + saved["name"]}, indent=2, sort_keys=True))
    before = snapshot(job)
    code, message = cli(train.main, args(job, "--data.train.batch-size", "8"), capsys)
    assert code == 2  # train reads a job dir's experiment (as eval and decode do): --exp naming another is refused
    assert_says(message, "--exp shakespeare_char but --job-log-dir", "holds a run of 'another_shakespeare_char'",
                "drop --exp to use the saved experiment")  # fmt: skip
    assert snapshot(job) == before


@pytest.mark.parametrize(
    "name, says",
    [
        ("x" * 300, "bytes, over the file system's limit of"),
        ("/".join(["d" * 200] * 20), "bytes long: with the checkpoint files below it"),
        ("run\udcff", "is not UTF-8 (checkpoints are written through tensorstore"),
    ],
    ids=["a-name-too-long", "a-path-too-long", "not-utf8"],
)
def test_a_job_dir_path_the_run_could_never_save_into_is_refused(tmp_path, capsys, name, says):
    """It was a raw OSError, or a run that trained and then could never save (a pybind cast
    error), leaving config.json."""
    code, message = cli(train.main, args(f"{tmp_path}/{name}"), capsys)
    assert code == 2
    assert_says(message, says)
    assert os.listdir(tmp_path) == []
