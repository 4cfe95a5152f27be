"""Adafactor's int8 momentum (`learners/quantized_momentum.py`): the quantization's properties,
the state's shapes and dtypes, its shardings from `opt_state_shardings`, and a checkpoint round
trip. Praxis' numbers are checked in tests/praxis/test_praxis_quantized_momentum.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pax_eqx.checkpoint import CheckpointConfig, Checkpointer
from pax_eqx.learners import AdafactorConfig, LearnerConfig, build_optimizer
from pax_eqx.learners.quantized_momentum import QuantizedMomentumState, dequantize, quantize, quantized_ema
from pax_eqx.sharding.mesh import MeshConfig, build_mesh
from pax_eqx.sharding.rules import opt_state_shardings

RNG = np.random.default_rng(0)
PARAMS = {
    "w": jnp.asarray(RNG.standard_normal((8, 4)), jnp.float32),
    "b": jnp.asarray(RNG.standard_normal((4,)), jnp.float32),
    "k": jnp.asarray(RNG.standard_normal((4, 2, 6)), jnp.float32),
    "s": jnp.asarray(0.5, jnp.float32),
}
INT8_LM = LearnerConfig(
    optimizer=AdafactorConfig(
        decay_method="adam", decay_rate=0.99, beta1=0.9, multiply_by_parameter_scale=False, factored_dims="last",
        momentum_dtype="int8",
    ),
    learning_rate=0.1, weight_decay=1e-2, weight_decay_mask="all",
)  # fmt: skip


def momentum_state(state) -> QuantizedMomentumState:
    found = [s for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, QuantizedMomentumState))
             if isinstance(s, QuantizedMomentumState)]  # fmt: skip
    assert len(found) == 1
    return found[0]


def test_quantize_scales_by_the_first_axis_and_is_idempotent():
    """One scale per slice along axis 0 (its largest magnitude maps to 127), rounding to nearest;
    a dequantized value quantizes back to itself; an all-zero slice keeps a zero scale."""
    x = jnp.asarray(RNG.standard_normal((5, 3, 2)), jnp.float32).at[:, 1, 0].set(0.0)
    values, scales = quantize(x, "int8")
    assert values.dtype == jnp.int8 and scales.shape == (3, 2)
    np.testing.assert_allclose(scales, jnp.max(jnp.abs(x), axis=0) / 127)
    assert int(jnp.max(jnp.abs(values))) == 127 and scales[1, 0] == 0 and jnp.all(values[:, 1, 0] == 0)
    assert float(jnp.max(jnp.abs(dequantize(values, scales) - x) / jnp.maximum(scales, 1e-30)[None])) <= 0.5 + 1e-6
    again = quantize(dequantize(values, scales), "int8")
    np.testing.assert_array_equal(again[0], values)
    np.testing.assert_allclose(again[1], scales, rtol=1e-7)
    assert quantize(x, "int16")[0].dtype == jnp.int16 and int(jnp.max(jnp.abs(quantize(x, "int16")[0]))) == 32767


def test_the_state_keeps_int8_values_and_float32_scales_per_parameter():
    """Values shaped like each parameter (int8; float32 for the 0-D one), scales float32 shaped
    like the parameter less its first dimension ((1,) placeholders where there are none); the
    step's output is the unquantized average, in float32."""
    state = quantized_ema(0.9, "int8").init(PARAMS)
    assert {k: (v.shape, v.dtype) for k, v in state.values.items()} == {
        "w": ((8, 4), jnp.int8), "b": ((4,), jnp.int8), "k": ((4, 2, 6), jnp.int8), "s": ((), jnp.float32),
    }  # fmt: skip
    assert {k: (v.shape, v.dtype) for k, v in state.scales.items()} == {
        "w": ((4,), jnp.float32), "b": ((), jnp.float32), "k": ((2, 6), jnp.float32), "s": ((1,), jnp.float32),
    }  # fmt: skip
    bf16 = quantized_ema(0.9, "bfloat16").init(PARAMS)
    assert all(v.dtype == jnp.bfloat16 for v in bf16.values.values())
    assert all(v.shape == (1,) for v in bf16.scales.values())
    updates, state = jax.jit(quantized_ema(0.9, "int8").update)(PARAMS, state)
    for k in PARAMS:
        np.testing.assert_allclose(updates[k], 0.1 * PARAMS[k], rtol=1e-6)  # 0.9 x 0 + 0.1 x u, unquantized
    np.testing.assert_allclose(dequantize(state.values["w"], state.scales["w"]), 0.1 * PARAMS["w"], atol=1e-3)


def test_opt_state_shardings_give_values_the_parameters_spec_and_scales_its_spec_less_the_first_dim():
    """The int8 values take their parameter's sharding; the scales its spec less dimension 0
    (Praxis' remove_dim(0, ...)); placeholders and counts replicate. Each sharding fits its leaf."""
    mesh = build_mesh(MeshConfig(ici_mesh_shape=(1, 4, 2)))
    p_sh = {
        "w": NamedSharding(mesh, P("fsdp", "tensor")),
        "b": NamedSharding(mesh, P("tensor")),
        "k": NamedSharding(mesh, P("fsdp", None, "tensor")),
        "s": NamedSharding(mesh, P()),
    }
    params = jax.eval_shape(lambda: PARAMS)
    tx = build_optimizer(INT8_LM, params)
    state = jax.eval_shape(tx.init, params)
    shardings = opt_state_shardings(tx, state, params, p_sh, mesh)
    momentum = momentum_state(shardings)
    assert {k: tuple(s.spec) for k, s in momentum.values.items()} == {
        "w": ("fsdp", "tensor"), "b": ("tensor",), "k": ("fsdp", None, "tensor"), "s": (),
    }  # fmt: skip
    assert {k: tuple(s.spec) for k, s in momentum.scales.items()} == {
        "w": ("tensor",),
        "b": (),
        "k": (None, "tensor"),
        "s": (),
    }
    leaves = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
    for a, s in zip(jax.tree.leaves(state), leaves, strict=True):
        jax.device_put(jnp.zeros(a.shape, a.dtype), s)


def test_a_checkpoint_saves_and_restores_the_int8_state(tmp_path):
    """Orbax writes the int8 values and their scales and reads them back bit for bit, as int8."""
    tx = build_optimizer(INT8_LM, PARAMS)
    state = tx.init(PARAMS)
    for _ in range(2):
        updates, state = jax.jit(tx.update)(PARAMS, state, PARAMS)
    train_state = {"params": optax.apply_updates(PARAMS, updates), "opt_state": state}
    assert jnp.any(momentum_state(state).values["w"] != 0)
    ckpt = Checkpointer(tmp_path, CheckpointConfig(async_save=False))
    try:
        ckpt.save(2, train_state, force=True)
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), train_state)
        step, restored, _ = ckpt.restore(abstract, restore_data=False)
    finally:
        ckpt.close()
    assert step == 2 and jax.tree.structure(restored) == jax.tree.structure(train_state)
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(train_state), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert momentum_state(restored).values["k"].dtype == jnp.int8
