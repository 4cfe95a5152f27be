"""The Apache Beam pipeline of `python -m pax_eqx.prepare_data` (needs the `[prepare]` extra).

    files --Reshuffle--> ReadFile: (shard, (file, record, tokens)) per document  + source checksums
          --GroupByKey(shard)--> WriteShard: sort by position, write, rename    -> shard stats files
    then, on this machine: manifest.json from the stats and checksums (written last)

Beam does the parallel work: the DirectRunner with `num_workers` processes on one machine, or
Flink / Spark / Dataflow with `--runner` (and their own options in `--beam-options`); every path
goes through Beam's file systems. Determinism and restarts come from shards.py (stable shard
of a document's position, sorted shards, temporary name then rename); a rerun reads every file
again (its checksum, and the documents of the shards still missing) but tokenizes and writes
only the shards that are not complete.

The tokenizer is fixed before the pipeline starts: bytes; a SentencePiece model (given, or
trained here on a sample spread over the input files); or a tokenizer.json. Its file is copied
into OUTPUT_DIR/tokenizer/ and its bytes shipped to the workers, so every worker encodes with
exactly the vocabulary the manifest names.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import sys
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pax_eqx.config import ConfigError
from pax_eqx.data.prepare import readers, records, shards
from pax_eqx.data.prepare.config import DIRECT_RUNNER, PrepareConfig
from pax_eqx.data.prepare.manifest import MANIFEST, Manifest
from pax_eqx.data.tokenizers import ByteTokenizer, SentencePieceTokenizer, train_sentencepiece

PLAN = "prepare_config.json"
SOURCES = "sources.json"
TOKENIZER_DIR = "tokenizer"
_SAMPLE_FILES = 64  # SentencePiece's training sample is drawn from at most this many input files
# Fields that change how the work is run, not what is written: a rerun may change them.
_RUN_ONLY = ("runner", "num_workers", "beam_options")


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
    """What a worker needs to build the tokenizer: its kind, its file's bytes, its config."""

    kind: str
    blob: bytes
    config: dict[str, Any]
    file: str  # relative to the output directory ("" for bytes)

    def build(self):
        if self.kind == "byte":
            return ByteTokenizer()
        if self.kind == "sentencepiece":
            return SentencePieceTokenizer(self.blob)
        if self.kind == "tokenizer_json":
            from pax_eqx.data import tokenizers

            cfg = tokenizers.TokenizerJsonConfig(**self.config)
            return tokenizers.TokenizerJsonTokenizer(self.blob, cfg)
        raise ConfigError(f"--tokenizer {self.kind!r} is not byte, sentencepiece or tokenizer_json.")


class PipelineError(RuntimeError):
    """The pipeline failed for a reason that is not the input's (a worker lost, a runner's error)."""


_OUR_ERROR = re.compile(r"(pax_eqx[\w.]*\.\w*Error): (.*?)(?: \[while running '[^']*'\])?$", re.MULTILINE)


def pipeline_error(error: BaseException) -> BaseException:
    """The one-line error for a failed pipeline. A DoFn's ConfigError (a record that is not JSON,
    a missing --text-key) reaches the caller as the runner's RuntimeError with the worker's
    traceback in its text: that error's own message is taken back out of it."""
    if isinstance(error, ConfigError):  # run in this process: Beam only added where it was raised
        return ConfigError(re.sub(r" \[while running '[^']*'\]$", "", str(error)))
    ours = _OUR_ERROR.findall(str(error))
    if ours:
        return ConfigError(ours[-1][1])
    last = next((line for line in reversed(str(error).strip().splitlines()) if line.strip()), type(error).__name__)
    return PipelineError(f"the Beam pipeline failed: {last.strip()}")


def _fs() -> type[FileSystems]:
    return FileSystems


def _log(message: str) -> None:
    print(f"prepare_data: {message}", file=sys.stderr, flush=True)


