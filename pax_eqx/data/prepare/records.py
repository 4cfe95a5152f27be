"""The bytes of one ArrayRecord record of a prepared corpus.

Two layouts (manifest "layout"):

- "documents": one record per document, its token ids (no bos / eos; the reader adds them) as
  little-endian int32. Packed into rows at read time (lm_examples.pack_documents), so one
  prepared corpus serves any sequence length.
- "rows": one record per packed row of `seq_len` positions, four int32 arrays back to back:
  ids, labels, segment_ids, segment_pos (weights are segment_ids > 0). Packing happened once,
  at preparation, in a fixed document order, so every reader sees the same rows.

Raw int32 rather than a serialisation format (protobuf tf.Example, msgpack): a record is read
with one `np.frombuffer`, no parser, and its size says its length.
"""

from __future__ import annotations

import numpy as np
from jaxtyping import Int

from pax_eqx.config import ConfigError

DTYPE = np.dtype("<i4")
ROW_FIELDS = ("ids", "labels", "segment_ids", "segment_pos")


def document_record(tokens: Int[np.ndarray, " n"]) -> bytes:
    """A document's token ids [n] as one record."""
    return np.asarray(tokens, DTYPE).tobytes()


def document_tokens(record: bytes) -> Int[np.ndarray, " n"]:
    """A document record back to its token ids [n] (int32)."""
    return np.frombuffer(record, DTYPE).astype(np.int32)


def document_example(tokens: Int[np.ndarray, " n"], bos_id: int, eos_id: int) -> dict[str, np.ndarray]:
    """A document's tokens [n] as an example before packing, as lm_examples.document_example
    makes from text: ids = [bos] + tokens, labels = tokens + [eos], weights 1, each [n + 1]."""
    tokens = np.asarray(tokens, np.int32)
    return {
        "ids": np.concatenate([[bos_id], tokens]).astype(np.int32),
        "labels": np.concatenate([tokens, [eos_id]]).astype(np.int32),
        "weights": np.ones(len(tokens) + 1, np.float32),
    }


def row_record(row: dict[str, np.ndarray]) -> bytes:
    """A packed row (the five-field LM example of lm_examples.py, each [seq_len]) as one record."""
    return np.stack([np.asarray(row[name], DTYPE) for name in ROW_FIELDS]).tobytes()


def row_example(record: bytes, seq_len: int) -> dict[str, np.ndarray]:
    """A row record back to the five-field LM example, each field [seq_len]."""
    flat = np.frombuffer(record, DTYPE)
    if flat.size != len(ROW_FIELDS) * seq_len:
        raise ConfigError(
            f"a prepared row has {flat.size} int32 values, not {len(ROW_FIELDS)} x seq_len {seq_len}: the shard does "
            "not match its manifest; prepare the corpus again."
        )
    ids, labels, segment_ids, segment_pos = flat.reshape(len(ROW_FIELDS), seq_len).astype(np.int32)
    return {
        "ids": ids,
        "labels": labels,
        "weights": (segment_ids > 0).astype(np.float32),
        "segment_ids": segment_ids,
        "segment_pos": segment_pos,
    }
