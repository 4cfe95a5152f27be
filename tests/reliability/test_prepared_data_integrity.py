"""Prepared data is verified, not trusted (issue 51, "Reliability IV"):

- training opens a prepared directory, and every resume opens it again, checking each shard's
  size and fingerprint against the manifest: a shard replaced by another preparation's shard
  with the same record count (it trained and resumed silently), two shards swapped (accepted),
  a shard cut short (a RuntimeError traceback, for image shards) are each one `error:` line
  naming the shard, expected vs found, and the fix; exit 2, the job dir untouched;
- a rerun after a kill hashes its inputs again and redoes a complete shard whose input was
  edited (it kept the stale shard and recorded the edited file's hash), and so does a rerun of a
  finished preparation: the shards equal a clean preparation of the edited corpus.

Tiny corpora, byte tokens, the DirectRunner. Each fault of a text directory is checked where the
directory is opened (`PreparedCorpus`, in this process, on a copy of one shared preparation);
the real command line proves the wiring: one 2-step training run (the reliability harness's
compilation cache), then a start refused on swapped shards and a resume refused on a replaced
one, and a cut image shard refused at a training start. The kill is a real prepare_data process;
the reruns after it run `pipeline.prepare` in this process (the command line's rerun is
test_prepare_data_errors.py's Ctrl-C test).
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
from test_prepare_data_errors import REPO, corpus  # noqa: E402
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


FIX = "copy the whole prepared directory again, or prepare it again (python -m pax_eqx.prepare_data"


@pytest.fixture(scope="module")
def two_preparations(tmp_path_factory) -> tuple[Path, Path]:
    """Two preparations of corpora with the same documents per file (so the same shard record
    counts) and other text: a shard of one copied into the other passed the record-count check.
    Tests copy them (shutil.copytree) before harming them."""
    root = tmp_path_factory.mktemp("prepared")
    a = prepared_in_process(corpus(root / "a"), root / "prepared_a", 2)
    b = prepared_in_process(corpus(root / "b", tag="page"), root / "prepared_b", 2)
    counts = [[s["records"] for s in json.loads((d / "manifest.json").read_text())["shards"]] for d in (a, b)]
    assert counts[0] == counts[1], counts
    return a, b


def _harm(a: Path, b: Path, fault: str) -> None:
    """Another preparation's shard, same record count; the two shards swapped; one cut short."""
    if fault == "replaced":
        shutil.copyfile(b / SHARD.format(0), a / SHARD.format(0))
    elif fault == "swapped":
        first, second = ((a / SHARD.format(i)).read_bytes() for i in range(2))
        (a / SHARD.format(0)).write_bytes(second)
        (a / SHARD.format(1)).write_bytes(first)
    elif fault == "cut":
        (a / SHARD.format(0)).write_bytes((a / SHARD.format(0)).read_bytes()[:70_000])


def _expected(a: Path, b: Path, fault: str) -> str:
    """The refusal's line (after `error: `), as a training start or a resume prints it."""
    manifest_a, manifest_b = (json.loads((d / "manifest.json").read_text()) for d in (a, b))
    head = f"data.path='{a}': shard '{SHARD.format(0)}' "
    if fault == "replaced":
        expected, found = manifest_a["shards"][0]["fingerprint"], manifest_b["shards"][0]["fingerprint"]
        return (
            f"{head}is not the shard its manifest lists: fingerprint expected {expected[:16]}..., found "
            f"{found[:16]}...; it was replaced or overwritten (another preparation's shard?); {FIX} into a new "
            "--output-dir)."
        )
    if fault == "swapped":
        expected, found = manifest_a["shards"][0]["fingerprint"], manifest_a["shards"][1]["fingerprint"]
        return (
            f"{head}is not the shard its manifest lists: fingerprint expected {expected[:16]}..., found "
            f"{found[:16]}...; it holds the bytes of shard '{SHARD.format(1)}' (two shards swapped, or one copied "
            f"over another); {FIX} into a new --output-dir)."
        )
    size = manifest_a["shards"][0]["bytes"]
    return (
        f"{head}cannot be read as prepared: it is 70,000 bytes, its manifest lists {size:,} (it was cut short); "
        f"{FIX} into a new --output-dir)."
    )


