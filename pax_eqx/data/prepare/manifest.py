"""manifest.json: what a prepared corpus holds, written last by `prepare_data` (its presence
means every shard is complete) and checked by the reader against the experiment.

    {"format": "pax_eqx.prepared.v1", "layout": "documents" | "rows", "seq_len": 0 | N,
     "dtype": "int32", "tokenizer": {"kind", "fingerprint", "vocab_size", "file"},
     "num_records", "num_documents", "num_tokens",
     "shards": [{"file", "records", "documents", "tokens", "bytes", "fingerprint", "sha256"}, ...],
     "sources": [{"path", "sha256", "documents"}, ...], "config": {...the PrepareConfig...}}

`tokens` counts each document's own tokens (no bos / eos); a "rows" shard's `records` are rows.
`bytes` and `fingerprint` (integrity.py) are checked every time the directory is opened; the
full `sha256` is there for whoever wants to check every byte (sha256sum).
Shard files are named relative to the manifest, so a prepared directory can be moved or copied
(to local disk from a bucket) whole.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from pax_eqx.config import ConfigError, MissingFileError

FORMAT = "pax_eqx.prepared.v1"
MANIFEST = "manifest.json"


@dataclasses.dataclass(frozen=True)
class Manifest:
    layout: str
    seq_len: int
    tokenizer: dict[str, Any]
    shards: tuple[dict[str, Any], ...]
    sources: tuple[dict[str, Any], ...]
    config: dict[str, Any]
    dtype: str = "int32"

    @property
    def num_records(self) -> int:
        return sum(s["records"] for s in self.shards)

    @property
    def num_documents(self) -> int:
        return sum(s["documents"] for s in self.shards)

    @property
    def num_tokens(self) -> int:
        return sum(s["tokens"] for s in self.shards)

    def to_json(self) -> str:
        body = {
            "format": FORMAT,
            "layout": self.layout,
            "seq_len": self.seq_len,
            "dtype": self.dtype,
            "tokenizer": self.tokenizer,
            "num_records": self.num_records,
            "num_documents": self.num_documents,
            "num_tokens": self.num_tokens,
            "shards": list(self.shards),
            "sources": list(self.sources),
            "config": self.config,
        }
        return json.dumps(body, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str) -> Manifest:
        try:
            body = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where} is not JSON ({e}); prepare the corpus again.") from None
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            found = body.get("format") if isinstance(body, dict) else type(body).__name__
            raise ConfigError(f"{where} has format {found!r}, not {FORMAT!r}; prepare the corpus again.")
        return cls(
            layout=body["layout"],
            seq_len=int(body["seq_len"]),
            tokenizer=dict(body["tokenizer"]),
            shards=tuple(body["shards"]),
            sources=tuple(body["sources"]),
            config=dict(body.get("config", {})),
            dtype=body.get("dtype", "int32"),
        )


def read_manifest(directory: str, field: str) -> Manifest:
    """The manifest of the prepared corpus at `directory`; errors name `field` (data.path)."""
    import os

    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        raise MissingFileError(
            f"{field}={directory!r} has no {MANIFEST}: it is not a prepared corpus, or its preparation has not "
            "finished; prepare it with python -m pax_eqx.prepare_data --input FILES --output-dir DIR (docs/data.md)."
        )
    with open(path, encoding="utf-8") as f:
        return Manifest.from_json(f.read(), f"{field}={directory!r}: {MANIFEST}")
