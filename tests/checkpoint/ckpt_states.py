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
    """Params sharded over the mesh's "model" axis and an AdamW state with non-zero moments.

    Values are drawn with numpy and placed with device_put (eager jax math on 8 fake devices
    compiles op by op, which would dominate the tests' time).
    """
    m = sharding_mesh if sharding_mesh is not None else mesh()
    rng = np.random.default_rng(seed)
    shardings = {
        "w": NamedSharding(m, P(None, "model")),
        "b": NamedSharding(m, P("model")),
        "scale": NamedSharding(m, P()),
    }
    shapes = {"w": (width, 16), "b": (16,), "scale": (16,)}
    dtypes = {"w": np.float32, "b": np.float32, "scale": jnp.bfloat16}

    def tree():
        return {
            name: jax.device_put(rng.standard_normal(shapes[name]).astype(dtypes[name]), shardings[name])
            for name in shapes
        }

    params = tree()
    adam = optax.adamw(1e-2).init(params)
    opt_state = (adam[0]._replace(count=jnp.asarray(seed, jnp.int32), mu=tree(), nu=tree()), *adam[1:])
    _, nt_state = eqx.nn.make_with_state(eqx.nn.BatchNorm)(4, axis_name="batch", mode="ema")
    return State(
        step=jnp.asarray(seed * 10, jnp.int32),
        params=params,
        nt_state=nt_state,
        opt_state=opt_state,
        ema=tree() if ema else None,
        key=jnp.asarray([0, seed + 100], jnp.uint32),
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
