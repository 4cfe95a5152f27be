"""Sources are choices that configure themselves (issue 47):

- a prepared directory configures the experiment: `--data.source array_record --data.path DIR`
  alone trains on a corpus prepared from text no other test uses (random words, lower case, a
  40-piece SentencePiece model); the tokenizer comes from DIR's manifest, the model's vocabulary
  follows it, the default prompt it cannot encode becomes the corpus's first words, and a flag
  that contradicts the manifest is refused naming both values;
- a new source is one file (counting_source.py), chosen with `--data.source counting`.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from pax_eqx.command_line import cli
from pax_eqx.config import ConfigError
from pax_eqx.data import SentencePieceConfig, build_tokenizer

ROOT = Path(__file__).parents[2]
WORDS = "amber kettles drift under quiet lanterns while seven herons count slow river stones".split()
TINY = ["--model.num-layers", "1", "--model.model-dims", "32", "--model.hidden-dims", "64", "--model.num-heads", "2",
        "--train.num-steps", "2", "--train.eval-interval-steps", "2", "--train.steps-per-loop", "1",
        "--train.no-sample-at-end"]  # fmt: skip


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """400 lines of random lower-case words prepared into 2 shards with a 40-piece SentencePiece."""
    pytest.importorskip("apache_beam", reason="the [prepare] extra (.ci/run installs it)")
    from pax_eqx.data.prepare import pipeline
    from pax_eqx.data.prepare.config import PrepareConfig

    root = tmp_path_factory.mktemp("unseen")
    rng = random.Random(47)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))) + "." for _ in range(400)]
    (root / "unseen.jsonl").write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    out = root / "prepared"
    cfg = PrepareConfig(input=str(root / "unseen.jsonl"), output_dir=str(out), num_shards=2, num_workers=1,
                        tokenizer=SentencePieceConfig(vocab_size=40))  # fmt: skip
    pipeline.prepare(cfg)
    return out


def _parse(*args: str):
    return cli.parse(list(args), "train", "", job_dir_required=False, saved_experiment=True)[0]


def test_the_manifest_gives_the_tokenizer_the_vocabulary_and_a_prompt(prepared):
    exp = _parse("--data.source", "array_record", "--data.path", str(prepared))
    assert exp.data.tokenizer == SentencePieceConfig(vocab_size=40)
    assert exp.model.vocab_size == 40  # shakespeare_char's 260 was sized for bytes
    tokenizer = build_tokenizer(exp.data)
    assert exp.decode.prompt != "ROMEO:" and tokenizer.unknown_characters("ROMEO:")
    assert exp.decode.prompt and not tokenizer.unknown_characters(exp.decode.prompt)
    assert set(exp.decode.prompt.replace(".", "").split()) <= set(WORDS) | {""}
    exp.validate()
    # What the user sets is kept: a prompt, a model vocabulary.
    given = _parse("--data.source", "array_record", "--data.path", str(prepared), "--decode.prompt", "herons",
                   "--model.vocab-size", "64")  # fmt: skip
    assert (given.decode.prompt, given.model.vocab_size) == ("herons", 64)


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--data.tokenizer.vocab-size", "90"],
            "data.tokenizer.vocab_size=90 but data.path=.* SentencePiece model of 40",
        ),
        (["--data.tokenizer", "byte"], "data.tokenizer is byte but data.path=.* was tokenized with sentencepiece"),
    ],
)
def test_a_flag_that_contradicts_the_manifest_is_refused_naming_both(prepared, flags, message):
    exp = _parse("--data.source", "array_record", "--data.path", str(prepared), "--data.tokenizer", "sentencepiece",
                 *flags)  # fmt: skip
    with pytest.raises(ConfigError, match=message):
        exp.validate()


def _train(job: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "data")])}  # fmt: skip
    cmd = [sys.executable, "-m", "pax_eqx.train", "--job-log-dir", str(job), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_two_data_flags_alone_train_on_a_prepared_directory(prepared, tmp_path):
    run = _train(tmp_path / "job", "--data.source", "array_record", "--data.path", str(prepared), *TINY)
    assert run.returncode == 0, run.stderr[-2000:]
    saved = json.loads((tmp_path / "job" / "config.json").read_text())
    assert saved["data"]["source"] == {"kind": "array_record", "path": str(prepared), "eval_path": "",
                                       "eval_fraction": 0.1, "mixture_weights": []}  # fmt: skip
    assert saved["data"]["tokenizer"]["vocab_size"] == saved["model"]["vocab_size"] == 40


def test_a_new_source_is_one_file(tmp_path):
    run = _train(tmp_path / "job", "--exp", "counting_source.tiny", "--data.source.stride", "3", *TINY)
    assert run.returncode == 0, run.stderr[-2000:]
    saved = json.loads((tmp_path / "job" / "config.json").read_text())["data"]["source"]
    assert saved == {"kind": "counting", "stride": 3, "num_synthetic_examples": 16}


def test_an_image_corpus_gives_the_classifier_its_classes(tmp_path):
    """imagenet_array_record's manifest (and imagenet_folder's class folders) set num_classes."""
    from PIL import Image

    from pax_eqx.data.image_records import write_image_records

    root = tmp_path / "images"
    for split in ("train", "val"):
        for c in ("n0001", "n0002"):
            (root / split / c).mkdir(parents=True)
            Image.new("RGB", (20, 24), (40, 80, 120)).save(root / split / c / "a.JPEG")
    write_image_records(str(root), str(tmp_path / "ar"), num_shards=1, val_num_shards=1)
    for source, path in (("imagenet_array_record", tmp_path / "ar"), ("imagenet_folder", root)):
        exp = _parse("--exp", "imagenet_resnet50", "--data.source", source, "--data.path", str(path))
        assert exp.model.num_classes == 2, source  # imagenet_resnet50's own: 1000
        exp.validate(data_files=True)
    kept = _parse("--exp", "imagenet_resnet50", "--data.source", "imagenet_array_record", "--data.path",
                  str(tmp_path / "ar"), "--model.num-classes", "5")  # fmt: skip
    assert kept.model.num_classes == 5