def prepare(cfg: PrepareConfig) -> Manifest:
    """Prepares the corpus of `cfg` into cfg.output_dir (module doc) and returns its manifest."""
    cfg.validate()
    fs = _fs()
    out = cfg.output_dir
    files = readers.list_inputs(cfg.input, cfg.format)
    local = "://" not in out
    if local and os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"--output-dir {out!r} is a file, not a directory; choose another path.")
    created = not fs.exists(out)
    if created:
        try:
            fs.mkdirs(out)
        except OSError as e:
            raise ConfigError(f"--output-dir {out!r} cannot be created ({e}); choose a writable path.") from None
    _check_or_write_plan(cfg, files)
    if fs.exists(fs.join(out, MANIFEST)):
        _log(f"{out} is already prepared (its {MANIFEST} exists); nothing to do.")
        with fs.open(fs.join(out, MANIFEST)) as f:
            return Manifest.from_json(f.read().decode(), f"{out}/{MANIFEST}")
    spec = _tokenizer_spec(cfg, files)
    removed = shards.remove_temporaries(out)
    done = shards.complete_shards(out, cfg.num_shards)
    _log(
        f"{len(files)} input file(s) -> {cfg.num_shards} shard(s) in {out}; {len(done)} complete from an earlier run "
        f"(skipped){f', {removed} half-written file(s) removed' if removed else ''}; runner {cfg.runner}."
    )
    try:
        _run_pipeline(cfg, files, spec, frozenset(done))
    except Exception as e:  # noqa: BLE001 -- a worker's error comes back as the runner's, its text inside
        error = pipeline_error(e)
        if isinstance(error, ConfigError) and created and local:
            shutil.rmtree(out, ignore_errors=True)  # bad input: a refused run leaves no directory behind
        raise error from None
    manifest = _manifest(cfg, spec)
    if manifest.num_documents == 0:
        if created and local:
            shutil.rmtree(out, ignore_errors=True)  # a refused run leaves nothing behind
        raise ConfigError(
            f"--input {cfg.input!r}: its {len(files)} file(s) hold no documents (empty, or no record has text in "
            f"--text-key {cfg.text_key!r}); nothing was prepared."
        )
    shards.write_bytes_atomically(fs.join(out, MANIFEST), manifest.to_json().encode())
    _log(
        f"wrote {manifest.num_records} records ({manifest.num_documents} documents, {manifest.num_tokens} tokens) "
        f"and {MANIFEST}."
    )
    return manifest


def _plan(cfg: PrepareConfig, files: list[readers.InputFile]) -> dict[str, Any]:
    fields = {k: v for k, v in cfg.to_dict().items() if k not in _RUN_ONLY}
    return {"config": fields, "inputs": [f.path for f in files]}


def _check_or_write_plan(cfg: PrepareConfig, files: list[readers.InputFile]) -> None:
    """A rerun into a directory must prepare the same thing, or its shards would mix."""
    fs = _fs()
    path = fs.join(cfg.output_dir, PLAN)
    plan = _plan(cfg, files)
    if fs.exists(path):
        with fs.open(path) as f:
            old = json.loads(f.read())
        if old != plan:
            changed = sorted(
                k for k in set(old["config"]) | set(plan["config"]) if old["config"].get(k) != plan["config"].get(k)
            )
            if old["inputs"] != plan["inputs"]:
                changed.append("input files")
            raise ConfigError(
                f"--output-dir {cfg.output_dir!r} holds a preparation started with other settings "
                f"({', '.join(changed)} differ; see its {PLAN}); rerun with those settings to finish it, or use "
                "a new --output-dir."
            )
        return
    shards.write_bytes_atomically(path, json.dumps(plan, indent=1, sort_keys=True).encode())


def _tokenizer_spec(cfg: PrepareConfig, files: list[readers.InputFile]) -> TokenizerSpec:
    """The tokenizer's bytes, copied (or, for an untrained SentencePiece, trained) into OUTPUT/tokenizer/."""
    fs = _fs()
    tok = cfg.tokenizer
    settings = {k: v for k, v in tok.to_dict().items()}
    if tok.kind == "byte":
        return TokenizerSpec("byte", b"", settings, "")
    if tok.kind == "sentencepiece":
        rel = f"{TOKENIZER_DIR}/spm.model"
        target = fs.join(cfg.output_dir, rel)
        if tok.model_path:
            blob = readers.read_bytes(tok.model_path)
        elif fs.exists(target):  # a rerun: the model trained by the first run
            blob = readers.read_bytes(target)
        else:
            _log(f"training SentencePiece (vocab {tok.vocab_size}) on a sample of {tok.max_training_chars} characters")
            blob = train_sentencepiece(_sample_lines(cfg, files), tok)
        spec = TokenizerSpec("sentencepiece", blob, settings, rel)
    elif tok.kind == "tokenizer_json":
        rel = f"{TOKENIZER_DIR}/tokenizer.json"
        spec = TokenizerSpec("tokenizer_json", readers.read_bytes(tok.path), settings, rel)
        target = fs.join(cfg.output_dir, rel)
    else:
        raise ConfigError(f"--tokenizer {tok.kind!r} is not byte, sentencepiece or tokenizer_json.")
    spec.build()  # a model that cannot be loaded fails here, before any worker starts
    if not fs.exists(fs.join(cfg.output_dir, TOKENIZER_DIR)):
        fs.mkdirs(fs.join(cfg.output_dir, TOKENIZER_DIR))
    shards.write_bytes_atomically(target, spec.blob)
    return spec


