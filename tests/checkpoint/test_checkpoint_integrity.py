"""Checksums, finiteness and structure comparison behind the checkpoint manifest."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import tyro
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pax_eqx.checkpoint import CheckpointConfig, all_finite, leaf_summaries
from pax_eqx.checkpoint.integrity import build_manifest, structure_mismatches
from pax_eqx.config import ConfigError


def reference_checksum(x: np.ndarray) -> int:
    """Sum of the array's 32-bit words (narrower dtypes: one zero-extended word per element)."""
    raw = np.ascontiguousarray(x).tobytes()
    width = x.dtype.itemsize if x.dtype.itemsize < 4 else 4
    words = [int.from_bytes(raw[i : i + width], "little") for i in range(0, len(raw), width)]
    return sum(words) % 2**32


@pytest.mark.parametrize(
    "array",
    [
        np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6),
        np.arange(-5, 11, dtype=np.int32),
        np.array([0, 1, 2**32 - 1, 2**31], dtype=np.uint32),  # wraps around 2**32
        np.linspace(-1, 1, 16).astype(ml_dtypes.bfloat16),
        np.array([True, False, True]),
        np.arange(12, dtype=np.int8) - 6,
    ],
    ids=["float32", "int32", "uint32-wrap", "bfloat16", "bool", "int8"],
)
def test_checksum_is_the_sum_of_the_raw_words(array):
    expected = reference_checksum(array)
    on_device = leaf_summaries({"x": jnp.asarray(array)})[0]
    on_host = leaf_summaries({"x": array})[0]
    assert on_device["checksum"] == on_host["checksum"] == expected
    assert on_device["shape"] == list(array.shape) and on_device["dtype"] == str(array.dtype)


def test_checksum_does_not_depend_on_the_sharding():
    host = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    m18 = jax.make_mesh((1, 8), ("a", "b"))
    m24 = jax.make_mesh((2, 4), ("a", "b"))
    placements = [
        jax.device_put(host, NamedSharding(m18, P(None, "b"))),
        jax.device_put(host, NamedSharding(m24, P("a", "b"))),
        jax.device_put(host, NamedSharding(m24, P())),
        jax.device_put(host, jax.devices()[3]),
    ]
    sums = {leaf_summaries([x])[0]["checksum"] for x in placements}
    assert sums == {reference_checksum(host)}


def test_all_finite():
    good = {"w": jnp.ones((3, 3)), "count": jnp.int32(2), "lr": 1e-3, "half": jnp.ones(2, jnp.bfloat16)}
    assert all_finite(good)
    assert not all_finite({**good, "w": jnp.array([1.0, jnp.nan])})
    assert not all_finite({**good, "half": jnp.array([jnp.inf], jnp.bfloat16)})
    assert not all_finite({**good, "lr": float("-inf")})
    assert not all_finite({"m": np.array([np.nan], np.float32)})
    assert all_finite({})


def test_paths_name_every_leaf():
    tree = {"params": {"layers": [jnp.zeros(2), jnp.zeros(3)]}, "step": jnp.int32(0)}
    assert [e["path"] for e in leaf_summaries(tree)] == ["params/layers/0", "params/layers/1", "step"]


def test_structure_mismatches():
    saved = {"w": jnp.zeros((4, 8)), "b": jnp.zeros(8), "old": jnp.zeros(1)}
    manifest = build_manifest(3, leaf_summaries(saved), has_data=False)
    wanted = {
        "w": jax.ShapeDtypeStruct((4, 16), jnp.float32),
        "b": jax.ShapeDtypeStruct((8,), jnp.bfloat16),
        "new": jax.ShapeDtypeStruct((1,), jnp.float32),
    }
    assert structure_mismatches(manifest, wanted) == [  # in jax's (sorted) flattening order
        "b: checkpoint has dtype float32, the model expects bfloat16",
        "new: in the model but not in the checkpoint",
        "w: checkpoint has shape (4, 8), the model expects (4, 16)",
        "old: in the checkpoint but not in the model",
    ]
    assert structure_mismatches(manifest, saved) == []


def test_config_defaults_validation_and_cli():
    cfg = CheckpointConfig()
    assert (cfg.every_n_steps, cfg.max_to_keep, cfg.every_n_seconds, cfg.async_save) == (1000, 3, 0.0, True)
    assert CheckpointConfig.from_json(cfg.replace(max_to_keep=7).to_json()) == cfg.replace(max_to_keep=7)
    with pytest.raises(ConfigError, match="checkpoint.max_to_keep must be >= 0"):
        CheckpointConfig(max_to_keep=-1)
    with pytest.raises(ConfigError, match="did you mean 'every_n_steps'|Did you mean 'every_n_steps'"):
        CheckpointConfig(every_n_step=5)
    parsed = tyro.cli(
        CheckpointConfig,
        args=["--every-n-steps", "50", "--every-n-seconds", "600", "--allow-config-change"],  # bools are flags
    )
    assert parsed == CheckpointConfig(every_n_steps=50, every_n_seconds=600.0, allow_config_change=True)
