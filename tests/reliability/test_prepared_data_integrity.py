"""Prepared data is verified, not trusted (issue 51, "Reliability IV"), through the real command
lines:

- training opens a prepared directory, and every resume opens it again, checking each shard's
  size and fingerprint against the manifest: a shard replaced by another preparation's shard
  with the same record count (it trained and resumed silently), two shards swapped (accepted),
  a shard cut short (a RuntimeError traceback, for image shards) are each one `error:` line
  naming the shard, expected vs found, and the fix; exit 2, the job dir untouched;
- a rerun after a kill hashes its inputs again and redoes a complete shard whose input was
  edited (it kept the stale shard and recorded the edited file's hash), and so does a rerun of a
  finished preparation: the shards equal a clean preparation of the edited corpus.

Tiny corpora, byte tokens, the DirectRunner; one 2-step training run (the reliability harness's
compilation cache) gives the resume its checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("apache_beam", reason="the [prepare] extra (.ci/run installs it)")

sys.path.insert(0, str(Path(__file__).parent))

from reliability_harness import RUN_TIMEOUT_S, assert_no_traceback, environment, snapshot  # noqa: E402
from test_prepare_data_errors import REPO, corpus, prepare  # noqa: E402
from test_prepare_data_errors import environment as prepare_environment  # noqa: E402

TRAIN = [
    "--exp", "shakespeare_char", "--model.num-layers", "1", "--model.model-dims", "32", "--model.hidden-dims",
    "64", "--model.num-heads", "2", "--mesh.ici-mesh-shape", "1", "1", "1",
    "--data.seq-len", "32", "--data.train.batch-size", "4", "--data.eval.batch-size", "4",
    "--data.eval.eval-loop-num-batches", "1", "--data.eval.no-reset-for-eval", "--data.eval.repeat",
    "--train.summary-interval-steps", "1", "--train.eval-interval-steps", "100", "--train.steps-per-loop", "1",
    "--train.no-sample-at-end", "--checkpoint.every-n-steps", "2",
]  # fmt: skip
SHARD = "shard-{:05d}-of-00002.array_record"


def prepared_in_process(source: Path, out: Path, num_shards: int) -> Path:
    from pax_eqx.data.prepare import pipeline
    from pax_eqx.data.prepare.config import PrepareConfig

    pipeline.prepare(PrepareConfig(input=str(source), output_dir=str(out), num_shards=num_shards, num_workers=1))
    return out


def train(corpus_dir: Path, job: Path, steps: int) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pax_eqx.train", *TRAIN, "--train.num-steps", str(steps), "--data.source",
           "array_record", "--data.path", str(corpus_dir), "--job-log-dir", str(job)]  # fmt: skip
    return subprocess.run(cmd, env=environment(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=REPO)


def refused(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    assert_no_traceback(done.stderr)
    return done.stderr.strip().splitlines()[-1]


def test_a_replaced_swapped_or_cut_shard_is_refused_at_start_and_at_resume(tmp_path):
    """Two preparations of corpora with the same documents per file (so the same shard record
    counts) and other text: a shard of one copied into the other passed the record-count check."""
    a = prepared_in_process(corpus(tmp_path / "a"), tmp_path / "prepared_a", 2)
    b = prepared_in_process(corpus(tmp_path / "b", tag="page"), tmp_path / "prepared_b", 2)
    manifest_a, manifest_b = (json.loads((d / "manifest.json").read_text()) for d in (a, b))
    assert [s["records"] for s in manifest_a["shards"]] == [s["records"] for s in manifest_b["shards"]]
    original = {i: (a / SHARD.format(i)).read_bytes() for i in range(2)}
    fix = "copy the whole prepared directory again, or prepare it again (python -m pax_eqx.prepare_data"

    job = tmp_path / "job"
    first = train(a, job, 2)
    assert first.returncode == 0, first.stderr[-3000:]
    before = snapshot(job)

    shutil.copyfile(b / SHARD.format(0), a / SHARD.format(0))  # another preparation's shard, same record count
    line = refused(train(a, job, 4))  # the resume
    expected = manifest_a["shards"][0]["fingerprint"]
    found = manifest_b["shards"][0]["fingerprint"]
    assert line == (
        f"error: data.path='{a}': shard '{SHARD.format(0)}' is not the shard its manifest lists: fingerprint expected "
        f"{expected[:16]}..., found {found[:16]}...; it was replaced or overwritten (another preparation's shard?); "
        f"{fix} into a new --output-dir)."
    ), line
    assert snapshot(job) == before

    (a / SHARD.format(0)).write_bytes(original[1])  # the two shards swapped
    (a / SHARD.format(1)).write_bytes(original[0])
    fresh = tmp_path / "fresh_job"
    line = refused(train(a, fresh, 2))  # a first start
    assert f"shard '{SHARD.format(0)}' is not the shard its manifest lists" in line, line
    assert f"it holds the bytes of shard '{SHARD.format(1)}' (two shards swapped, or one copied over another)" in line
    assert not fresh.exists()

    (a / SHARD.format(0)).write_bytes(original[0][:70_000])  # cut short
    (a / SHARD.format(1)).write_bytes(original[1])
    line = refused(train(a, job, 4))
    size = manifest_a["shards"][0]["bytes"]
    assert f"shard '{SHARD.format(0)}' cannot be read as prepared: it is 70,000 bytes, its manifest lists {size:,} " \
        "(it was cut short)" in line, line  # fmt: skip
    assert snapshot(job) == before


def test_a_cut_image_shard_is_refused_at_training_start(tmp_path):
    """It was grain's `RuntimeError: ArrayRecord file should be at least 64KB big` traceback."""
    from PIL import Image

    images = tmp_path / "images"
    for split, count in (("train", 4), ("val", 1)):
        for folder in ("n01", "n02"):
            (images / split / folder).mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (8, 8), (40 * i, 80, 120)).save(images / split / folder / f"{i}.JPEG")
    out = tmp_path / "images_ar"
    done = prepare("--input", str(images), "--output", str(out), "--num-shards", "2", "--val-num-shards", "1",
                   program="pax_eqx.prepare_images")  # fmt: skip
    assert done.returncode == 0, done.stderr
    shard = out / "train" / "shard-00001-of-00002.array_record"
    listed = json.loads((out / "train" / "images.json").read_text())["shards"][1]["bytes"]
    with open(shard, "r+b") as f:
        f.truncate(1000)
    job = tmp_path / "job"
    cmd = [sys.executable, "-m", "pax_eqx.train", "--exp", "imagenet_resnet50", "--mesh.ici-mesh-shape", "1", "1", "1",
           "--data.source", "imagenet_array_record", "--data.path", str(out), "--job-log-dir", str(job)]  # fmt: skip
    line = refused(subprocess.run(cmd, env=environment(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S))
    assert line == (
        f"error: data.path='{out / 'train'}': shard '{shard.name}' cannot be read as prepared: it is 1,000 bytes, its "
        f"manifest lists {listed:,} (it was cut short); copy the whole directory again, or write it again with "
        "python -m pax_eqx.prepare_images."
    ), line
    assert not job.exists()


def _shard_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("shard-*.array_record"))}


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_a_rerun_redoes_the_complete_shards_whose_input_was_edited(tmp_path):
    """Killed (-9, the whole process group) after a shard completed; a record of a file with
    documents in it edited; the rerun redoes that shard, and its shards and source hashes are a
    clean preparation's of the edited corpus. Edited again after it finished, the rerun redoes
    the shards again instead of answering 'nothing to do'."""
    source = corpus(tmp_path / "in")
    out = tmp_path / "out"
    flags = ["--input", str(source), "--output-dir", str(out), "--num-shards", "4", "--num-workers", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pax_eqx.prepare_data", *flags], cwd=REPO, env=prepare_environment(shard_delay_s=3),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not list(out.glob("shard-*.array_record")):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "timed out waiting for a complete shard"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    complete = sorted(p.name for p in out.glob("shard-*.array_record"))
    assert 1 <= len(complete) < 4 and not (out / "manifest.json").exists()
    stats = json.loads((out / f"{complete[0]}.stats.json").read_text())
    assert "0" in stats["inputs"], stats  # a.jsonl (input 0) has documents in the complete shard

    _edit(source / "a.jsonl", '"a doc 5 ', '"a doc five (edited) ')
    rerun = prepare(*flags)
    assert rerun.returncode == 0, rerun.stderr
    assert "complete shard(s) redone, their input files changed since they were written" in rerun.stderr
    reference = prepared_in_process(source, tmp_path / "reference", 4)
    assert _shard_bytes(out) == _shard_bytes(reference)
    sources = {Path(s["path"]).name: s["sha256"] for s in json.loads((out / "manifest.json").read_text())["sources"]}
    assert sources["a.jsonl"] == hashlib.sha256((source / "a.jsonl").read_bytes()).hexdigest()

    _edit(source / "b.jsonl", '"b doc 7 ', '"b doc seven, edited after the preparation finished ')
    again = prepare(*flags)
    assert again.returncode == 0, again.stderr
    assert f"1 input file(s) changed since {out} was prepared (first '{source / 'b.jsonl'}')" in again.stderr
    assert "nothing to do" not in again.stderr
    reference = prepared_in_process(source, tmp_path / "reference_2", 4)
    assert _shard_bytes(out) == _shard_bytes(reference)
    assert json.loads((out / "manifest.json").read_text()) == {
        **json.loads((reference / "manifest.json").read_text()),
        "config": json.loads((out / "manifest.json").read_text())["config"],
    }
