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

A rerun trusts a complete shard only while its inputs are unchanged: it hashes every input file
first (this machine, 8 threads) and redoes each complete shard that holds documents of a file
whose sha256 changed, or that a changed file's documents now hash to (`stale_shards`); a
finished directory is checked the same way against its manifest's sources. A rerun with other
settings is refused only while the directory holds complete shards of the first settings:
leftovers of a run that completed none (its prepare_config.json, tokenizer, stats) are replaced.
A refused run (bad input, exit 2) removes what it wrote, unless the directory held complete
shards before it.

What a user sees of a failure is its first cause in one line: the DoFns raise ConfigError for a
bad record (the file and line) and PipelineError, naming the file or shard, for anything else;
the runner hands them back as its own exception with the worker's traceback in its text, from
which `pipeline_error` takes the first of ours back out. With `beam_log`, everything Beam and its
worker processes print (start-up lines, the workers' tracebacks) goes to that file instead of
the terminal. Ctrl-C stops the worker processes (`stop_workers`) and leaves the complete shards
for the rerun.

The tokenizer is fixed before the pipeline starts: bytes; a SentencePiece model (given, or
trained here on a sample spread over the input files); or a tokenizer.json. Its file is copied
into OUTPUT_DIR/tokenizer/ and its bytes shipped to the workers, so every worker encodes with
exactly the vocabulary the manifest names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
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
    """The pipeline failed for a reason that is not the input's (a file that cannot be read, a
    shard that cannot be written, a worker lost, a runner's error): exit 1, rerun to finish."""


_WHILE = re.compile(r" \[while running '[^']*'\]")
_OUR_ERROR = re.compile(r"\bpax_eqx(?:\.\w+)*\.(\w*Error): (.*?)(?: \[while running '[^']*'\])?$", re.MULTILINE)


def pipeline_error(error: BaseException) -> BaseException:
    """The one-line error for a failed pipeline. A DoFn's ConfigError (a record that is not JSON,
    a missing --text-key) or PipelineError reaches the caller as the runner's RuntimeError with
    the worker's traceback in its text: the first of ours in it (the cause; what follows is Beam
    re-raising it) is taken back out."""
    if isinstance(error, ConfigError):  # run in this process: Beam only added where it was raised
        return ConfigError(_WHILE.sub("", str(error)))
    if isinstance(error, PipelineError):
        return PipelineError(_WHILE.sub("", str(error)))
    ours = _OUR_ERROR.search(str(error))
    if ours:
        name, message = ours.groups()
        return PipelineError(message) if name == "PipelineError" else ConfigError(message)
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    last = _WHILE.sub("", lines[-1]) if lines else type(error).__name__
    return PipelineError(f"the Beam pipeline failed: {type(error).__name__}: {last}")


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {_WHILE.sub('', text[0])}" if text else type(error).__name__


def _fs() -> type[FileSystems]:
    return FileSystems


def _log(message: str) -> None:
    print(f"prepare_data: {message}", file=sys.stderr, flush=True)


def prepare(cfg: PrepareConfig, beam_log: str | None = None) -> Manifest:
    """Prepares the corpus of `cfg` into cfg.output_dir (module doc) and returns its manifest.
    beam_log: a file for what Beam and its workers print while the pipeline runs (None: the
    terminal)."""
    cfg.validate()
    fs = _fs()
    out = cfg.output_dir
    local = shards.is_local(out)
    if local and os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"--output-dir {out!r} is a file, not a directory; choose another path.")
    files = readers.list_inputs(cfg.input, cfg.format, exclude=out)
    created = not fs.exists(out)
    before = set() if created else _listing(out)
    had_shards = not created and bool(shards.shard_files(out))
    if created:
        try:
            fs.mkdirs(out)
        except OSError as e:
            raise ConfigError(
                f"--output-dir {out!r} cannot be created ({_strerror(e)}); choose a path this user can write."
            ) from None
    if local and not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(
            f"--output-dir {out!r} is not writable by this user (permission denied); fix its permissions, or choose "
            "another directory."
        )
    try:
        return _prepare(cfg, files, beam_log)
    except ConfigError:  # a refused run leaves nothing behind, unless the directory held complete shards before
        if not had_shards:
            _remove_new(out, created, before)
        raise


