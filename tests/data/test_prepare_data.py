"""python -m pax_eqx.prepare_data: every input format in one Beam run, deterministic shards, a kill -9
mid-run finished by a rerun, and the errors a user can make.

The end-to-end test runs three preparations of one corpus (JSON lines plain / .gz / .zst, Parquet,
a `datasets` save_to_disk directory and text files; SentencePiece trained on a sample): the
DirectRunner in this process (one worker), then the CLI with 2 worker processes killed with -9
while it writes shards, then the CLI again into the same directory. The shards of the last must be
byte for byte those of the first, and every document must be in them exactly once.
"""

from __future__ import annotations

import collections
import gzip
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("apache_beam", reason="the [prepare] extra (.ci/run installs it)")

from pax_eqx.config import ConfigError  # noqa: E402
from pax_eqx.data import ArrayRecordSource, lm_examples  # noqa: E402
from pax_eqx.data.prepare import records, shards  # noqa: E402
from pax_eqx.data.prepare.config import PrepareConfig  # noqa: E402
from pax_eqx.data.tokenizers import ByteTokenizer, SentencePieceConfig, SentencePieceTokenizer  # noqa: E402

ROOT = Path(__file__).parents[2]
C4_SMALL = ROOT / "tests" / "fixtures" / "c4_small"
SLOW_WRITES = Path(__file__).parent / "prepare_slow_writes"


