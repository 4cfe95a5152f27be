"""Corpus files -> documents, through Beam's file systems (local paths, gs://, s3://, hdfs://).

Formats (PrepareConfig.format):

- jsonl: one JSON object per line, the document its `text_key` field; plain, .gz or .zst
  (C4's `c4-train.*.json.gz` are this);
- parquet: the `text_key` column of a Parquet file (a Hugging Face dataset's Parquet files);
- hf_dataset: a `datasets` save_to_disk directory: its state.json lists Arrow stream files,
  each read with pyarrow (no `datasets` import, so no cache directory and no hub access);
- text: each file is one document.

A document's position is (index of its file in the sorted input list, index of the record in
its file): stable for the same input, which is what assigns it a shard (shards.py). Each file
is read whole into memory once (one file at a time per worker; C4's are ~40 MB compressed),
hashed for the manifest's source checksums, then decompressed and parsed.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
from collections.abc import Iterator

from pax_eqx.config import ConfigError, MissingFileError

_JSONL = (".jsonl", ".json", ".ndjson")
_COMPRESSED = (".gz", ".zst")
_HF_STATE = "state.json"


@dataclasses.dataclass(frozen=True)
class InputFile:
    """One corpus file: its path, its format (jsonl / parquet / hf_dataset / text) and its index
    in the sorted input list (the first half of every document position)."""

    index: int
    path: str
    format: str


def _filesystems():
    from apache_beam.io.filesystems import FileSystems

    return FileSystems


def list_inputs(spec: str, fmt: str) -> list[InputFile]:
    """The corpus files named by `spec` (comma-separated files, directories, globs), sorted by path."""
    fs = _filesystems()
    found: dict[str, str] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        for path, kind in _expand(fs, part, fmt):
            found[path] = kind
    if not found:
        raise MissingFileError(f"--input {spec!r} names no files.")
    return [InputFile(i, path, found[path]) for i, path in enumerate(sorted(found))]


def _expand(fs, part: str, fmt: str) -> list[tuple[str, str]]:
    state = fs.join(part, _HF_STATE)
    if fmt in ("auto", "hf_dataset") and not _has_magic(part) and fs.exists(state):
        return [(path, "hf_dataset") for path in _hf_arrow_files(fs, part, state)]
    if fmt == "hf_dataset":
        dataset_dict = fs.join(part, "dataset_dict.json")
        splits = ""
        if fs.exists(dataset_dict):
            with fs.open(dataset_dict) as f:
                splits = f" It is a DatasetDict with splits {json.load(f).get('splits')}: give one, e.g. {part}/train."
        raise MissingFileError(f"--input {part!r} is not a `datasets` save_to_disk directory (no {_HF_STATE}).{splits}")
    if _has_magic(part):
        paths = [m.path for m in fs.match([part])[0].metadata_list]
        if not paths:
            raise MissingFileError(f"--input {part!r}: the pattern matches no files.")
    elif "://" not in part and os.path.isdir(part):
        paths = sorted(
            os.path.join(root, name)
            for root, dirs, names in os.walk(part)
            for name in names
            if not name.startswith(".") and not _hidden(os.path.relpath(root, part))
        )
        if not paths:
            raise MissingFileError(f"--input {part!r}: the directory has no files.")
    elif "://" in part and part.endswith("/"):
        paths = [m.path for m in fs.match([part + "**"])[0].metadata_list]
    elif fs.exists(part):
        paths = [part]
    else:
        raise MissingFileError(f"--input {part!r} does not exist; give existing files, directories or globs.")
    return [(path, _format_of(path) if fmt == "auto" else fmt) for path in paths]


def _hidden(relative_dir: str) -> bool:
    return relative_dir != "." and any(d.startswith(".") for d in relative_dir.split(os.sep))


def _has_magic(path: str) -> bool:
    return any(c in path for c in "*?[")


def _hf_arrow_files(fs, root: str, state: str) -> list[str]:
    with fs.open(state) as f:
        files = [entry["filename"] for entry in json.load(f).get("_data_files", [])]
    if not files:
        raise ConfigError(f"--input {root!r}: its {_HF_STATE} lists no data files.")
    return [fs.join(root, name) for name in files]


def _format_of(path: str) -> str:
    name = path.lower()
    for suffix in _COMPRESSED:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    if name.endswith(_JSONL):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(".arrow"):
        return "hf_dataset"
    return "text"


def read_bytes(path: str) -> bytes:
    """The file's raw bytes (compressed as stored), through Beam's file systems."""
    from apache_beam.io.filesystem import CompressionTypes

    with _filesystems().open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return f.read()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def documents(data: bytes, file: InputFile, text_key: str) -> Iterator[str]:
    """The documents of one file's raw bytes, in file order."""
    if file.format == "text":
        yield _decompress(data, file.path).decode("utf-8", errors="replace")
    elif file.format == "jsonl":
        yield from _jsonl_documents(_decompress(data, file.path), file.path, text_key)
    elif file.format == "parquet":
        import pyarrow.parquet as pq

        yield from _column(pq.read_table(io.BytesIO(data)), file.path, text_key)
    elif file.format == "hf_dataset":
        import pyarrow as pa

        yield from _column(pa.ipc.open_stream(io.BytesIO(data)).read_all(), file.path, text_key)
    else:
        raise ConfigError(f"--format {file.format!r} is not one of jsonl, parquet, text, hf_dataset.")


def _decompress(data: bytes, path: str) -> bytes:
    if path.endswith(".gz"):
        return gzip.decompress(data)
    if path.endswith(".zst"):
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
    return data


def _jsonl_documents(data: bytes, path: str, text_key: str) -> Iterator[str]:
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--input: {path!r} line {number} is not JSON ({e}).") from None
        if not isinstance(record, dict) or text_key not in record:
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ConfigError(
                f"--input: {path!r} line {number} has no {text_key!r} field (it has {keys}); set --text-key."
            )
        yield str(record[text_key])


def _column(table, path: str, text_key: str) -> Iterator[str]:
    if text_key not in table.column_names:
        raise ConfigError(
            f"--input: {path!r} has no column {text_key!r} (it has {table.column_names}); set --text-key."
        )
    for value in table.column(text_key).to_pylist():
        yield str(value)
