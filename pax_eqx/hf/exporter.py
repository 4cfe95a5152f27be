"""A pax_eqx model's parameters -> a Hugging Face directory (config.json, safetensors, tokenizer).

    write_hf(out, family, hf_config, our_names, leaf, dtype="bfloat16")

`leaf` gives each parameter by name (`learners.variables` names) as a host array, one at a time:
each HF tensor is made by its Entry's `to_hf` (the exact inverse of the import's layout change),
cast to `dtype`, and written; the files are cut into shards of at most `max_shard_bytes` with a
model.safetensors.index.json, as transformers' save_pretrained writes them, so a large model is
never held whole in host memory.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from pax_eqx.extras import require
from pax_eqx.hf.families import model_config
from pax_eqx.hf.safetensors_files import INDEX_FILE, SINGLE_FILE
from pax_eqx.hf.weights import Dims, WeightPlan, weight_plan

save_file = require("safetensors.numpy", "hf", "python -m pax_eqx.export_hf").save_file

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
CONFIG_DTYPE = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def write_hf(
    out: Path,
    family: str,
    hf_config: dict[str, Any],
    our_names: list[str],
    leaf: Callable[[str], np.ndarray],
    dtype: str = "float32",
    max_shard_bytes: int = 5 * 2**30,
    check: Callable[[WeightPlan], None] | None = None,
) -> list[str]:
    """Writes the model into `out`; returns the files written. `leaf(name)` gives one parameter.
    check: called with the weight plan before anything is written (`ExportLeaves.check_written`:
    a model trained here must have every weight mapped)."""
    model, _ = model_config(hf_config)
    dims = Dims(model.model_dims, model.num_heads, model.num_kv_heads or model.num_heads, model.head_dim)
    plan = weight_plan(family, dims, model.num_layers, our_names, not model.separate_embedding)
    if check is not None:
        check(plan)
    np_dtype = DTYPES[dtype]
    prefix = "transformer." if family == "gpt2" else ""
    out.mkdir(parents=True, exist_ok=True)
    written: list[tuple[Path, list[str]]] = []
    current: dict[str, np.ndarray] = {}
    size = total = 0

    def flush() -> None:
        path = out / f".shard-{len(written)}.safetensors.tmp"
        save_file(current, str(path), metadata={"format": "pt"})
        written.append((path, list(current)))
        current.clear()

    for entry in plan.entries:
        arrays = [leaf(name) for name in entry.pax]
        for i, name in enumerate(plan.hf_names(entry)):
            parts = tuple(a[i] for a in arrays) if entry.per_layer else tuple(arrays)
            tensor = np.ascontiguousarray(entry.to_hf(parts).astype(np_dtype))
            if current and size + tensor.nbytes > max_shard_bytes:
                flush()
                size = 0
            current[prefix + name] = tensor
            size += tensor.nbytes
            total += tensor.nbytes
        del arrays
    flush()
    if len(written) == 1:
        written[0][0].rename(out / SINGLE_FILE)
        files = [SINGLE_FILE]
    else:
        files = [f"model-{i + 1:05d}-of-{len(written):05d}.safetensors" for i in range(len(written))]
        weight_map = {}
        for file, (path, names) in zip(files, written):
            path.rename(out / file)
            weight_map.update({name: file for name in names})
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    config = dict(hf_config)
    for key in ("torch_dtype", "dtype"):
        config.pop(key, None)
    config["torch_dtype"] = CONFIG_DTYPE[dtype]
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return files


def copy_tokenizer(tokenizer_dir: Path, out: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"):
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, out / name)