def _prepare(cfg: PrepareConfig, files: list[readers.InputFile], beam_log: str | None) -> Manifest:
    fs = _fs()
    out = cfg.output_dir
    _check_or_write_plan(cfg, files)
    digests = None
    manifest_path = fs.join(out, MANIFEST)
    if fs.exists(manifest_path):
        with fs.open(manifest_path) as f:
            manifest = Manifest.from_json(f.read().decode(), f"{out}/{MANIFEST}")
        digests = input_digests(files)
        prepared = {s["path"]: s["sha256"] for s in manifest.sources}
        changed = [f.path for f in files if prepared.get(f.path) != digests[f.index]]
        if not changed:
            _log(f"{out} is already prepared ({MANIFEST}; its {len(files)} input file(s) unchanged); nothing to do.")
            return manifest
        _log(f"{len(changed)} input file(s) changed since {out} was prepared (first {changed[0]!r}).")
    spec = _tokenizer_spec(cfg, files)
    removed = shards.remove_temporaries(out)
    done = shards.complete_shards(out, cfg.num_shards)
    redo = ""
    if done:
        digests = digests or input_digests(files)
        stale = stale_shards(cfg, files, done, digests)
        if fs.exists(manifest_path):
            fs.delete([manifest_path])
        for index in sorted(stale):
            shards.remove_shard(out, index, cfg.num_shards)
        done -= stale
        if stale:
            redo = f"; {len(stale)} complete shard(s) redone, their input files changed since they were written"
    _log(
        f"{len(files)} input file(s) -> {cfg.num_shards} shard(s) in {out}; {len(done)} complete from an earlier run "
        f"(skipped){redo}{f', {removed} half-written file(s) removed' if removed else ''}; runner {cfg.runner}."
    )
    run_pipeline(cfg, files, spec, frozenset(done), beam_log)
    manifest = _manifest(cfg, spec)
    if manifest.num_documents == 0:
        raise ConfigError(
            f"--input {cfg.input!r}: its {len(files)} file(s) hold no documents (empty, or no record has text in "
            f"--text-key {cfg.text_key!r}); nothing was prepared."
        )
    if manifest.num_tokens == 0:
        raise ConfigError(
            f"--input {cfg.input!r}: its {manifest.num_documents} document(s) are all empty (no text in "
            f"--text-key {cfg.text_key!r}), so a model would have nothing to learn; nothing was prepared. Give a "
            "corpus with text, or the --text-key that holds it."
        )
    shards.write_bytes_atomically(manifest_path, manifest.to_json().encode())
    _log(
        f"wrote {manifest.num_records} records ({manifest.num_documents} documents, {manifest.num_tokens} tokens) "
        f"and {MANIFEST}."
    )
    return manifest


def _strerror(error: OSError) -> str:
    return error.strerror or str(error)


def _listing(out: str) -> set[str]:
    """Every path under `out` (files and, locally, directories)."""
    if shards.is_local(out):
        found = set()
        for root, dirs, names in os.walk(out):
            found.update(os.path.join(root, n) for n in dirs + names)
        return found
    fs = _fs()
    return {m.path for m in fs.match([fs.join(out, "**")])[0].metadata_list}


def _remove_new(out: str, created: bool, before: set[str]) -> None:
    """Removes what this run wrote into `out`: the directory itself if the run created it."""
    fs = _fs()
    with contextlib.suppress(OSError):
        if created:
            if shards.is_local(out):
                shutil.rmtree(out, ignore_errors=True)
            else:
                fs.delete([out])
            return
        for path in sorted(_listing(out) - before, key=len, reverse=True):  # files before their directories
            if shards.is_local(out) and os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            elif fs.exists(path):
                fs.delete([path])


def _plan(cfg: PrepareConfig, files: list[readers.InputFile]) -> dict[str, Any]:
    fields = {k: v for k, v in cfg.to_dict().items() if k not in _RUN_ONLY}
    return {"config": fields, "inputs": [f.path for f in files]}


