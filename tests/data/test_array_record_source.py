"""--data.source array_record: a prepared corpus read with grain across hosts, resumed exactly,
evaluated as Pax's unpacked eval split, and checked against the experiment's tokenizer and
sequence length (one-line errors; the layout is the manifest's, with no flag to contradict it).
The corpora are the committed C4-shaped fixture, prepared in this process with the DirectRunner."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("apache_beam", reason="the [prepare] extra (.ci/run installs it)")

from pax_eqx.config import ConfigError, MissingFileError  # noqa: E402
from pax_eqx.data import ArrayRecordSource, DataConfig, InputConfig, build_input, build_tokenizer  # noqa: E402
from pax_eqx.data.prepare.config import PrepareConfig  # noqa: E402
from pax_eqx.data.tokenizers import ByteTokenizer, SentencePieceConfig  # noqa: E402
from pax_eqx.experiment import ExperimentConfig  # noqa: E402

HERE = Path(__file__).parent
C4_SMALL = HERE.parent / "fixtures" / "c4_small"
TRAIN = f"{C4_SMALL}/c4-train.*.json.gz"
VALIDATION = str(C4_SMALL / "c4-validation.00000-of-00001.json.gz")
ONE_HOST = {"num_infeed_hosts": 1, "infeed_host_index": 0}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict[str, Path]:
    """The fixture prepared three ways: documents, rows of 32 (train files), documents (validation)."""
    from pax_eqx.data.prepare import pipeline

    root = tmp_path_factory.mktemp("prepared")
    runs = {
        "documents": PrepareConfig(input=TRAIN, num_shards=4),
        "rows": PrepareConfig(input=TRAIN, num_shards=4, layout="rows", seq_len=32),
        "validation": PrepareConfig(input=VALIDATION, num_shards=2),
    }
    for name, cfg in runs.items():
        pipeline.prepare(cfg.replace(output_dir=str(root / name), num_workers=1))
    return {name: root / name for name in runs}


def pages(path: str | Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def data_config(path: Path, eval_path: str = "", **changes) -> DataConfig:
    """`changes`: fields of the DataConfig (seq_len, tokenizer)."""
    train = InputConfig(batch_size=4, **ONE_HOST)
    ev = InputConfig(batch_size=4, shuffle=False, repeat=False, reset_for_eval=True, **ONE_HOST)
    source = ArrayRecordSource(path=str(path), eval_path=eval_path)
    base = DataConfig(source=source, seq_len=32, train=train, eval=ev)
    return base.replace(**changes)


def test_two_hosts_split_an_epoch_of_rows_exactly(prepared):
    """Host i of 2 reads positions i::2 of one global shuffle: disjoint, together every training row."""
    from array_record.python.array_record_module import ArrayRecordReader

    data = data_config(prepared["rows"])
    data.validate()
    tok = build_tokenizer(data)
    all_rows = set()
    for path in sorted(prepared["rows"].glob("shard-*.array_record")):
        reader = ArrayRecordReader(str(path))
        all_rows |= {np.frombuffer(r, "<i4")[:32].tobytes() for r in reader.read_all()}
    total = json.loads((prepared["rows"] / "manifest.json").read_text())["num_records"]
    held_out = len(range(9, total, 10))  # eval_fraction 0.1: every 10th record
    seen = []
    for host in range(2):
        cfg = data.replace(train=InputConfig(batch_size=1, num_infeed_hosts=2, infeed_host_index=host))
        inp = build_input(cfg, "train", tok)
        n = len(range(host, total - held_out, 2))
        seen.append([inp.get_next()["ids"][0].astype("<i4").tobytes() for _ in range(n)])
    assert not set(seen[0]) & set(seen[1])
    assert len(set(seen[0]) | set(seen[1])) == total - held_out == len(seen[0]) + len(seen[1])
    assert set(seen[0]) | set(seen[1]) <= all_rows


def test_documents_are_packed_and_decode_to_the_corpus(prepared):
    data = data_config(prepared["documents"], eval_path=str(prepared["validation"]))
    tok = build_tokenizer(data)
    assert isinstance(tok, ByteTokenizer)
    corpus = [p for f in sorted(C4_SMALL.glob("c4-train.*.json.gz")) for p in pages(f)]
    batch = build_input(data, "train", tok).get_next()
    assert batch["ids"].shape == (4, 32) and batch["weights"].dtype == np.float32
    ids, seg = batch["ids"], batch["segment_ids"]
    for row in range(4):
        for s in np.unique(seg[row][seg[row] > 0]):
            piece = tok.decode(ids[row][seg[row] == s])
            assert any(piece in page for page in corpus), piece  # a real piece of one page, in order


def test_eval_is_one_unpacked_row_per_validation_page(prepared):
    """Pax's eval contract: each document one row of its first seq_len predictions, padded; both
    hosts end after the same number of batches."""
    data = data_config(prepared["documents"], eval_path=str(prepared["validation"]))
    tok = build_tokenizer(data)
    validation = pages(VALIDATION)
    firsts, batches = [], []
    for host in range(2):
        cfg = data.replace(eval=data.eval.replace(num_infeed_hosts=2, infeed_host_index=host))
        inp = build_input(cfg, "eval", tok)
        rows = list(inp)
        batches.append(len(rows))
        assert len(rows) == inp.num_batches_per_epoch
        for b in rows:
            for r in range(4):
                if b["weights"][r].sum() == 0:
                    continue
                assert b["ids"][r][0] == tok.bos_id and set(np.unique(b["segment_ids"][r])) <= {0, 1}
                firsts.append(tok.decode(b["ids"][r][1:]))
    assert batches[0] == batches[1] == -(-len(validation) // 2 // 4)
    expected = sorted(tok.decode(tok.encode(p)[:31]) for p in validation)
    assert sorted(firsts) == expected


def test_two_processes_read_disjoint_rows_and_resume_exactly(prepared, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    outs = [tmp_path / f"out{i}.json" for i in range(2)]
    worker = [sys.executable, str(HERE / "array_record_two_process_worker.py"), str(port)]
    env = {"PYTHONPATH": str(HERE.parent.parent), "PATH": "/usr/bin:/bin"}
    procs = [
        subprocess.Popen(
            [*worker, str(i), str(prepared["rows"]), str(prepared["documents"]), str(outs[i])],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i in range(2)
    ]  # fmt: skip
    logs = [p.communicate(timeout=300)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]
    results = [json.loads(o.read_text()) for o in outs]
    for pid, r in enumerate(results):
        assert r["process_count"] == 2
        for layout in ("rows", "documents"):
            assert r[layout]["shard"] == [2, pid]
            assert r[layout]["resumed"] == r[layout]["expected"]  # the restored iterator goes on exactly
            assert r[layout]["expected"] != r[layout]["first"]

    def rows(r):
        return {tuple(row) for batch in r["rows"]["first"] + r["rows"]["expected"] for row in batch}

    assert len(rows(results[0])) == len(rows(results[1])) == 16
    assert not rows(results[0]) & rows(results[1])


def test_manifest_mismatches_are_refused_with_one_line(prepared, tmp_path):
    def refused(data: DataConfig, match: str, error=ConfigError):
        with pytest.raises(error, match=match) as e:
            data.validate()
            build_tokenizer(data)
        assert "\n" not in str(e.value)

    # The manifest says the layout: array_record has none to set, in Python or on the command line.
    with pytest.raises(ConfigError, match="ArrayRecordSource has no field 'layout'"):
        ArrayRecordSource(path=str(prepared["documents"]), layout="stream")
    from pax_eqx.command_line import cli

    with pytest.raises(
        cli.FlagError,
        match=r"^--data.layout: data.source is 'array_record' here, which has no layout; text_files, jsonl, "
        r"shakespeare read it. Switch with --data.source text_files, or drop the flag.$",
    ):
        cli.parse_fields(ExperimentConfig(data=data_config(prepared["documents"])), ["--data.layout", "stream"], "t")
    refused(data_config(prepared["rows"], seq_len=64), "holds rows of 32 tokens.*--data.seq-len 32")
    spm = SentencePieceConfig()
    refused(data_config(prepared["documents"], tokenizer=spm), "tokenized with byte.*--data.tokenizer byte")
    refused(data_config(tmp_path), "has no manifest.json.*prepare_data", MissingFileError)
    (tmp_path / "manifest.json").write_text("{}")
    refused(data_config(tmp_path), "not 'pax_eqx.prepared.v1'")


def test_a_cut_or_replaced_shard_is_named_in_one_line(prepared, tmp_path):
    """A truncated shard was a raw `RuntimeError: ArrayRecord file should be at least 64KB big`
    traceback from the reader, naming no file."""
    import shutil

    from pax_eqx.data.array_record_source import PreparedCorpusError

    cut = tmp_path / "cut"
    shutil.copytree(prepared["documents"], cut)
    shard = sorted(cut.glob("shard-*.array_record"))[-1]
    os.truncate(shard, 1000)
    data = data_config(cut)
    with pytest.raises(
        PreparedCorpusError, match=rf"shard '{shard.name}' cannot be read .*1,000 bytes.*cut short"
    ) as e:
        build_input(data, "train", build_tokenizer(data))
    assert "\n" not in str(e.value)

    swapped = tmp_path / "swapped"
    shutil.copytree(prepared["documents"], swapped)
    first, last = sorted(swapped.glob("shard-*.array_record"))[0], sorted(swapped.glob("shard-*.array_record"))[-1]
    shutil.copyfile(first, last)  # another shard's records in its place
    data = data_config(swapped)
    with pytest.raises(
        PreparedCorpusError, match=f"shard '{last.name}' is not the shard .* bytes of shard '{first.name}'"
    ):
        build_input(data, "train", build_tokenizer(data))
