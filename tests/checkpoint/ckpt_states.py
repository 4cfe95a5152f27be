"""Small train-state-like pytrees for the checkpoint tests (8 fake CPU devices, see conftest)."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P


class State(eqx.Module):
    """Shaped like pax_eqx's TrainState: params, non-trainable state, optimizer state, EMA, key."""

    step: Any
    params: Any
    nt_state: Any
    opt_state: Any
    ema: Any
    key: Any


def mesh(shape=(1, 8)):
    return jax.make_mesh(shape, ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


def make_state(seed: int = 0, sharding_mesh=None, *, ema: bool = False, width: int = 8) -> State:
    """Params sharded over the mesh's "model" axis; an AdamW state with moments that are not zero."""
    m = sharding_mesh if sharding_mesh is not None else mesh()
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    params = {
        "w": jax.device_put(jax.random.normal(k1, (width, 16)), NamedSharding(m, P(None, "model"))),
        "b": jax.device_put(jax.random.normal(k2, (16,)), NamedSharding(m, P("model"))),
        "scale": jnp.ones((16,), jnp.bfloat16) * (seed + 1),
    }
    opt = optax.adamw(1e-2)
    opt_state = opt.init(params)
    grads = jax.tree.map(lambda p: jnp.ones_like(p) * 0.5, params)
    _, opt_state = opt.update(grads, opt_state, params)
    bn, nt_state = eqx.nn.make_with_state(eqx.nn.BatchNorm)(4, axis_name="batch", mode="ema")
    del bn
    return State(
        step=jnp.int32(seed * 10),
        params=params,
        nt_state=nt_state,
        opt_state=opt_state,
        ema=jax.tree.map(lambda p: p * 0.9, params) if ema else None,
        key=jax.random.PRNGKey(seed + 100),
    )


def abstract(state: Any, sharding_for=None) -> Any:
    """ShapeDtypeStructs with shardings; `sharding_for(leaf)` picks a new sharding (default: keep)."""

    def one(x):
        sharding = sharding_for(x) if sharding_for else x.sharding
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    return jax.tree.map(one, state)


def assert_same(a: Any, b: Any) -> None:
    """Same structure, dtypes and bits (not just close)."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
