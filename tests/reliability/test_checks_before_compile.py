"""The checks before compile (pax_eqx/programs/preflight.py): a fault a run met only after the
compile -- at the first eval, losing that step's checkpoint, or as a NaN loss blamed on the
learning rate -- is refused at the start with one line, exit 2, and nothing written.

One case runs the real command line in a subprocess (the wiring of train.py); the others run
the programs' `main` in process through `entry.run` (the exit status and the line a user sees),
or the preflight itself, on tiny data: an imported tiny Llama (tests/fixtures/hf/llama), a tree
of six-per-split tiny JPEGs, the span-corruption experiment shrunk."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image
from reliability_harness import REPO, environment

from pax_eqx import eval as eval_main
from pax_eqx import import_hf, train
from pax_eqx.command_line import entry
from pax_eqx.config import ConfigError
from pax_eqx.data import imagenet_source
from pax_eqx.data.tokenizers import ByteTokenizer
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.programs import preflight
from pax_eqx.programs.evaluate import decoded_eval

FIXTURES = REPO / "tests" / "fixtures" / "hf"
S2S = [
    "--exp", "shakespeare_span_corruption", "--model.num-encoder-layers", "1", "--model.num-decoder-layers", "1",
    "--model.model-dims", "32", "--model.hidden-dims", "64", "--model.num-heads", "2", "--data.seq-len", "32",
    "--train.num-steps", "2", "--train.no-sample-at-end",
]  # fmt: skip
CLASSES = ("n01440764", "n01443537", "n01484850")


pytestmark = pytest.mark.usefixtures("entry_hooks_restored")  # it calls entry.run in this process


def refused(capsys, main, *argv) -> tuple[int, str]:
    """(exit status, stderr) of a program's `main` run as `python -m` runs it (entry.run), which
    must stop before the compile (and before `Starting ...`, the opening of a run)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        entry.run(lambda: main(list(map(str, argv))))
    said = capsys.readouterr()
    assert "compiling" not in said.out and "Starting" not in said.out, said.out
    return done.value.code, said.err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


# -- a user's eval metric -----------------------------------------------------------------------


def test_a_metric_that_raises_is_refused_by_the_command_line_before_the_job_dir_is_made(tmp_path):
    """The one subprocess: `python -m pax_eqx.train` itself (train.py calls the preflight). It was
    a traceback at the first eval (step 2 here), and that step's checkpoint was never written."""
    job = tmp_path / "job"
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "pax_eqx.train", *S2S, "--job-log-dir", str(job), "--mesh.ici-mesh-shape", "1", "1",
         "1", "--data.train.batch-size", "4", "--data.eval.batch-size", "4",
         "--data.eval.metrics", "exact_match", "checks_metrics.raises"],
        env=environment(), capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    line = one_error_line(done.stderr)
    assert done.returncode == 2, done.stderr
    assert line.startswith(
        "error: data.eval.metrics: 'checks_metrics.raises' raised ValueError: a bug in my metric (raised in raises, "
    ), line
    assert "checks_metrics.py:6) on one made-up pair (targets ['the cat sat on the mat'], predictions" in line
    assert line.endswith("returning {name: float} or a float.")
    assert "compiling" not in done.stdout and not job.exists()
    print(f"refused after {time.time() - started:.1f} s")


@pytest.mark.parametrize(
    "metric, said",
    [
        ("returns_text", "'checks_metrics.returns_text' returned str '0.5', not a number on one made-up pair"),
        ("returns_none", "'checks_metrics.returns_none' returned None, not a number on one made-up pair"),
        ("text_inside", "'checks_metrics.text_inside' returned str 'high' in {'score': ...}, not a number on one"),
        ("no_args", "'checks_metrics.no_args' cannot be called as fn(targets, predictions): it is no_args();"),
    ],
)
def test_a_metric_that_returns_no_number_or_takes_no_arguments_is_refused(capsys, tmp_path, metric, said):
    """Through the eval program (programs/restore.py calls the preflight too), on an existing job
    dir, which is left as it was."""
    job = tmp_path / "job"
    job.mkdir()
    code, err = refused(
        capsys, eval_main.main, *S2S[:2], "--job-log-dir", job, "--mesh.ici-mesh-shape", "8", "1", "1",
        "--data.eval.batch-size", "8", "--data.train.batch-size", "8",
        "--data.eval.metrics", f"checks_metrics.{metric}",
    )  # fmt: skip
    line = one_error_line(err)
    assert code == 2 and f"error: data.eval.metrics: {said}" in line, line
    assert not any(job.iterdir())


