"""Parameters built straight from a checkpoint's tensors into their shardings, one at a time.

    params = load_params(abstract_params, shardings, plan, files, family)

Each parameter is a `jax.make_array_from_callback` of its sharding: JAX asks for the block of the
global array each device holds, and the callback reads just the HF tensors that block needs (the
layers of its rows of a stacked [num_layers, ...] leaf), from memory maps of the safetensors files,
converted to the pax_eqx layout and cast to the parameter's dtype. No whole-model copy is ever
made on the host: beside the parameters themselves (their device buffers, which on CPU devices are
host memory), the most held at once is one block of one parameter and the one HF tensor it is
being cut from. benchmarks/hf_import_memory.py measures the peak.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from pax_eqx.hf.safetensors_files import SafetensorsFiles
from pax_eqx.hf.weights import WeightPlan, hf_name_in
from pax_eqx.learners.variables import path_name


def load_params(abstract: Any, shardings: Any, plan: WeightPlan, files: SafetensorsFiles, family: str) -> Any:
    """`abstract` (ShapeDtypeStructs, or arrays whose values are replaced) with every leaf read from
    `files` by `plan`, placed on `shardings` (the same pytree of NamedShardings)."""
    producer = plan.producer()
    names = set(files.names())

    def read_layer(entry, k: int, layer: int | None) -> np.ndarray:
        name = entry.hf.format(i=layer) if layer is not None else entry.hf
        return entry.to_pax(files.read(hf_name_in(names, name, family)))[k]

    def build(path, leaf, sharding):
        if leaf is None:
            return None
        entry, k = producer[path_name(path)]
        dtype = np.dtype(leaf.dtype)

        def block(index: tuple[slice, ...]) -> np.ndarray:
            if not entry.per_layer:
                return np.asarray(read_layer(entry, k, None)[index], dtype)
            rows = range(leaf.shape[0])[index[0]]
            return np.stack([np.asarray(read_layer(entry, k, i)[index[1:]], dtype) for i in rows])

        return jax.make_array_from_callback(tuple(leaf.shape), sharding, block)

    return jax.tree_util.tree_map_with_path(build, abstract, shardings, is_leaf=lambda x: x is None)
