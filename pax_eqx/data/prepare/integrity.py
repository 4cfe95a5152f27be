"""Is a shard file the one its manifest lists? A cheap fingerprint, checked every time a
prepared directory is opened (a training start, a resume, eval, inspect_data).

    fingerprint = sha256(size as 8 bytes little-endian + the first 64 KiB + the last 64 KiB)

written beside the shard's size ("bytes") in manifest.json (prepare_data) and images.json
(prepare_images). Why not the full sha256, which the text manifest also keeps: it reads every
byte, 0.25-0.8 s per 100 MB shard on this project's CPUs (Python's hashlib, 128-400 MB/s
measured), so minutes per start for a corpus of C4's size, at every start and every resume. The
fingerprint reads 128 KiB per shard (0.6 ms for a 100 MB shard, page-cached) whatever its
size, and tells apart what goes wrong with whole files: a shard cut short or grown (its size),
a shard of another preparation copied in (its first records differ), two shards swapped or
copied over each other (each is then another listed shard's fingerprint, which the error says).
What it cannot see is bytes changed in the middle of a shard with its size kept; ArrayRecord's
chunks carry their own hashes (riegeli), checked when the record is read, so such a shard
fails when that record is read rather than at start.

A shard listed with a sha256 but no fingerprint (a corpus prepared before the fingerprint
existed) is checked against its full sha256 instead. Results are kept per process for a file
whose size, inode and modification time did not change, so the several opens of one start cost
one check.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

from pax_eqx.config import ConfigError

BLOCK = 64 * 1024
_CHECKED: dict[tuple[str, int, int, int], str] = {}


class ShardIntegrityError(ConfigError):
    """A shard file that is not the one its manifest lists (cut short, replaced, swapped): found
    when the directory is opened, before anything is read or written."""


def fingerprint_bytes(data: bytes) -> str:
    """The fingerprint of a shard whose whole content is `data` (module doc)."""
    head, tail = data[:BLOCK], data[max(BLOCK, len(data) - BLOCK) :]
    return hashlib.sha256(len(data).to_bytes(8, "little") + head + tail).hexdigest()


def fingerprint_file(path: str) -> str:
    """The fingerprint of the file at `path` (a local path), reading 128 KiB at most."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(BLOCK)
        tail = b""
        if size > BLOCK:
            f.seek(max(BLOCK, size - BLOCK))
            tail = f.read(BLOCK)
    return hashlib.sha256(size.to_bytes(8, "little") + head + tail).hexdigest()


def _sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _found(path: str, kind: str) -> str:
    st = os.stat(path)
    key = (f"{kind}:{path}", st.st_size, st.st_ino, st.st_mtime_ns)
    if key not in _CHECKED:
        _CHECKED[key] = fingerprint_file(path) if kind == "fingerprint" else _sha256_file(path)
    return _CHECKED[key]


def verify_shards(directory: str, shards: Sequence[dict[str, Any]], where: str, fix: str) -> None:
    """Each shard of `shards` ({"file", "bytes", "fingerprint"} or {"file", "sha256"}) at
    `directory` against what the manifest lists; raises one ShardIntegrityError naming the first
    that differs, expected vs found, `where` (e.g. "data.path='DIR'") and `fix`."""
    by_fingerprint = {s["fingerprint"]: s["file"] for s in shards if s.get("fingerprint")}
    for shard in shards:
        path = os.path.join(directory, shard["file"])
        try:
            size = os.path.getsize(path)
        except OSError as e:
            raise ShardIntegrityError(
                f"{where}: shard {shard['file']!r} cannot be opened ({e.strerror or e}); {fix}"
            ) from None
        kind = "fingerprint" if shard.get("fingerprint") else "sha256" if shard.get("sha256") else ""
        if not kind:
            continue
        try:
            found = _found(path, kind)
        except OSError as e:
            raise ShardIntegrityError(
                f"{where}: shard {shard['file']!r} cannot be read ({e.strerror or e}); {fix}"
            ) from None
        expected = shard[kind]
        if found == expected:
            continue
        other = by_fingerprint.get(found) if kind == "fingerprint" else None
        expected_size = shard.get("bytes")
        if other:
            what = f"it holds the bytes of shard {other!r} (two shards swapped, or one copied over another)"
        elif expected_size is not None and size != expected_size:
            change = "cut short" if size < expected_size else "grown or overwritten"
            raise ShardIntegrityError(
                f"{where}: shard {shard['file']!r} cannot be read as prepared: it is {size:,} bytes, its manifest "
                f"lists {expected_size:,} (it was {change}); {fix}"
            )
        else:
            what = "it was replaced or overwritten (another preparation's shard?)"
        raise ShardIntegrityError(
            f"{where}: shard {shard['file']!r} is not the shard its manifest lists: {kind} expected "
            f"{expected[:16]}..., found {found[:16]}...; {what}; {fix}"
        )