def _check_or_write_plan(cfg: PrepareConfig, files: list[readers.InputFile]) -> None:
    """A rerun into a directory must prepare the same thing while the directory holds complete
    shards of the first settings, or its shards would mix. Without any, what an earlier run left
    (it failed, or was stopped, before completing a shard) pins nothing: it is cleared."""
    fs = _fs()
    out = cfg.output_dir
    path = fs.join(out, PLAN)
    plan = _plan(cfg, files)
    complete = shards.shard_files(out)
    if fs.exists(path):
        try:
            with fs.open(path) as f:
                old = json.loads(f.read())
        except ValueError:
            old = None
        if old == plan:
            return
        if complete:
            raise ConfigError(
                f"--output-dir {out!r} holds {len(complete)} complete shard(s) of a preparation started with other "
                f"settings ({_differences(old, plan)}; see its {PLAN}); rerun with those settings to finish it, or "
                "use a new --output-dir."
            )
        _clear_leftovers(out)
        _log(f"{out}: an earlier run with other settings completed no shard; starting afresh with these settings.")
    elif complete:
        raise ConfigError(
            f"--output-dir {out!r} holds shard files ({os.path.basename(complete[0])}, ...) but no {PLAN}: they are "
            "not this command's preparation, or that record was deleted; use a new --output-dir."
        )
    shards.write_bytes_atomically(path, json.dumps(plan, indent=1, sort_keys=True).encode())


def _differences(old: dict[str, Any] | None, new: dict[str, Any]) -> str:
    if not isinstance(old, dict) or not isinstance(old.get("config"), dict):
        return f"its {PLAN} cannot be read"
    a, b = old["config"], new["config"]
    changed = [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    gone = sorted(set(old.get("inputs", [])) - set(new["inputs"]))
    added = sorted(set(new["inputs"]) - set(old.get("inputs", [])))
    if gone or added:
        first = f"{gone[0]!r} is gone" if gone else f"{added[0]!r} is new"
        changed.append(f"input files differ ({len(gone)} gone, {len(added)} new: {first})")
    return "; ".join(changed) or "the order of the input files differs"


def _clear_leftovers(out: str) -> None:
    """What a run that completed no shard left: its tokenizer, stats, sources, half-written files."""
    fs = _fs()
    shards.remove_temporaries(out)
    found = [m.path for m in fs.match([fs.join(out, "shard-*.stats.json")])[0].metadata_list]
    found += [p for p in (fs.join(out, TOKENIZER_DIR), fs.join(out, SOURCES)) if fs.exists(p)]
    if found:
        fs.delete(found)


def input_digests(files: list[readers.InputFile]) -> dict[int, str]:
    """Each input file's sha256 (index -> hex), read here with 8 threads (a rerun's check)."""
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(files)))) as pool:
        digests = list(pool.map(lambda f: readers.file_sha256(f.path), files))
    return {f.index: digest for f, digest in zip(files, digests)}


def stale_shards(
    cfg: PrepareConfig, files: list[readers.InputFile], done: set[int], digests: dict[int, str]
) -> set[int]:
    """The complete shards to redo because an input changed since they were written: those that
    hold documents of a file whose digest is not the one they recorded, and those that a changed
    (or unrecorded) file's documents hash to now (an edited file may have more records)."""
    out, n = cfg.output_dir, cfg.num_shards
    stats = {index: shards.read_stats(out, index, n) for index in done}
    stale = {index for index, st in stats.items() if "inputs" not in st}  # written before inputs were recorded
    recorded: dict[int, set[str]] = {}
    for st in stats.values():
        for i, digest in st.get("inputs", {}).items():
            recorded.setdefault(int(i), set()).add(digest)
    now = {i: digest[: shards.DIGEST_CHARS] for i, digest in digests.items()}
    changed = {i for i, seen in recorded.items() if seen != {now.get(i)}}
    stale |= {index for index, st in stats.items() if any(int(i) in changed for i in st.get("inputs", {}))}
    for file in files:
        if file.index in recorded and file.index not in changed:
            continue
        count = (
            1
            if file.format == "text"
            else sum(1 for _ in readers.documents(readers.read_bytes(file.path), file, cfg.text_key))
        )
        stale |= {index for j in range(count) if (index := shards.shard_of(file.index, j, n)) in done}
    return stale


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
    shard not yet complete, then (shard, InputDigest) once for each shard it gave documents, and
    the file's checksum on the "sources" output."""

    def __init__(self, text_key: str, spec: TokenizerSpec, num_shards: int, done: frozenset[int]):
        self.text_key, self.spec, self.num_shards, self.done = text_key, spec, num_shards, done

    def setup(self):
        tokenizer = self.spec.build()
        self._encode = getattr(tokenizer, "encode_array", tokenizer.encode)

    def process(self, file: readers.InputFile):
        try:
            yield from self._read(file)
        except ConfigError:  # a bad record: its file and line are in the message
            raise
        except Exception as e:  # noqa: BLE001 -- named with its file, one line (module doc)
            raise PipelineError(f"reading --input file {file.path!r} failed ({_reason(e)})") from e

    def _read(self, file: readers.InputFile):
        data = readers.read_bytes(file.path)
        digest = readers.sha256(data)
        count = 0
        touched = set()
        for i, text in enumerate(readers.documents(data, file, self.text_key)):
            count += 1
            shard = shards.shard_of(file.index, i, self.num_shards)
            if shard not in self.done:
                touched.add(shard)
                yield shard, (file.index, i, records.document_record(self._encode(text)))
        for shard in touched:
            yield shard, shards.InputDigest(file.index, digest[: shards.DIGEST_CHARS])
        yield beam.pvalue.TaggedOutput("sources", {"path": file.path, "sha256": digest, "documents": count})