def test_a_good_metric_is_called_once_and_its_scores_read():
    assert preflight.probe_metric("checks_metrics.first_letter") == {"first_letter": 1.0}
    assert preflight.probe_metric("user_metrics.same_first_character") == {"same_first_character": 1.0}


def test_a_metric_that_fails_mid_run_is_a_warning_and_nan_so_the_checkpoint_of_that_step_is_saved(monkeypatch):
    """A metric that passes the probe and fails on the eval's outputs (an empty one): the eval
    returns (the training loop saves the step's checkpoint after it), with that metric NaN, the
    others scored, and one warning line; it was an IndexError traceback ending the run."""
    monkeypatch.setattr(decoded_eval, "decoded_texts", lambda rt, state, pairs: ["", "def"])
    ids = np.array([[10, 11, 12], [13, 14, 15]], np.int32)
    batch = {"inputs": ids, "input_paddings": np.zeros(ids.shape), "targets": ids + 90,
             "target_paddings": np.zeros(ids.shape)}  # fmt: skip
    said = []
    rt = SimpleNamespace(tokenizer=ByteTokenizer())
    names = ["checks_metrics.first_letter", "exact_match", "checks_metrics.returns_text"]
    scores = decoded_eval.decoded_scores(rt, None, [batch], names, 6, None, said.append)
    assert np.isnan(scores["first_letter"]) and np.isnan(scores["returns_text"]) and scores["exact_match"] == 0.0
    assert len(said) == 2 and all(line.startswith("warning: the eval metric 'checks_metrics.") for line in said)
    assert "failed on the outputs of the eval at step 6: it raised IndexError: string index out of range" in said[0]
    assert "checks_metrics.py:" in said[0] and "its scores are NaN in this eval, and the run goes on." in said[0]
    assert "it returned str '0.5', not a number;" in said[1]


# -- validation images ----------------------------------------------------------------------


@pytest.fixture
def imagenet(tmp_path):
    """root/train/<wnid>/*.JPEG (8 a class) and root/val/<wnid>/*.JPEG (2 a class), 20..63 px."""
    rng = np.random.default_rng(0)
    for split, n in {"train": 8, "val": 2}.items():
        for c in CLASSES:
            (tmp_path / "imagenet" / split / c).mkdir(parents=True)
            for i in range(n):
                h, w = rng.integers(20, 64, size=2)
                image = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
                image.save(tmp_path / "imagenet" / split / c / f"{c}_{i}.JPEG", quality=90)
    return tmp_path / "imagenet"


def imagenet_args(root, job, *extra):
    return [
        "--exp", "imagenet_resnet50", "--job-log-dir", job, "--data.path", root, "--data.image-shape", "16", "16",
        "3", "--model.input-shape", "16", "16", "3", "--data.train.batch-size", "8", "--data.eval.batch-size", "8",
        *extra,
    ]  # fmt: skip


def test_a_zero_byte_validation_jpeg_is_refused_before_the_run(capsys, tmp_path, imagenet):
    """It was found at the first eval, losing that step's checkpoint; the whole eval split is
    decoded first when it is small (here its 6 images, in a few ms)."""
    bad = imagenet / "val" / CLASSES[1] / f"{CLASSES[1]}_1.JPEG"
    bad.write_bytes(b"")
    job = tmp_path / "job"
    code, err = refused(capsys, train.main, *imagenet_args(imagenet, job))
    assert code == 2 and one_error_line(err) == (
        f"error: data.path={str(imagenet)!r}: the eval image {str(bad)!r} is empty (0 bytes); remove or replace it."
    )
    assert not job.exists()