def c4_pages(name: str) -> list[str]:
    with gzip.open(C4_SMALL / name, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def write_corpus(root: Path) -> tuple[str, list[str]]:
    """The fixture's pages spread over every input format; returns (--input, the documents)."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    first = c4_pages("c4-train.00000-of-00002.json.gz")
    files = root / "corpus"
    files.mkdir(parents=True)
    (files / "plain.jsonl").write_text("".join(json.dumps({"text": t, "url": "u"}) + "\n" for t in first[:60]))
    zst = "".join(json.dumps({"text": t}) + "\n" for t in first[60:120]).encode()
    (files / "web.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(zst))
    shutil.copy(C4_SMALL / "c4-train.00001-of-00002.json.gz", files)  # gzip, as C4 ships
    pq.write_table(pa.table({"text": first[120:150], "id": list(range(30))}), files / "part.parquet")
    texts = ["a whole file is one document\n\nwith a blank line", "another file, one line"]
    for i, text in enumerate(texts):
        (files / f"note{i}.txt").write_text(text)
    datasets.Dataset.from_dict({"text": first[150:160]}).save_to_disk(str(root / "hf"))
    docs = first[:160] + c4_pages("c4-train.00001-of-00002.json.gz") + texts
    return f"{files},{root / 'hf'}", docs


def decoded_documents(directory: Path, tokenizer) -> list[str]:
    from array_record.python.array_record_module import ArrayRecordReader

    out = []
    for path in sorted(directory.glob("shard-*.array_record")):
        reader = ArrayRecordReader(str(path))
        out += [tokenizer.decode(records.document_tokens(r)) for r in reader.read_all()]
        reader.close()
    return out


def run_cli(args: list[str], **kwargs) -> subprocess.Popen:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", **kwargs.pop("env", {})}
    cmd = [sys.executable, "-m", "pax_eqx.prepare_data", *args]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs
    )


def test_prepare_every_format_deterministic_and_complete_after_kill_9(tmp_path):
    from pax_eqx.data.prepare import pipeline

    spec, docs = write_corpus(tmp_path)
    spm = SentencePieceConfig(vocab_size=400, byte_fallback=True, max_training_chars=60_000)
    num_shards = 12
    cfg = PrepareConfig(input=spec, output_dir=str(tmp_path / "a"), tokenizer=spm, num_shards=num_shards, num_workers=1)
    manifest = pipeline.prepare(cfg)

    # Every document exactly once, tokens counted, sources hashed.
    tok = SentencePieceTokenizer.load(tmp_path / "a" / "tokenizer" / "spm.model")
    assert collections.Counter(decoded_documents(tmp_path / "a", tok)) == collections.Counter(docs)
    assert manifest.num_documents == manifest.num_records == len(docs) == 322
    assert manifest.num_tokens == sum(len(tok.encode(d)) for d in docs)
    assert manifest.tokenizer["fingerprint"] == tok.fingerprint and manifest.tokenizer["kind"] == "sentencepiece"
    by_path = {s["path"]: s for s in manifest.sources}
    assert len(by_path) == 7  # 4 record files, 2 text files, the `datasets` directory's one Arrow file
    for path, source in by_path.items():
        assert source["sha256"] == hashlib.sha256(Path(path).read_bytes()).hexdigest()
    assert sum(s["documents"] for s in manifest.sources) == len(docs)
    counts = [s["documents"] for s in manifest.shards]
    assert min(counts) > 0 and max(counts) < 3 * len(docs) / num_shards  # spread by the position hash

    # The CLI with 2 worker processes, killed with -9 (the whole process group) while it writes shards.
    out = tmp_path / "b"
    flags = [
        "--input", spec, "--output-dir", str(out), "--tokenizer", "sentencepiece", "--tokenizer.vocab-size", "400",
        "--tokenizer.byte-fallback", "--tokenizer.max-training-chars", "60000",
        "--num-shards", str(num_shards), "--num-workers", "2",
    ]  # fmt: skip
    slow = {
        "PYTHONPATH": f"{SLOW_WRITES}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "PAX_EQX_TEST_SHARD_DELAY_S": "0.5",
    }
    proc = run_cli(flags, env=slow, start_new_session=True)
    deadline = time.monotonic() + 120
    while not shards.complete_shards(str(out), num_shards) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()[0]  # still running: the kill lands mid-run
    os.killpg(proc.pid, signal.SIGKILL)
    log = proc.communicate()[0]
    killed_with = len(shards.complete_shards(str(out), num_shards))
    assert 0 < killed_with < num_shards, log
    assert not (out / "manifest.json").exists()

    rerun = run_cli(flags)
    log = rerun.communicate(timeout=240)[0]
    assert rerun.returncode == 0, log
    assert f"{killed_with} complete from an earlier run (skipped)" in log
    assert not list(out.glob(".tmp-*"))
    for i in range(num_shards):
        name = shards.shard_name(i, num_shards)
        assert (out / name).read_bytes() == (tmp_path / "a" / name).read_bytes(), name
    assert (out / "tokenizer" / "spm.model").read_bytes() == (tmp_path / "a" / "tokenizer" / "spm.model").read_bytes()
    again = json.loads((out / "manifest.json").read_text())
    assert again["shards"] == list(manifest.shards) and again["num_documents"] == len(docs)


def test_rows_layout_packs_documents_as_the_reader_does(tmp_path):
    """Pre-packed rows hold every document's [bos] + tokens as ids and tokens + [eos] as labels,
    in position order, split at row ends; weights are exactly the real positions."""
    tok = ByteTokenizer()
    texts = [f"document {i} " + "x" * (i * 7 % 23) for i in range(30)]
    docs = [(0, i, records.document_record(tok.encode_array(t))) for i, t in enumerate(texts)]
    stats = shards.write_shard(str(tmp_path), 0, 1, reversed(docs), "rows", 16, tok.bos_id, tok.eos_id)
    from array_record.python.array_record_module import ArrayRecordReader

    reader = ArrayRecordReader(str(tmp_path / stats["file"]))
    rows = [records.row_example(r, 16) for r in reader.read_all()]
    assert stats["records"] == len(rows) and stats["documents"] == 30
    real = np.concatenate([r["weights"] for r in rows]) > 0
    ids = np.concatenate([r["ids"] for r in rows])[real]
    labels = np.concatenate([r["labels"] for r in rows])[real]
    expect_ids = np.concatenate([[tok.bos_id] + tok.encode(t) for t in texts])
    expect_labels = np.concatenate([tok.encode(t) + [tok.eos_id] for t in texts])
    np.testing.assert_array_equal(ids, expect_ids)
    np.testing.assert_array_equal(labels, expect_labels)
    for r in rows:  # positions restart at 0 in every segment, segments numbered 1, 2, ... per row
        seg = r["segment_ids"]
        for s in np.unique(seg[seg > 0]):
            np.testing.assert_array_equal(r["segment_pos"][seg == s], np.arange(np.sum(seg == s)))
    assert len(rows) == -(-len(expect_ids) // 16)
    # The same rows as grain's packer over the same documents (what `--layout documents` reads).
    examples = [records.document_example(tok.encode_array(t), tok.bos_id, tok.eos_id) for t in texts]
    import grain

    again = list(lm_examples.pack_documents(grain.MapDataset.source(examples).to_iter_dataset(), 16))
    for a, b in zip(rows, again, strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_shards_spread_evenly_and_records_round_trip():
    counts = np.bincount([shards.shard_of(f, r, 8) for f in range(10) for r in range(1000)], minlength=8)
    assert counts.min() > 1000 * 10 / 8 * 0.9 and counts.max() < 1000 * 10 / 8 * 1.1
    tokens = np.array([5, 70000, 2**31 - 1, 0], np.int32)
    np.testing.assert_array_equal(records.document_tokens(records.document_record(tokens)), tokens)
    with pytest.raises(ConfigError, match="not 4 x seq_len 8"):
        records.row_example(records.document_record(tokens), 8)


def test_prepare_flags_refused_with_one_line(tmp_path):
    from pax_eqx import prepare_data

    def error(args):
        proc = subprocess.run(
            [sys.executable, "-m", "pax_eqx.prepare_data", *args], cwd=ROOT, capture_output=True, text=True,
            env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"},
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        return proc.stderr.strip().splitlines()[-1]

    assert "--seq-len" in error(["--input", "x", "--output-dir", "y", "--seq-len", "8"])
    with pytest.raises(ConfigError, match="--input is empty"):
        PrepareConfig(output_dir="y").validate()
    with pytest.raises(ConfigError, match="--seq-len must be > 0"):
        PrepareConfig(input="x", output_dir="y", layout="rows").validate()
    with pytest.raises(ConfigError, match="does not exist"):
        from pax_eqx.data.prepare import pipeline

        pipeline.prepare(PrepareConfig(input=str(tmp_path / "missing.jsonl"), output_dir=str(tmp_path / "o")))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "no text field"}\n')
    with pytest.raises(ConfigError, match=r"line 1 has no 'text' field \(it has \['body'\]\); set --text-key\.$"):
        pipeline.prepare(PrepareConfig(input=str(bad), output_dir=str(tmp_path / "o"), num_workers=1))
    assert not (tmp_path / "o").exists()  # bad input: the refused run leaves no directory behind
    # A worker process's error reaches the runner as a RuntimeError with the worker's traceback in
    # its text: the same one line comes out (it was that traceback, exit 1).
    not_json = tmp_path / "not_json.jsonl"
    not_json.write_text('{"text": "fine"}\n{bad json\n')
    last = error(["--input", str(not_json), "--output-dir", str(tmp_path / "o2"), "--num-workers", "2"])
    assert last.startswith(f"error: --input: '{not_json}' line 2 is not JSON (") and last.endswith(").")
    assert not (tmp_path / "o2").exists()
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ConfigError, match="hold no documents .* nothing was prepared"):
        pipeline.prepare(PrepareConfig(input=str(tmp_path / "empty.jsonl"), output_dir=str(tmp_path / "o3"),
                                       num_workers=1))  # fmt: skip
    assert not (tmp_path / "o3").exists()
    with pytest.raises(ConfigError, match="--output-dir .* is a file, not a directory"):
        pipeline.prepare(PrepareConfig(input=str(bad), output_dir=str(bad)))
    with pytest.raises(ConfigError, match="'FlinkRuner' is not a Beam runner. Did you mean 'FlinkRunner'"):
        PrepareConfig(input="x", output_dir="y", runner="FlinkRuner").validate()
    # A rerun into the directory with other settings would mix two preparations' shards.
    good = tmp_path / "good.jsonl"
    good.write_text('{"text": "a page"}\n')
    pipeline.prepare(PrepareConfig(input=str(good), output_dir=str(tmp_path / "o4"), num_workers=1, num_shards=2))
    with pytest.raises(ConfigError, match=r"holds 2 complete shard\(s\) .* \(num_shards: 2 -> 3; see its"):
        pipeline.prepare(PrepareConfig(input=str(good), output_dir=str(tmp_path / "o4"), num_workers=1, num_shards=3))
    assert prepare_data.PROG == "python -m pax_eqx.prepare_data"


def test_help_gives_each_flag_its_sentence(capsys):
    from pax_eqx import prepare_data

    with pytest.raises(SystemExit) as e:
        prepare_data.main(["--tokenizer", "sentencepiece", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert "--tokenizer.vocab-size" in out and "ArrayRecord files written" in out


def test_runner_flags_become_beam_options():
    from pax_eqx.command_line import cli
    from pax_eqx.data.prepare import pipeline

    args = ["--runner", "FlinkRunner", "--beam-options", "flink_master=host:8081", "parallelism=8"]
    flink = pipeline.pipeline_options(cli.parse_fields(PrepareConfig(), args, "p")).get_all_options()
    assert flink["runner"] == "FlinkRunner" and flink["flink_master"] == "host:8081" and flink["parallelism"] == 8
    direct = pipeline.pipeline_options(PrepareConfig(num_workers=3)).get_all_options()
    assert direct["direct_num_workers"] == 3 and direct["direct_running_mode"] == "multi_processing"
    with pytest.raises(cli.FlagError, match="num_workers"):  # the Flink runner sizes itself
        cli.parse_fields(PrepareConfig(), [*args, "--num-workers", "4"], "p")


def byte_level_bpe(path: Path, text: str, vocab_size: int) -> str:
    """A GPT-2-style byte-level BPE tokenizer.json trained on `text`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet)
    tok.train_from_iterator([text] * 5, trainer)
    tok.save(str(path))
    return str(path)