class WriteShard(beam.DoFn):
    """(shard, its documents and input digests) -> the shard written (shards.write_shard); yields
    its stats."""

    def __init__(self, cfg: PrepareConfig, bos_id: int, eos_id: int):
        self.out, self.num_shards, self.layout, self.seq_len = cfg.output_dir, cfg.num_shards, cfg.layout, cfg.seq_len
        self.bos_id, self.eos_id = bos_id, eos_id

    def process(self, keyed):
        shard, values = keyed
        docs = [v for v in values if isinstance(v, tuple)]  # None: the key that makes an empty shard exist
        inputs = {v.index: v.digest for v in values if isinstance(v, shards.InputDigest)}
        try:
            stats = shards.write_shard(
                self.out, shard, self.num_shards, docs, self.layout, self.seq_len, self.bos_id, self.eos_id, inputs
            )
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 -- a full disk, a lost permission: named with its shard
            name = shards.shard_name(shard, self.num_shards)
            raise PipelineError(f"writing shard {name} into {self.out!r} failed ({_reason(e)})") from e
        yield {k: v for k, v in stats.items() if k != "inputs"}


class WriteSources(beam.DoFn):
    """Every input file's checksum and document count -> OUTPUT/sources.json."""

    def __init__(self, output_dir: str):
        self.output_dir = output_dir

    def process(self, found: list[dict[str, Any]]):
        ordered = sorted(found, key=lambda s: s["path"])
        shards.write_bytes_atomically(_fs().join(self.output_dir, SOURCES), json.dumps(ordered, indent=1).encode())
        yield len(ordered)


def run_pipeline(
    cfg: PrepareConfig,
    files: list[readers.InputFile],
    spec: TokenizerSpec,
    done: frozenset[int],
    beam_log: str | None = None,
) -> None:
    """The Beam pipeline, in a thread this one waits on (so Ctrl-C is taken at once, and stops
    the worker processes); a failure comes back as one ConfigError or PipelineError."""
    failed: list[BaseException] = []

    def work() -> None:
        try:
            _run_pipeline(cfg, files, spec, done)
        except BaseException as e:  # noqa: BLE001 -- handed to the waiting thread
            failed.append(e)

    thread = threading.Thread(target=work, name="prepare_data pipeline", daemon=True)
    with _output_into(beam_log):
        thread.start()
        try:
            while thread.is_alive():
                thread.join(0.1)
        except KeyboardInterrupt:
            if beam_log is not None:  # Beam's threads report their killed workers; quiet, that is not news
                threading.excepthook = _ignore_thread_error
            stop_workers()
            raise
    if failed:
        raise pipeline_error(failed[0]) from None


def _ignore_thread_error(args: threading.ExceptHookArgs) -> None:
    """threading.excepthook after Ctrl-C: the runner's threads die with their workers, silently."""


@contextlib.contextmanager
def _output_into(path: str | None) -> Iterator[None]:
    """Standard output and error, at the file-descriptor level (so the worker processes Beam
    starts, which inherit them, and its C++ libraries too), into `path` while the block runs."""
    if path is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log):
            os.close(fd)


def _descendants(pid: int) -> list[int]:
    """The processes started under `pid` (Linux /proc; none elsewhere), children first."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{entry.name}/stat", encoding="utf-8", errors="replace") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stop_workers() -> int:
    """Kills the worker processes this process started (the DirectRunner's multi_processing
    workers); returns how many. A shard they were writing is a temporary file the rerun removes."""
    killed = 0
    for pid in reversed(_descendants(os.getpid())):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed


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
    stats = tuple(
        {k: v for k, v in shards.read_stats(cfg.output_dir, i, cfg.num_shards).items() if k != "inputs"}
        for i in range(cfg.num_shards)
    )
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