def test_a_truncated_validation_jpeg_is_refused_and_the_sample_rule(tmp_path, imagenet):
    """A file cut short passes a header read but not a decode. Above DECODE_ALL_UP_TO images,
    every size is checked and a sample spread evenly (first and last included) decoded."""
    val = sorted((imagenet / "val").glob("*/*.JPEG"))
    source = imagenet_source.EncodedImageFiles(val, np.zeros(len(val), np.int32))
    started = time.perf_counter()
    imagenet_source.check_decodable(source, 3, str(imagenet), "eval")
    print(f"decoding the {len(val)} tiny validation JPEGs took {1000 * (time.perf_counter() - started):.1f} ms")
    whole = val[-1].read_bytes()
    val[-1].write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ConfigError, match=r"the eval image '.*_1.JPEG' is not a readable image \(image file is trunc"):
        imagenet_source.check_decodable(source, 3, str(imagenet), "eval")
    val[-1].write_bytes(whole)
    val[1].write_bytes(b"not a jpeg")  # index 1 of 6: outside a sample of 3 (indices 0, 2 or 3, 5)
    imagenet_source.check_decodable(source, 3, str(imagenet), "eval", limit=3)  # not read: passes
    with pytest.raises(ConfigError, match=r"is not a readable image \(cannot identify image file"):
        imagenet_source.check_decodable(source, 3, str(imagenet), "eval", limit=6)
    val[1].write_bytes(b"")
    with pytest.raises(ConfigError, match=r"is empty \(0 bytes\)"):  # sizes: every file, sampled or not
        imagenet_source.check_decodable(source, 3, str(imagenet), "eval", limit=3)


class Records(imagenet_source.EncodedImageRecords):
    """ArrayRecord's (index, label, bytes) records, held in memory."""

    def __init__(self, encoded: list[bytes]):
        self.encoded = encoded

    def __len__(self) -> int:
        return len(self.encoded)

    def __getitem__(self, index: int):
        return index, np.int32(0), self.encoded[index]


def test_records_are_sampled_and_decoded_alike():
    """imagenet_array_record's records (prepare_images decoded each image once already): an empty
    record is found where it is decoded, all of a small split, a sample of a large one."""
    images = []
    for size in (20, 30, 40):
        out = io.BytesIO()
        Image.fromarray(np.zeros((size, size, 3), np.uint8)).save(out, format="JPEG")
        images.append(out.getvalue())
    source = Records([*images, b""])
    with pytest.raises(ConfigError, match=r"the eval image record 3 is not a readable image"):
        imagenet_source.check_decodable(source, 3, "/data", "eval")
    imagenet_source.check_decodable(source, 3, "/data", "eval", limit=1)  # record 0 alone


# -- classes and token ids against the model ---------------------------------------------------


@pytest.mark.parametrize(
    "classes, said",
    [
        ("1", "model.num_classes must be >= 2 (a softmax over one class gives every example probability 1: its "
              "loss is 0 or NaN, nothing is learnt), got 1. Set it to the data's number of classes."),
        ("2", "model.num_classes=2 but data.source='imagenet_folder' has 3 classes (labels 0..2, from its files): "
              "labels >= 2 would have no logit; set --model.num-classes 3."),
    ],
)  # fmt: skip
def test_a_classifier_with_fewer_classes_than_the_data_is_refused(capsys, tmp_path, imagenet, classes, said):
    """Labels without a logit gave a NaN loss (optax's integer cross-entropy reads outside the
    logits), and the error suggested lowering the learning rate."""
    job = tmp_path / "job"
    code, err = refused(capsys, train.main, *imagenet_args(imagenet, job, "--model.num-classes", classes))
    assert code == 2 and said in one_error_line(err), err
    assert not job.exists()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """An imported tiny Llama: vocabulary 400, a committed step-0 checkpoint, its tokenizer.json."""
    job = tmp_path_factory.mktemp("hf") / "base"
    assert import_hf.main([str(FIXTURES / "llama"), "--job-log-dir", str(job), "--data.seq-len", "16"]) == 0
    return job


