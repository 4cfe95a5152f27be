"""Helpers of the tests/hf tests: a fixture family's model with its imported weights, and its
logits by the whole-sequence forward and by the KV-cache decode (prefill, then one token a step)."""

from __future__ import annotations

from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from pax_eqx.hf.importer import HfSource
from pax_eqx.layers import Context, Mode

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
FAMILIES = ("llama", "llama3", "mistral", "qwen2", "gemma", "gpt2")
# Attending through a sliding window shorter than the fixtures' 12 tokens (test_windowed_families).
WINDOWED = ("mistral_window", "qwen2_window", "gemma2")


def reference(family: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / family / "reference.npz") as f:
        return {k: f[k] for k in f.files}


def imported_model(directory, model_cfg=None):
    """The model of `directory` (a HF layout) with its weights, on one device."""
    source = HfSource.open(directory)
    cfg = model_cfg or source.model
    abstract = jax.eval_shape(lambda: cfg.build(jax.random.PRNGKey(0)))
    is_leaf = lambda x: isinstance(x, jax.ShapeDtypeStruct)
    arrays, static = eqx.partition(abstract, is_leaf, is_leaf=is_leaf)
    one = NamedSharding(jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",)), PartitionSpec())
    shardings = jax.tree.map(lambda _: one, arrays, is_leaf=is_leaf)
    params = source.load_params(arrays, shardings, cfg)
    return eqx.combine(params, static), source


# One jitted function each, so a model of the same config (imported again, exported and re-imported)
# reuses the compiled program instead of compiling its own.
_forward = eqx.filter_jit(lambda model, ids: model(ids, Context(mode=Mode.EVAL))[0])
_extend_step = eqx.filter_jit(lambda model, *args: model.extend_step(*args))


def forward_logits(model, ids: np.ndarray) -> np.ndarray:
    return np.asarray(_forward(model, jnp.asarray(ids)))


def cached_logits(model, ids: np.ndarray, prefix: int) -> tuple[np.ndarray, np.ndarray]:
    """(the prefill's logits [B, prefix, V], the one-token steps' [B, T - prefix, V])."""
    b, t = ids.shape
    cache = model.init_cache(b, t)
    valid = jnp.ones((b, t), bool)
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    step = lambda *args: _extend_step(model, *args)
    first, cache = step(jnp.asarray(ids[:, :prefix]), cache, jnp.asarray(0), positions[:, :prefix], valid)
    steps = []
    for i in range(prefix, t):
        out, cache = step(jnp.asarray(ids[:, i : i + 1]), cache, jnp.asarray(i), positions[:, i : i + 1], valid)
        steps.append(np.asarray(out))
    return np.asarray(first), np.concatenate(steps, axis=1)
