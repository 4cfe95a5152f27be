"""Parameters built straight from a checkpoint's tensors into their shardings, one at a time.

    params = load_params(abstract_params, shardings, plan, files, family)

A parameter that is one HF tensor (the embedding) is a `jax.make_array_from_callback` of its
sharding: JAX asks for the block of the global array each device holds, and the callback cuts it
from a memory map of the safetensors file. A scanned stack's [num_layers, ...] parameter is
allocated in its sharding and filled one layer at a time by a jitted in-place update (its buffer
donated), each layer read from its memory map, converted to the pax_eqx layout and cast to the
parameter's dtype. No whole-model copy is ever made on the host: beside the parameters themselves
(their device buffers, which on CPU devices are host memory), the most held at once is one HF
tensor (and its layout change). benchmarks/hf_import_memory.py measures the peak.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pax_eqx.hf.safetensors_files import HfCheckpointError, SafetensorsFiles
from pax_eqx.hf.weights import WeightPlan, hf_name_in
from pax_eqx.learners.variables import path_name


def load_params(abstract: Any, shardings: Any, plan: WeightPlan, files: SafetensorsFiles, family: str) -> Any:
    """`abstract` (ShapeDtypeStructs, or arrays whose values are replaced) with every leaf read from
    `files` by `plan`, placed on `shardings` (the same pytree of NamedShardings)."""
    producer = plan.producer()
    names = set(files.names())

    def read(entry, k: int, row: int | None, want: tuple[int, ...]) -> np.ndarray:
        name = hf_name_in(names, plan.hf_name(entry, row), family)
        tensor = files.read(name)
        try:
            part = entry.to_pax(tensor)[k]
        except ValueError:  # a reshape that cannot be: the tensor is not the size the config says
            part = None
        if part is None or tuple(part.shape) != want:
            raise HfCheckpointError(
                f"the Hugging Face tensor {name} has shape {tuple(tensor.shape)}, which does not make "
                f"{entry.pax[k]} of shape {want} that the checkpoint's config.json describes; the weights and "
                "config.json are of different models: copy both from the same model."
            )
        return part

    def build(path, leaf, sharding):
        if leaf is None:
            return None
        entry, k = producer[path_name(path)]
        dtype = np.dtype(leaf.dtype)
        if not entry.per_layer:  # each device's block straight from the memory map
            return jax.make_array_from_callback(
                tuple(leaf.shape),
                sharding,
                lambda index: np.asarray(read(entry, k, None, tuple(leaf.shape))[index], dtype),
            )
        # A stacked [num_layers, ...] leaf (or a block position's [num_layers / k, ...], whose row r is
        # layer offset + r * k: plan.hf_name): allocated in its sharding, then filled a layer at a time
        # in place (the buffer is donated), so the host holds one layer's tensor, not the stack.
        stacked = _zeros(tuple(leaf.shape), dtype, sharding)
        for i in range(leaf.shape[0]):
            stacked = _set_row(stacked, np.asarray(read(entry, k, i, tuple(leaf.shape[1:])), dtype), np.int32(i))
        return stacked

    return jax.tree_util.tree_map_with_path(build, abstract, shardings, is_leaf=lambda x: x is None)


def _zeros(shape: tuple[int, ...], dtype: np.dtype, sharding: Any) -> jax.Array:
    return _zeros_program(shape, dtype, sharding)()


@functools.lru_cache(maxsize=64)
def _zeros_program(shape: tuple[int, ...], dtype: np.dtype, sharding: Any):
    """One compiled program per (shape, dtype, sharding): a model's norms, projections and
    biases repeat a few shapes, so an import compiles a few of these, not one per parameter."""
    return jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding)


@functools.partial(jax.jit, donate_argnums=(0,))
def _set_row(stacked: jax.Array, row: jax.Array, i: jax.Array) -> jax.Array:
    """stacked[i] = row, in place: the output keeps the input's buffer and sharding."""
    return jax.lax.dynamic_update_index_in_dim(stacked, row.astype(stacked.dtype), i, axis=0)