def test_a_tokenizer_id_beyond_the_vocabulary_of_an_imported_model_is_refused(capsys, tmp_path, base):
    """A tokenizer.json whose vocabulary skips an id (400 tokens, the largest id 420) passed the
    count check; 'ful' (id 420) had no embedding row, and the eval loss was NaN."""
    spec = json.loads((base / "tokenizer" / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["ful"] = 420
    (tmp_path / "gap.json").write_text(json.dumps(spec))
    job = tmp_path / "job"
    code, err = refused(
        capsys, train.main, "--exp", base / "config.json", "--job-log-dir", job, "--data.tokenizer.path",
        tmp_path / "gap.json", "--data.train.batch-size", "8", "--data.eval.batch-size", "8",
    )  # fmt: skip
    assert code == 2 and one_error_line(err) == (
        f"error: the tokenizer {str(tmp_path / 'gap.json')!r} gives token ids up to 420 ('ful'), but "
        "model.vocab_size=400: ids >= 400 have no embedding row, and their loss is NaN; set model.vocab_size >= 421 "
        "(--model.vocab-size), or use the tokenizer the model was trained with."
    )
    assert not job.exists()


def test_a_sentencepiece_vocabulary_larger_than_the_model_is_refused_before_it_is_trained(capsys, tmp_path):
    """It was trained into the job dir, then refused: the job dir was left holding tokenizer/."""
    from tiny import tiny_args

    job = tmp_path / "job"
    code, err = refused(
        capsys, train.main, *tiny_args(job, "--data.tokenizer", "sentencepiece", "--data.tokenizer.vocab-size", "512",
                                       "--model.vocab-size", "300", num_devices=8),
    )  # fmt: skip
    assert code == 2 and one_error_line(err) == (
        "error: data.tokenizer.vocab_size=512 but model.vocab_size=300: the tokenizer trained for this run would give "
        "ids without an embedding row; set model.vocab_size >= 512 or a smaller data.tokenizer.vocab_size."
    )
    assert not job.exists()


# -- LoRA's base ---------------------------------------------------------------------------------


def lora_args(base, job, *extra):
    return [
        "--exp", base / "config.json", "--job-log-dir", job, "--lora.targets", r"stack\.layers\.attention\.w_[qv]",
        "--data.train.batch-size", "8", "--data.eval.batch-size", "8", *extra,
    ]  # fmt: skip


def test_a_relative_lora_base_is_read_against_the_working_directory(capsys, monkeypatch, tmp_path, base):
    """docs/fine_tune.md's `--lora.base-job-dir runs/llama`: it met orbax's raw 'Checkpoint path
    should be absolute' after `Starting ...`, and an empty job dir was left."""
    monkeypatch.chdir(base.parent)
    job = tmp_path / "job"
    exp = ExperimentConfig.from_dict(json.loads((base / "config.json").read_text()))
    lora = exp.lora.replace(targets=(r"stack\.layers\.attention\.w_[qv]",), base_job_dir="base")
    preflight.check(exp.replace(lora=lora), job)  # found, and its model is this one
    code, err = refused(capsys, train.main, *lora_args(base, job, "--lora.base-job-dir", "runs/base"))
    assert code == 2 and one_error_line(err) == (
        f"error: lora.base_job_dir={str(base.parent / 'runs' / 'base')!r} does not exist; name the job dir of the "
        "model to adapt (one import_hf or train wrote; a relative path is read against the working directory)."
    )
    assert not job.exists()


@pytest.mark.parametrize(
    "change, said",
    [
        (("--lora.base-step", "5"), "lora.base_step=5: {base}/checkpoints has no checkpoint of that step (it has [0]); "
                                    "pass one of those, or -1 for the newest."),
        (("--model.num-layers", "1"), "lora.base_job_dir='{base}' holds another model than this run's (9 parameters "
                                      "differ); run with the base's experiment (--exp BASE/config.json):"),
        ("no checkpoint", "lora.base_job_dir='{empty}' has no committed checkpoint to adapt."),
        ("no config", "lora.base_job_dir='{bare}' holds no config.json; name a pax_eqx job dir (one import_hf or "
                      "train wrote)."),
    ],
)  # fmt: skip
def test_a_lora_base_that_cannot_be_adapted_is_refused_before_the_job_dir_is_made(capsys, tmp_path, base, change, said):
    empty, bare = tmp_path / "empty", tmp_path / "bare"
    (empty / "checkpoints").mkdir(parents=True)
    shutil.copy(base / "config.json", empty / "config.json")
    bare.mkdir()
    at = {"no checkpoint": empty, "no config": bare}.get(change, base)
    extra = change if isinstance(change, tuple) else ()
    job = tmp_path / "job"
    code, err = refused(capsys, train.main, *lora_args(base, job, "--lora.base-job-dir", at, *extra))
    assert code == 2, err
    assert err.startswith("error: " + said.format(base=base, empty=empty, bare=bare)), err
    assert "Traceback" not in err
    assert not job.exists()


def test_a_start_that_fails_after_making_empty_folders_leaves_no_job_dir(tmp_path):
    """A failure the checks cannot see (a base checkpoint unreadable when read) came after the
    run had made DIR/checkpoints/: the new job dir was left, empty but for that folder."""
    job = tmp_path / "job"
    (job / "checkpoints").mkdir(parents=True)
    train._remove_if_empty(job)
    assert not job.exists()
    (job / "checkpoints").mkdir(parents=True)
    (job / "train.log").write_text("a line\n")
    train._remove_if_empty(job)  # something was written: all of it stays
    assert (job / "checkpoints").is_dir() and (job / "train.log").is_file()
