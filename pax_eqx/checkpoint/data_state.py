"""The data iterator's state as a checkpoint holds it: the `data/` item, one JSON file per host.

Each host's iterator is at its own position in its own shard, so each host writes its own state
(grain's orbax handler names the files `process_<i>-of-<n>.json`), and the manifest records the
SHA-256 of every host's file so a restore notices damaged or swapped bytes (see integrity.py).
`IteratorState` is the object grain's handler writes and reads; `every_host_digest` gathers the
digests the manifest records.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from pax_eqx.checkpoint.integrity import sha256


class IteratorState:
    """The data state in the shape grain's orbax handler expects of an iterator.

    grain's `CheckpointHandler` writes `process_<i>-of-<n>.json` from `get_state()` on every host
    (each host's iterator is at its own position in its own shard), and on restore calls
    `set_state()` and `start_prefetch()`. Its bytes branch is the one for iterators whose state
    is already serialised; we hand it the JSON text, so the file is the same JSON that
    `DatasetIterator.get_state()` would produce.
    """

    def __init__(self, state: dict[str, Any] | None = None):
        self.state = state
        self.raw: bytes | None = None

    def get_state(self) -> bytes:
        return json.dumps(self.state, indent=2, sort_keys=True).encode()

    def set_state(self, raw: bytes) -> None:
        self.raw = raw  # checked against the manifest's digest after the restore
        self.state = json.loads(raw.decode())

    def start_prefetch(self) -> None:
        pass


def every_host_digest(data: bytes) -> list[str]:
    """SHA-256 of each host's `data`, indexed by process (a collective with several hosts)."""
    digest = np.frombuffer(bytes.fromhex(sha256(data)), np.uint8)
    if jax.process_count() == 1:
        return [digest.tobytes().hex()]
    gathered = np.asarray(multihost_utils.process_allgather(digest)).reshape(jax.process_count(), -1)
    return [row.astype(np.uint8).tobytes().hex() for row in gathered]