def _sample_lines(cfg: PrepareConfig, files: list[readers.InputFile]):
    """Lines of documents from up to _SAMPLE_FILES evenly spaced input files, an equal share of
    tokenizer.max_training_chars each (Pax's C4 vocabulary was trained on a sample of C4 too)."""
    step = max(1, math.ceil(len(files) / _SAMPLE_FILES))
    chosen = files[::step]
    share = max(1, cfg.tokenizer.max_training_chars // len(chosen))
    for file in chosen:
        budget = share
        for text in readers.documents(readers.read_bytes(file.path), file, cfg.text_key):
            for line in text.split("\n"):
                yield line
                budget -= len(line) + 1
            if budget <= 0:
                break


def pipeline_options(cfg: PrepareConfig) -> PipelineOptions:
    """The Beam options of `cfg`: its runner, the DirectRunner's processes, then --beam-options."""
    flags = [f"--runner={cfg.runner}"]
    if cfg.runner == DIRECT_RUNNER:
        mode = "multi_processing" if cfg.num_workers > 1 else "in_memory"
        flags += [f"--direct_num_workers={cfg.num_workers}", f"--direct_running_mode={mode}"]
        flags += ["--default_sdk_harness_log_level=ERROR"]  # the workers' start-up lines drown the progress
    # `--beam-options project=P region=R`: written without dashes, which the command line would read as its own flags
    return PipelineOptions(flags + [o if o.startswith("-") else f"--{o}" for o in cfg.beam_options])


class ReadFile(beam.DoFn):
    """One input file -> (shard, (file index, record index, token record)) for each document of a
    shard not yet complete, and the file's checksum on the "sources" output."""

    def __init__(self, text_key: str, spec: TokenizerSpec, num_shards: int, done: frozenset[int]):
        self.text_key, self.spec, self.num_shards, self.done = text_key, spec, num_shards, done

    def setup(self):
        tokenizer = self.spec.build()
        self._encode = getattr(tokenizer, "encode_array", tokenizer.encode)

    def process(self, file: readers.InputFile):
        data = readers.read_bytes(file.path)
        count = 0
        for i, text in enumerate(readers.documents(data, file, self.text_key)):
            count += 1
            shard = shards.shard_of(file.index, i, self.num_shards)
            if shard not in self.done:
                yield shard, (file.index, i, records.document_record(self._encode(text)))
        yield beam.pvalue.TaggedOutput(
            "sources", {"path": file.path, "sha256": readers.sha256(data), "documents": count}
        )


class WriteShard(beam.DoFn):
    """(shard, its documents) -> the shard written (shards.write_shard); yields its stats."""

    def __init__(self, cfg: PrepareConfig, bos_id: int, eos_id: int):
        self.out, self.num_shards, self.layout, self.seq_len = cfg.output_dir, cfg.num_shards, cfg.layout, cfg.seq_len
        self.bos_id, self.eos_id = bos_id, eos_id

    def process(self, keyed):
        shard, docs = keyed
        real = [d for d in docs if d is not None]  # None: the key that makes an empty shard exist
        yield shards.write_shard(
            self.out, shard, self.num_shards, real, self.layout, self.seq_len, self.bos_id, self.eos_id
        )


class WriteSources(beam.DoFn):
    """Every input file's checksum and document count -> OUTPUT/sources.json."""

    def __init__(self, output_dir: str):
        self.output_dir = output_dir

    def process(self, found: list[dict[str, Any]]):
        ordered = sorted(found, key=lambda s: s["path"])
        shards.write_bytes_atomically(_fs().join(self.output_dir, SOURCES), json.dumps(ordered, indent=1).encode())
        yield len(ordered)


def _run_pipeline(
    cfg: PrepareConfig, files: list[readers.InputFile], spec: TokenizerSpec, done: frozenset[int]
) -> None:
    tok = spec.build()
    missing = [i for i in range(cfg.num_shards) if i not in done]
    with beam.Pipeline(options=pipeline_options(cfg)) as p:
        read = (
            p
            | "files" >> beam.Create(files)
            | "spread files" >> beam.Reshuffle()
            | "read and tokenize"
            >> beam.ParDo(ReadFile(cfg.text_key, spec, cfg.num_shards, done)).with_outputs("sources", main="documents")
        )
        # Every missing shard gets a key, so a shard that no document hashes to is still written (empty).
        every_shard = p | "every missing shard" >> beam.Create([(i, None) for i in missing])
        (
            (read.documents, every_shard)
            | "with every shard" >> beam.Flatten()
            | "by shard" >> beam.GroupByKey()
            | "write shards" >> beam.ParDo(WriteShard(cfg, tok.bos_id, tok.eos_id))
        )
        (
            read.sources
            | "all sources" >> beam.combiners.ToList()
            | "write sources" >> beam.ParDo(WriteSources(cfg.output_dir))
        )


def _manifest(cfg: PrepareConfig, spec: TokenizerSpec) -> Manifest:
    fs = _fs()
    stats = tuple(shards.read_stats(cfg.output_dir, i, cfg.num_shards) for i in range(cfg.num_shards))
    with fs.open(fs.join(cfg.output_dir, SOURCES)) as f:
        sources = tuple(json.loads(f.read()))
    tok = spec.build()
    tokenizer = {
        "kind": spec.kind,
        "fingerprint": tok.fingerprint,
        "vocab_size": int(tok.vocab_size),
        "bos_id": int(tok.bos_id),
        "eos_id": int(tok.eos_id),
        "pad_id": int(tok.pad_id),
        "file": spec.file,
    }
    return Manifest(
        layout=cfg.layout,
        seq_len=cfg.seq_len,
        tokenizer=tokenizer,
        shards=stats,
        sources=sources,
        config=_plan(cfg, [])["config"],
    )