def test_a_tokenizer_json_corpus_reads_back_with_that_tokenizer_only(tmp_path):
    from pax_eqx.data import DataConfig, InputConfig, build_input, build_tokenizer
    from pax_eqx.data.prepare import pipeline
    from pax_eqx.data.tokenizers import TokenizerJsonConfig

    docs = c4_pages("c4-validation.00000-of-00001.json.gz")
    corpus = tmp_path / "pages.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    bpe = TokenizerJsonConfig(path=byte_level_bpe(tmp_path / "bpe.json", docs[0], 320), eos_token="<|endoftext|>")
    cfg = PrepareConfig(input=str(corpus), output_dir=str(tmp_path / "out"), tokenizer=bpe, num_shards=2, num_workers=1)
    manifest = pipeline.prepare(cfg)
    assert manifest.tokenizer["kind"] == "tokenizer_json"
    assert (tmp_path / "out" / "tokenizer" / "tokenizer.json").read_bytes() == Path(bpe.path).read_bytes()
    one_host = InputConfig(batch_size=2, shuffle=False, repeat=False, reset_for_eval=True, num_infeed_hosts=1)
    data = DataConfig(source=ArrayRecordSource(path=str(tmp_path / "out")), seq_len=4096, tokenizer=bpe)
    eval_every_page = data.source.replace(eval_path=data.source.path)
    data = data.replace(eval=one_host.replace(infeed_host_index=0), source=eval_every_page)
    tok = build_tokenizer(data)
    rows = [r for b in build_input(data, "eval", tok) for r, w in zip(b["ids"], b["weights"]) if w.sum() > 0]
    assert sorted(tok.decode(r[1:]) for r in rows) == sorted(docs)  # each page whole, decoded exactly
    other = TokenizerJsonConfig(path=byte_level_bpe(tmp_path / "other.json", docs[1], 300), eos_token="<|endoftext|>")
    with pytest.raises(ConfigError, match="is not the one data.path=.* was tokenized with"):
        build_tokenizer(data.replace(tokenizer=other))
