"""The tensors of a Hugging Face checkpoint directory, read one at a time without loading a file.

    files = SafetensorsFiles.open("Llama-3.1-8B")          # model.safetensors, or the shards its
    files.shape("model.embed_tokens.weight")                #   model.safetensors.index.json lists
    w = files.read("model.layers.0.self_attn.q_proj.weight")   # a read-only memory map, [out, in]

A safetensors file is an 8-byte little-endian header length, a JSON header ({name: {dtype,
shape, data_offsets}}) and the raw tensors. Each `read` is a numpy memory map of one tensor's
bytes, so nothing is read until it is used, a slice of it reads only that slice, and the
page cache (not this process's heap) holds what was read. The `safetensors` package's own numpy
reader is not used for reading because it cannot return bfloat16 (numpy has no such dtype; the
published Llama, Mistral, Qwen2 and Gemma checkpoints are bfloat16); `ml_dtypes.bfloat16`, which
JAX itself uses, can.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from pax_eqx.config import ConfigError, MissingFileError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
}  # fmt: skip


class HfCheckpointError(ConfigError):
    """The Hugging Face directory cannot be read as given (a user error: exit 2)."""


@dataclass(frozen=True)
class TensorEntry:
    file: Path
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int  # of its first byte in the file

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def read_header(file: Path) -> dict[str, TensorEntry]:
    """{tensor name: entry} of one .safetensors file (its `__metadata__` left out)."""
    try:
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > os.path.getsize(file):
                raise ValueError(f"a header of {length} bytes in a file of {os.path.getsize(file)}")
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error) as e:
        raise HfCheckpointError(f"{str(file)!r} is not a safetensors file ({e}).") from None
    start = 8 + length
    size = os.path.getsize(file)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in DTYPES:
            raise HfCheckpointError(
                f"{str(file)!r}: tensor {name!r} has dtype {info['dtype']}, which is not supported."
            )
        begin, end = info["data_offsets"]
        if start + end > size:  # an interrupted download or copy: the memory map would fail mid-import
            raise HfCheckpointError(
                f"{str(file)!r} is cut short: tensor {name!r} ends at byte {start + end:,} of a {size:,}-byte file; "
                "download or copy it again."
            )
        out[name] = TensorEntry(file, np.dtype(DTYPES[info["dtype"]]), tuple(info["shape"]), start + begin)
    return out


class SafetensorsFiles:
    """Every tensor of a checkpoint directory by name, from model.safetensors or the shards its
    index names (or, with neither, every *.safetensors file in it)."""

    def __init__(self, entries: dict[str, TensorEntry]):
        self.entries = entries

    @classmethod
    def open(cls, directory: str | os.PathLike) -> SafetensorsFiles:
        d = Path(directory)
        if (d / INDEX_FILE).is_file():
            index = json.loads((d / INDEX_FILE).read_text())
            files = sorted(set(index.get("weight_map", {}).values()))
            missing = [f for f in files if not (d / f).is_file()]
            if missing:
                raise MissingFileError(
                    f"{str(d / INDEX_FILE)!r} names shards that are not there: {', '.join(missing)}."
                )
        elif (d / SINGLE_FILE).is_file():
            files = [SINGLE_FILE]
        else:
            files = sorted(p.name for p in d.glob("*.safetensors"))
        if not files:
            found = sorted(p.name for p in d.glob("*.bin")) + sorted(p.name for p in d.glob("*.pt*"))
            hint = (
                f" (it holds {', '.join(found[:3])}: PyTorch pickles, which are not read; convert them to safetensors)"
                if found
                else ""
            )
            raise MissingFileError(f"{str(d)!r} holds no *.safetensors files{hint}.")
        entries: dict[str, TensorEntry] = {}
        for name in files:
            entries.update(read_header(d / name))
        return cls(entries)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def names(self) -> list[str]:
        return sorted(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name].shape

    def read(self, name: str) -> np.ndarray:
        """The tensor as a read-only memory map (bytes are read when used)."""
        e = self.entries[name]
        if 0 in e.shape:
            return np.zeros(e.shape, e.dtype)
        return np.memmap(e.file, dtype=e.dtype, mode="r", offset=e.offset, shape=e.shape or (1,)).reshape(e.shape)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())
