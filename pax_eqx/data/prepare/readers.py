"""Corpus files -> documents, through Beam's file systems (local paths, gs://, s3://, hdfs://).

Formats (PrepareConfig.format):

- jsonl: one JSON object per line, the document its `text_key` field; plain, .gz or .zst
  (C4's `c4-train.*.json.gz` are this);
- parquet: the `text_key` column of a Parquet file (a Hugging Face dataset's Parquet files);
- hf_dataset: a `datasets` save_to_disk directory: its state.json lists Arrow stream files,
  each read with pyarrow (no `datasets` import, so no cache directory and no hub access);
- text: each file is one document.

Strict, so that what is prepared is what the corpus says: a text must be a string (JSON null, a
number or a list in the text field is refused, naming the file, the line and the type, not
written as 'None' / '123'); files are UTF-8 (a byte that is not is refused with its line, so a
binary file never becomes U+FFFD documents); a file that is not the format it is read as
(Parquet that is not, a gzip cut short) is one error naming the file and --format. Each of these
is a ConfigError: the command exits 2, naming the first bad record.

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
import zlib
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


def list_inputs(spec: str, fmt: str, exclude: str = "") -> list[InputFile]:
    """The corpus files named by `spec` (comma-separated files, directories, globs), sorted by
    path. Files under `exclude` (the output directory, when it lies inside an input directory)
    are not inputs: a rerun would otherwise read the shards of the first run as corpus."""
    fs = _filesystems()
    found: dict[str, str] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        for path, kind in _expand(fs, part, fmt):
            if not (exclude and _under(path, exclude)):
                found[path] = kind
    if not found:
        inside = f" (the files under --output-dir {exclude!r} are not inputs)" if exclude else ""
        raise MissingFileError(f"--input {spec!r} names no files{inside}.")
    unreadable = [p for p in found if "://" not in p and not os.access(p, os.R_OK)]
    if unreadable:
        raise ConfigError(
            f"--input: {unreadable[0]!r} cannot be read (permission denied){_and_more(unreadable)}; make it readable "
            "by this user, or leave it out of --input."
        )
    return [InputFile(i, path, found[path]) for i, path in enumerate(sorted(found))]


def _and_more(paths: list[str]) -> str:
    return f" (and {len(paths) - 1} more)" if len(paths) > 1 else ""


def _under(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or inside it (local paths compared after resolving links)."""
    if "://" in path or "://" in directory:
        return path == directory or path.startswith(directory.rstrip("/") + "/")
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


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


def file_sha256(path: str) -> str:
    """The sha256 of the file's raw bytes (what `sha256(read_bytes(path))` gives), read in blocks."""
    from apache_beam.io.filesystem import CompressionTypes

    digest = hashlib.sha256()
    with _filesystems().open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def documents(data: bytes, file: InputFile, text_key: str) -> Iterator[str]:
    """The documents of one file's raw bytes, in file order (each a string; module doc)."""
    if file.format == "text":
        yield _utf8_text(_decompress(data, file.path), file.path)
    elif file.format == "jsonl":
        yield from _jsonl_documents(_decompress(data, file.path), file.path, text_key)
    elif file.format == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(io.BytesIO(data))
        except (pa.ArrowException, OSError) as e:
            raise ConfigError(f"--input: {file.path!r} cannot be read as Parquet ({_reason(e)}){_FORMAT_FIX}") from None
        yield from _column(table, file.path, text_key)
    elif file.format == "hf_dataset":
        import pyarrow as pa

        try:
            table = pa.ipc.open_stream(io.BytesIO(data)).read_all()
        except (pa.ArrowException, OSError) as e:
            raise ConfigError(
                f"--input: {file.path!r} cannot be read as an Arrow stream, the data file of a `datasets` directory "
                f"({_reason(e)}); save the dataset again with save_to_disk."
            ) from None
        yield from _column(table, file.path, text_key)
    else:
        raise ConfigError(f"--format {file.format!r} is not one of jsonl, parquet, text, hf_dataset.")


_FORMAT_FIX = (
    "; it is not a Parquet file: give the --format it is written in (jsonl, text), or --format auto to choose by "
    "its name."
)


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    first = text[0].replace("Could not open Parquet input source '<Buffer>': ", "") if text else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _decompress(data: bytes, path: str) -> bytes:
    if path.endswith(".gz"):
        try:
            return gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise ConfigError(
                f"--input: {path!r} is not a complete gzip file ({_reason(e)}); copy it again (or, if it is not "
                "compressed, rename it without .gz)."
            ) from None
    if path.endswith(".zst"):
        import zstandard

        try:
            return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
        except zstandard.ZstdError as e:
            raise ConfigError(
                f"--input: {path!r} is not a complete zstd file ({_reason(e)}); copy it again (or, if it is not "
                "compressed, rename it without .zst)."
            ) from None
    return data


def _utf8_text(data: bytes, path: str) -> str:
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise _utf8_error(path, data, line, column, data[e.start]) from None


def _utf8_error(path: str, data: bytes, line: int, column: int, byte: int) -> ConfigError:
    """One error for bytes that are not UTF-8: the file, the line and column, the byte, the fix."""
    what = "a binary file" if b"\x00" in data[:8192] else "text in another encoding"
    return ConfigError(
        f"--input: {path!r} line {line} is not UTF-8 (byte 0x{byte:02x} at column {column}; {what}?); convert it "
        "to UTF-8, or leave it out of --input."
    )


_JSON_TYPES = {
    type(None): "null",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    list: "a list",
    dict: "an object",
}


def _jsonl_documents(data: bytes, path: str, text_key: str) -> Iterator[str]:
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _utf8_error(path, data, number, e.start + 1, raw[e.start]) from None
        try:
            record = json.loads(line.removeprefix("\ufeff") if number == 1 else line)
        except (json.JSONDecodeError, RecursionError) as e:
            raise ConfigError(f"--input: {path!r} line {number} is not JSON ({_reason(e)}).") from None
        if not isinstance(record, dict) or text_key not in record:
            keys = sorted(record) if isinstance(record, dict) else _JSON_TYPES.get(type(record), "a value")
            raise ConfigError(
                f"--input: {path!r} line {number} has no {text_key!r} field (it has {keys}); set --text-key."
            )
        text = record[text_key]
        if not isinstance(text, str):
            raise ConfigError(
                f"--input: {path!r} line {number}: its {text_key!r} is {_JSON_TYPES.get(type(text), 'a value')}"
                f"{'' if text is None else f' ({json.dumps(text)[:40]})'}, not a string; a document's text must be a "
                "JSON string: fix the record, or set --text-key to the field that holds the text."
            )
        yield text


def _column(table, path: str, text_key: str) -> Iterator[str]:
    import pyarrow as pa

    if text_key not in table.column_names:
        raise ConfigError(
            f"--input: {path!r} has no column {text_key!r} (it has {table.column_names}); set --text-key."
        )
    column = table.column(text_key)
    kind = column.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or str(kind) == "string_view"):
        raise ConfigError(
            f"--input: {path!r}: column {text_key!r} holds {kind}, not strings; set --text-key to the column that "
            "holds the text."
        )
    values = column.to_pylist()
    if column.null_count:
        row = values.index(None)
        raise ConfigError(
            f"--input: {path!r} row {row}: its {text_key!r} is null ({column.null_count} null in all), not a "
            "string; fill or drop those rows."
        )
    yield from values