@pytest.mark.parametrize("fault", ["replaced", "swapped", "cut"])
def test_a_replaced_swapped_or_cut_shard_is_refused_when_the_directory_is_opened(two_preparations, tmp_path, fault):
    """Where a training start and every resume open data.path (the check of --data.source
    array_record: array_record_source.check_config -> PreparedCorpus)."""
    from pax_eqx.data.array_record_source import PreparedCorpus, PreparedCorpusError

    a = shutil.copytree(two_preparations[0], tmp_path / "prepared_a")
    PreparedCorpus(str(a), "data.path")  # the untouched copy opens
    _harm(a, two_preparations[1], fault)
    with pytest.raises(PreparedCorpusError) as refused:
        PreparedCorpus(str(a), "data.path")
    assert str(refused.value) == _expected(a, two_preparations[1], fault)


def test_the_train_command_refuses_a_harmed_directory_at_start_and_at_resume(two_preparations, tmp_path):
    """Through python -m pax_eqx.train: swapped shards refuse a first start (no job dir made); a
    2-step run, then another preparation's shard refuses its resume (the job dir untouched)."""
    a = shutil.copytree(two_preparations[0], tmp_path / "prepared_a")
    original = {i: (a / SHARD.format(i)).read_bytes() for i in range(2)}

    _harm(a, two_preparations[1], "swapped")
    fresh = tmp_path / "fresh_job"
    assert refused(train(a, fresh, 2)) == f"error: {_expected(a, two_preparations[1], 'swapped')}"
    assert not fresh.exists()
    for i, data in original.items():
        (a / SHARD.format(i)).write_bytes(data)

    job = tmp_path / "job"
    first = train(a, job, 2)
    assert first.returncode == 0, first.stderr[-3000:]
    before = snapshot(job)
    _harm(a, two_preparations[1], "replaced")
    assert refused(train(a, job, 4)) == f"error: {_expected(a, two_preparations[1], 'replaced')}"
    assert snapshot(job) == before


def test_a_cut_image_shard_is_refused_at_training_start(tmp_path):
    """It was grain's `RuntimeError: ArrayRecord file should be at least 64KB big` traceback."""
    from PIL import Image

    from pax_eqx.data.image_records import write_image_records

    images = tmp_path / "images"
    for split, count in (("train", 4), ("val", 1)):
        for folder in ("n01", "n02"):
            (images / split / folder).mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (8, 8), (40 * i, 80, 120)).save(images / split / folder / f"{i}.JPEG")
    out = tmp_path / "images_ar"
    write_image_records(str(images), str(out), num_shards=2, val_num_shards=1)  # prepare_images' work
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


def test_a_rerun_redoes_the_complete_shards_whose_input_was_edited(tmp_path, capsys):
    """Killed (-9, the whole process group) after a shard completed; a record of a file with
    documents in it edited; the rerun redoes that shard, and its shards and source hashes are a
    clean preparation's of the edited corpus. Edited again after it finished, the rerun redoes
    the shards again instead of answering 'nothing to do'."""
    source = corpus(tmp_path / "in")
    out = tmp_path / "out"
    flags = ["--input", str(source), "--output-dir", str(out), "--num-shards", "4", "--num-workers", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pax_eqx.prepare_data", *flags], cwd=REPO, env=prepare_environment(shard_delay_s=2),
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
    capsys.readouterr()
    prepared_in_process(source, out, 4)  # the rerun
    rerun = capsys.readouterr().err
    assert "complete shard(s) redone, their input files changed since they were written" in rerun, rerun
    reference = prepared_in_process(source, tmp_path / "reference", 4)
    assert _shard_bytes(out) == _shard_bytes(reference)
    sources = {Path(s["path"]).name: s["sha256"] for s in json.loads((out / "manifest.json").read_text())["sources"]}
    assert sources["a.jsonl"] == hashlib.sha256((source / "a.jsonl").read_bytes()).hexdigest()

    _edit(source / "b.jsonl", '"b doc 7 ', '"b doc seven, edited after the preparation finished ')
    prepared_in_process(source, out, 4)
    again = capsys.readouterr().err
    assert f"1 input file(s) changed since {out} was prepared (first '{source / 'b.jsonl'}')" in again, again
    assert "nothing to do" not in again
    reference = prepared_in_process(source, tmp_path / "reference_2", 4)
    assert _shard_bytes(out) == _shard_bytes(reference)
    assert json.loads((out / "manifest.json").read_text()) == {
        **json.loads((reference / "manifest.json").read_text()),
        "config": json.loads((out / "manifest.json").read_text())["config"],
    }
