"""The C4 experiments and gpt3_xl on a prepared corpus: the committed C4-shaped fixture prepared
with SentencePiece (the validation file with the training files' model), then c4_spmd_adam,
shrunk, trains and evaluates through `python -m pax_eqx.train`; gpt3_xl packs it into its rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("apache_beam", reason="the [prepare] extra (.ci/run installs it)")

from pax_eqx.config import ConfigError  # noqa: E402
from pax_eqx.data import build_input, build_tokenizer  # noqa: E402
from pax_eqx.data.prepare.config import PrepareConfig  # noqa: E402
from pax_eqx.data.tokenizers import SentencePieceConfig  # noqa: E402

ROOT = Path(__file__).parents[2]
C4_SMALL = ROOT / "tests" / "fixtures" / "c4_small"
TINY_MODEL = [
    "--model.num-layers", "1", "--model.model-dims", "32", "--model.hidden-dims", "64", "--model.num-heads", "2",
    "--model.vocab-size", "512", "--model.max-seq-len", "64", "--data.seq-len", "64",
    "--mesh.ici-mesh-shape", "1", "1", "1",
]  # fmt: skip


@pytest.fixture(scope="module")
def c4_prepared(tmp_path_factory) -> tuple[Path, Path]:
    from pax_eqx.data.prepare import pipeline

    root = tmp_path_factory.mktemp("c4")
    spm = SentencePieceConfig(vocab_size=400)
    train = PrepareConfig(input=f"{C4_SMALL}/c4-train.*.json.gz", output_dir=str(root / "train"), tokenizer=spm)
    pipeline.prepare(train.replace(num_shards=4, num_workers=1))
    model = spm.replace(model_path=str(root / "train" / "tokenizer" / "spm.model"))
    validation = PrepareConfig(
        input=str(C4_SMALL / "c4-validation.00000-of-00001.json.gz"),
        output_dir=str(root / "validation"),
        tokenizer=model,
    )
    pipeline.prepare(validation.replace(num_shards=1, num_workers=1))
    return root / "train", root / "validation"


def test_c4_trains_and_evaluates_on_the_prepared_fixture_through_the_cli(c4_prepared, tmp_path):
    train, validation = c4_prepared
    job = tmp_path / "job"
    cmd = [
        sys.executable, "-m", "pax_eqx.train", "--exp", "c4_spmd_adam", "--job-log-dir", str(job),
        "--data.source", "array_record", "--data.path", str(train), "--data.eval-path", str(validation),
        "--data.tokenizer.vocab-size", "400", *TINY_MODEL, "--data.train.batch-size", "2",
        "--data.eval.batch-size", "8", "--train.num-steps", "2", "--train.eval-interval-steps", "2",
    ]  # fmt: skip
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # The eval read the 40 validation pages, one unpacked row each, in 5 batches of 8.
    assert "all 5 batches" in proc.stdout, proc.stdout
    records = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    assert any("bits_per_byte" in json.dumps(r) for r in records)


def test_gpt3_xl_packs_a_prepared_corpus_into_its_rows(c4_prepared):
    from pax_eqx.command_line import cli

    train, _ = c4_prepared
    args = ["--exp", "gpt3_xl", "--data.source", "array_record", "--data.path", str(train)]
    args += ["--data.tokenizer", "sentencepiece", "--data.tokenizer.vocab-size", "400"]
    args += ["--data.train.num-infeed-hosts", "1", "--data.train.infeed-host-index", "0"]
    exp, _, _ = cli.parse(args, "t", "", job_dir_required=False)
    exp.data.validate()
    tok = build_tokenizer(exp.data)
    batch = build_input(exp.data, "train", tok).get_next()
    assert batch["ids"].shape == (16, 2048) and batch["segment_ids"].max() > 1  # several pages a row
    assert np.all(batch["weights"] > 0)  # packed full: a document cut at a row end goes on in the next
    assert tok.vocab_size == 400 <= exp.model.vocab_size
    # A vocabulary size other than the prepared model's is one line naming that size.
    other = exp.data.replace(tokenizer=exp.data.tokenizer.replace(vocab_size=300))
    wrong_size = (
        r"data.tokenizer.vocab_size=300 but data.path=.* was tokenized with a SentencePiece model of 400 pieces"
    )
    with pytest.raises(
        ConfigError, match=wrong_size + r"; drop the flag .*, or set --data.tokenizer.vocab-size 400\.$"
    ) as e:
        other.validate()
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=wrong_size + r"; .*set --data.tokenizer.vocab-size 400\.$") as e:
        build_tokenizer(other)
    assert "\n" not in str(e.value)
