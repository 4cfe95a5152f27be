"""Document sources: local text files, JSON lines, and in-memory arrays, as grain datasets.

Nothing is downloaded: every path is local, and a missing or empty one is an error that names
the config field (`data.path`, `data.eval_path`) and how to fix it.

`path` may be a file, a directory (every file under it, recursively, in sorted order), a glob,
or several of these separated by commas.

- text files: each file is one document. Without `data.eval_path`, the eval split is the last
  `eval_fraction` of each file (cut at a blank line if there is one, else at a line), the
  train split the rest.
- JSON lines: each line is a JSON object and one document (its `data.jsonl_text_key` field).
  Lines are read lazily through a byte-offset index (8 bytes a record in memory), so large
  files work. Without `data.eval_path`, every k-th record (k = round(1 / eval_fraction)) is
  held out for eval.
- JSON-lines pairs (seq2seq): the same files and split, each record an (inputs, targets) pair
  of its `data.jsonl_inputs_key` and `data.jsonl_targets_key` fields.
- arrays: a dict of equal-length arrays; example i is {name: array[i]}.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grain
import numpy as np

from pax_eqx.config import ConfigError, MissingFileError

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


def resolve_paths(spec: str, field: str, *, suffixes: Sequence[str] = ()) -> list[Path]:
    """Files named by `spec` (files, directories, globs; comma-separated); errors name `field`."""
    if not spec.strip():
        raise ConfigError(
            f"{field} is empty; set it to a local file, directory or glob of the training text "
            f"(e.g. --{field} /path/to/corpus), or train without files: --data.source synthetic."
        )
    files: list[Path] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        matches = sorted(glob.glob(os.path.expanduser(part), recursive=True)) if glob.has_magic(part) else [part]
        if not matches:
            raise MissingFileError(f"{field}={spec!r}: the pattern {part!r} matches no files.")
        for match in matches:
            path = Path(os.path.expanduser(match))
            if path.is_dir():
                found = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
                if suffixes:
                    found = [p for p in found if p.name.endswith(tuple(suffixes))]
                if not found:
                    kinds = f" ({', '.join(suffixes)})" if suffixes else ""
                    raise MissingFileError(f"{field}={spec!r}: the directory {str(path)!r} has no data files{kinds}.")
                files.extend(found)
            elif path.is_file():
                files.append(path)
            else:
                raise MissingFileError(
                    f"{field}={spec!r}: {str(path)!r} does not exist; give an existing local file, directory or glob "
                    "(nothing is downloaded at run time)."
                )
    if not files:
        raise ConfigError(f"{field}={spec!r} names no files.")
    return files


def split_text_tail(text: str, fraction: float) -> tuple[str, str]:
    """(head, tail): the tail is about the last `fraction` of `text`, cut after a blank line if one
    is near (within 5% of the text), else after a line end, else at a character. head + tail == text."""
    target = int(len(text) * (1.0 - fraction))
    near = max(len(text) // 20, 200)
    for sep in ("\n\n", "\n"):
        for cut in (text.find(sep, target, target + near), text.rfind(sep, max(target - near, 0), target)):
            if cut >= 0 and text[: cut + len(sep)].strip() and text[cut + len(sep) :].strip():
                return text[: cut + len(sep)], text[cut + len(sep) :]
    return text[:target], text[target:]


def text_file_documents(spec: str, field: str, split: str | None, eval_fraction: float) -> list[str]:
    """One document per file; `split` "train"/"eval" keeps the head/tail of each, None all of it."""
    docs = []
    for path in resolve_paths(spec, field):
        text = path.read_text(encoding="utf-8", errors="replace")
        if split is not None:
            head, tail = split_text_tail(text, eval_fraction)
            text = head if split == "train" else tail
        if text.strip():
            docs.append(text)
    if not docs:
        if split == "eval":
            raise ConfigError(
                f"{field}={spec!r}: the held-out eval part is empty; set data.eval_path or raise data.eval_fraction."
            )
        raise ConfigError(f"{field}={spec!r}: the files are empty; point {field} at files that hold text.")
    return docs


class JsonlRecords(grain.sources.RandomAccessDataSource):
    """Records of JSON-lines files, read lazily by byte offset: source[i] is record i's text (its
    `text_key` field), or a tuple of texts if `text_key` is a tuple of keys. `key_field` names the
    config field(s) that set the key(s), for errors."""

    def __init__(
        self,
        paths: Sequence[Path],
        text_key: str | tuple[str, ...],
        field: str,
        key_field: str | tuple[str, ...] = "data.jsonl_text_key",
    ):
        self._paths = [str(p) for p in paths]
        self._text_key = text_key
        self._keys = (text_key,) if isinstance(text_key, str) else tuple(text_key)
        self._key_fields = (key_field,) if isinstance(key_field, str) else tuple(key_field)
        self._field = field
        file_ids, offsets = [], []
        for i, path in enumerate(self._paths):
            starts = _line_starts(path)
            offsets.append(starts)
            file_ids.append(np.full(len(starts), i, np.int32))
        self._file_ids = np.concatenate(file_ids) if file_ids else np.zeros(0, np.int32)
        self._offsets = np.concatenate(offsets) if offsets else np.zeros(0, np.int64)
        if len(self._offsets) == 0:
            raise ConfigError(f"{field}: the JSON-lines files {self._paths} have no records.")

    def __len__(self) -> int:
        return len(self._offsets)

    def __getitem__(self, index: int) -> str | tuple[str, ...]:
        path = self._paths[int(self._file_ids[index])]
        with open(path, "rb") as f:
            f.seek(int(self._offsets[index]))
            line = f.readline()
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(
                f"{self._field}: {path!r} record at byte {self._offsets[index]} is not JSON ({e})."
            ) from None
        for key, key_field in zip(self._keys, self._key_fields):
            if not isinstance(record, dict) or key not in record:
                keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise ConfigError(
                    f"{self._field}: {path!r} record at byte {self._offsets[index]} has no {key!r} field "
                    f"(it has {keys}); set {key_field}."
                )
        if isinstance(self._text_key, str):
            return str(record[self._text_key])
        return tuple(str(record[key]) for key in self._keys)

    def __repr__(self) -> str:
        return f"JsonlRecords({len(self)} records in {len(self._paths)} file(s))"


def _line_starts(path: str) -> np.ndarray:
    """Byte offsets of the non-empty lines of a file (read in 16 MiB chunks)."""
    newline_chunks = []
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            newline_chunks.append(np.flatnonzero(np.frombuffer(chunk, np.uint8) == ord("\n")) + size)
            size += len(chunk)
    newlines = np.concatenate(newline_chunks) if newline_chunks else np.zeros(0, np.int64)
    starts = np.concatenate([[0], newlines + 1]).astype(np.int64)
    ends = np.concatenate([newlines, [size]]).astype(np.int64)
    return starts[ends > starts]


def jsonl_documents(spec: str, field: str, text_key: str, split: str | None, eval_fraction: float) -> grain.MapDataset:
    """A MapDataset of document strings; `split` holds out every k-th record for eval."""
    source = JsonlRecords(resolve_paths(spec, field, suffixes=JSONL_SUFFIXES), text_key, field)
    return held_out_records(source, spec, field, split, eval_fraction)


def jsonl_pairs(
    spec: str, field: str, inputs_key: str, targets_key: str, split: str | None, eval_fraction: float
) -> grain.MapDataset:
    """A MapDataset of (inputs, targets) strings, the records' `inputs_key` and `targets_key`
    fields; `split` holds out every k-th record for eval, as `jsonl_documents`."""
    source = JsonlRecords(
        resolve_paths(spec, field, suffixes=JSONL_SUFFIXES),
        (inputs_key, targets_key),
        field,
        key_field=("data.jsonl_inputs_key", "data.jsonl_targets_key"),
    )
    return held_out_records(source, spec, field, split, eval_fraction)


def held_out_records(
    source: grain.sources.RandomAccessDataSource, spec: str, field: str, split: str | None, eval_fraction: float
) -> grain.MapDataset:
    """All records of `source` (split None), every k-th (eval) or the rest (train); k =
    round(1 / eval_fraction). `spec` and `field` name the files in errors."""
    ds = grain.MapDataset.source(source)
    if split is None:
        return ds
    k = max(2, round(1.0 / eval_fraction))
    if len(source) < k:
        raise ConfigError(
            f"{field}={spec!r} has {len(source)} record(s), too few to hold out 1 in {k} for eval; "
            "add records or set data.eval_path."
        )
    if split == "eval":
        return ds[k - 1 :: k]
    keep = np.flatnonzero(np.arange(len(source)) % k != k - 1)
    return grain.MapDataset.source(_Subset(source, keep))


def array_examples(arrays: dict[str, Any]) -> grain.MapDataset:
    """A MapDataset of examples {name: arrays[name][i]} from equal-length arrays."""
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    lengths = {k: len(v) for k, v in arrays.items()}
    if not arrays or len(set(lengths.values())) != 1:
        raise ValueError(f"array_examples needs a non-empty dict of equal-length arrays, got lengths {lengths}.")
    return grain.MapDataset.source(_ArraySource(arrays))


class _ArraySource(grain.sources.RandomAccessDataSource):
    def __init__(self, arrays: dict[str, np.ndarray]):
        self._arrays = arrays
        self._len = len(next(iter(arrays.values())))

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {k: v[index] for k, v in self._arrays.items()}


class _Subset(grain.sources.RandomAccessDataSource):
    """source[indices[i]] for i in range(len(indices))."""

    def __init__(self, source: Any, indices: np.ndarray):
        self._source = source
        self._indices = indices

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, index: int) -> Any:
        return self._source[int(self._indices[index])]
