"""Which shard a document goes to, and writing one shard so that reruns give identical bytes.

Beam's file sinks number shards by bundle, in no fixed order, and the ArrayRecord sink writes
local files. Here instead:

- a document at position (file index, record index) goes to shard
  blake2b("file:record") mod num_shards: stable across runs, machines and runners, and spread
  evenly however the files are sized;
- a shard's documents are sorted by position before writing, so its records (and, for the
  "rows" layout, its packing) do not depend on which worker read which file first;
- the shard is written to a temporary name beside its final one and renamed, with its stats
  file renamed first: a shard whose final name exists is complete, and a rerun skips it.
  A kill -9 leaves at worst a temporary file, which the next run deletes;
- a shard's stats file lists the input files its documents came from, each with the start of
  its sha256 (`inputs`): a rerun hashes the inputs again and redoes a complete shard one of
  whose files changed since (pipeline.py, `stale_shards`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import uuid
from collections.abc import Iterable
from typing import Any

import numpy as np

from pax_eqx.data.prepare import integrity, records

TMP_PREFIX = ".tmp-"
DIGEST_CHARS = 16  # of an input file's sha256 kept per shard: enough to see it changed


@dataclasses.dataclass(frozen=True)
class InputDigest:
    """Sent to a shard beside its documents: input file `index` (sha256 starting `digest`) gave
    it documents."""

    index: int
    digest: str


def shard_of(file_index: int, record_index: int, num_shards: int) -> int:
    """The shard of the document at (file_index, record_index): a stable hash of its position."""
    digest = hashlib.blake2b(f"{file_index}:{record_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % num_shards


def shard_name(index: int, num_shards: int) -> str:
    return f"shard-{index:05d}-of-{num_shards:05d}.array_record"


def stats_name(index: int, num_shards: int) -> str:
    return shard_name(index, num_shards) + ".stats.json"


def _fs():
    from apache_beam.io.filesystems import FileSystems

    return FileSystems


def is_local(path: str) -> bool:
    return "://" not in path


def shard_files(output_dir: str) -> list[str]:
    """Every complete shard file in `output_dir`, of any shard count (an earlier run's too)."""
    fs = _fs()
    return [m.path for m in fs.match([fs.join(output_dir, "shard-*-of-*.array_record")])[0].metadata_list]


def complete_shards(output_dir: str, num_shards: int) -> set[int]:
    """Shards whose final file exists (their stats file was renamed into place before them)."""
    fs = _fs()
    return {i for i in range(num_shards) if fs.exists(fs.join(output_dir, shard_name(i, num_shards)))}


def remove_temporaries(output_dir: str) -> int:
    """Deletes what a killed run left half-written (`.tmp-*` files); returns how many."""
    fs = _fs()
    found = [m.path for m in fs.match([fs.join(output_dir, TMP_PREFIX + "*")])[0].metadata_list]
    if found:
        fs.delete(found)
    return len(found)


def write_bytes_atomically(path: str, data: bytes) -> None:
    """`data` into `path` through a temporary name in the same directory and a rename."""
    fs = _fs()
    directory, name = path.rsplit("/", 1) if not is_local(path) else os.path.split(path)
    tmp = fs.join(directory, f"{TMP_PREFIX}{uuid.uuid4().hex}-{name}")
    with fs.create(tmp) as f:
        f.write(data)
    if is_local(path):
        os.replace(tmp, path)
    else:
        fs.rename([tmp], [path])


def write_shard(
    output_dir: str,
    index: int,
    num_shards: int,
    documents: Iterable[tuple[int, int, bytes]],
    layout: str,
    seq_len: int,
    bos_id: int,
    eos_id: int,
    inputs: dict[int, str] | None = None,
) -> dict[str, Any]:
    """Writes shard `index` from its documents ((file index, record index, token record), any
    order) and returns its stats {file, records, documents, tokens, bytes, fingerprint, sha256,
    inputs}; `inputs` maps the index of each input file the documents came from to its digest."""
    from array_record.python.array_record_module import ArrayRecordWriter

    docs = sorted(documents, key=lambda d: (d[0], d[1]))
    tokens = [records.document_tokens(d[2]) for d in docs]
    if layout == "rows":
        out = [records.row_record(row) for row in pack_rows(tokens, seq_len, bos_id, eos_id)]
    else:
        out = [d[2] for d in docs]
    name = shard_name(index, num_shards)
    local_dir = output_dir if is_local(output_dir) else None
    fd, local = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{name}-", dir=local_dir)
    os.close(fd)
    os.chmod(local, 0o644)  # mkstemp's 0600 would hide the shards from other users of a shared disk
    try:
        writer = ArrayRecordWriter(local, "group_size:1")
        for record in out:
            writer.write(record)
        writer.close()
        with open(local, "rb") as f:
            data = f.read()
        stats = {
            "file": name,
            "records": len(out),
            "documents": len(docs),
            "tokens": int(sum(len(t) for t in tokens)),
            "bytes": len(data),
            "fingerprint": integrity.fingerprint_bytes(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "inputs": {str(i): digest for i, digest in sorted((inputs or {}).items())},
        }
        fs = _fs()
        write_bytes_atomically(fs.join(output_dir, stats_name(index, num_shards)), json.dumps(stats).encode())
        final = fs.join(output_dir, name)
        if local_dir is not None:
            os.replace(local, final)
        else:
            write_bytes_atomically(final, data)
    finally:
        if os.path.exists(local):
            os.remove(local)
    return stats


def pack_rows(tokens: list[np.ndarray], seq_len: int, bos_id: int, eos_id: int) -> list[dict[str, np.ndarray]]:
    """Documents' tokens, in order, packed into rows of `seq_len` exactly as the reader packs
    documents (lm_examples.pack_documents: [bos] + d / d + [eos], split at row ends)."""
    import grain

    from pax_eqx.data import lm_examples

    examples = grain.MapDataset.source(tokens).map(lambda t: records.document_example(t, bos_id, eos_id))
    return list(lm_examples.pack_documents(examples.to_iter_dataset(), seq_len))


def read_stats(output_dir: str, index: int, num_shards: int) -> dict[str, Any]:
    fs = _fs()
    with fs.open(fs.join(output_dir, stats_name(index, num_shards))) as f:
        return json.loads(f.read())


def remove_shard(output_dir: str, index: int, num_shards: int) -> None:
    """Deletes a complete shard (its file first, so a kill in between leaves it incomplete) and
    its stats file, so the next pipeline writes it again."""
    fs = _fs()
    for name in (shard_name(index, num_shards), stats_name(index, num_shards)):
        path = fs.join(output_dir, name)
        if fs.exists(path):
            fs.delete([path])
