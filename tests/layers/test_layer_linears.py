"""Linear, Bias, FeedForward (plain and gated) and MLPBlock against numpy formulas."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import TypeCheckError
from layer_reference import key, random_normal
from tolerances import assert_matches_reference, assert_same_math

from pax_eqx.config import ConfigError
from pax_eqx.layers import (
    ActivationConfig,
    BiasConfig,
    FeedForwardConfig,
    LinearConfig,
    MLPBlockConfig,
    geglu,
    swiglu,
)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _x(shape, seed=1):
    return random_normal(shape, seed)


def _with_random(module, *paths, seed=7):
    """Gives the named (zero-initialised) arrays random values, so biases are really tested."""
    for i, path in enumerate(paths):
        leaf = path(module)
        module = eqx.tree_at(path, module, random_normal(leaf.shape, seed + i))
    return module


def test_linear_shapes_and_formula():
    lin = LinearConfig(input_dims=3, output_dims=5).build(key(0))
    assert lin.w.shape == (3, 5)
    x = _x((2, 4, 3))
    y = lin(x)
    assert y.shape == (2, 4, 5)
    assert_matches_reference(y, np.asarray(x) @ np.asarray(lin.w), rtol=1e-5, atol=1e-6)


def test_linear_xavier_init_is_within_pax_limit():
    lin = LinearConfig(input_dims=30, output_dims=50).build(key(0))
    limit = math.sqrt(6.0 / (30 + 50))
    assert float(jnp.max(jnp.abs(lin.w))) <= limit
    assert float(jnp.max(jnp.abs(lin.w))) > 0.9 * limit  # uniform over the whole range


def test_linear_keeps_the_input_dtype():
    lin = LinearConfig(input_dims=3, output_dims=2).build(key(0))
    assert lin(_x((4, 3)).astype(jnp.bfloat16)).dtype == jnp.bfloat16


def test_linear_jit_and_grad_match_formula():
    lin = LinearConfig(input_dims=3, output_dims=2).build(key(0))
    x = _x((4, 3))
    assert_same_math(eqx.filter_jit(lambda m, x: m(x))(lin, x), lin(x))
    grads = eqx.filter_grad(lambda m: jnp.sum(m(x)))(lin)
    # d/dw_io sum_bo (x w)_bo = sum_b x_bi, the same for every output column o.
    expected = np.repeat(np.asarray(x).sum(0)[:, None], 2, axis=1)
    np.testing.assert_allclose(grads.w, expected, rtol=1e-5)


def test_linear_wrong_input_dims_is_a_type_error():
    lin = LinearConfig(input_dims=3, output_dims=2).build(key(0))
    with pytest.raises(TypeCheckError):
        lin(jnp.ones((4, 5)))


def test_bias_formula_and_type_check():
    bias = _with_random(BiasConfig(dims=4).build(), lambda m: m.b)
    np.testing.assert_array_equal(BiasConfig(dims=4).build().b, np.zeros(4))
    x = _x((2, 3, 4))
    np.testing.assert_allclose(bias(x), np.asarray(x) + np.asarray(bias.b), rtol=1e-6)
    with pytest.raises(TypeCheckError):
        bias(jnp.ones((2, 5)))


@pytest.mark.parametrize("has_bias", [True, False])
def test_feedforward_relu_formula(has_bias):
    ff = FeedForwardConfig(input_dims=3, output_dims=4, has_bias=has_bias).build(key(0))
    assert ff.gate is None and ff.gate_bias is None
    assert (ff.bias is not None) == has_bias
    if has_bias:
        ff = _with_random(ff, lambda m: m.bias.b)
    x = np.asarray(_x((5, 3)))
    pre = x @ np.asarray(ff.linear.w) + (np.asarray(ff.bias.b) if has_bias else 0.0)
    assert_matches_reference(ff(jnp.asarray(x)), np.maximum(pre, 0.0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("act, fn", [(geglu(), _gelu_tanh), (swiglu(), _silu)], ids=["geglu", "swiglu"])
def test_feedforward_gated_formula(act, fn):
    ff = FeedForwardConfig(input_dims=3, output_dims=4, activation=act).build(key(0))
    ff = _with_random(ff, lambda m: m.bias.b, lambda m: m.gate_bias.b)
    assert not np.allclose(ff.gate.w, ff.linear.w)  # two independent projections
    x = np.asarray(_x((2, 5, 3)), np.float64)
    gate = x @ np.asarray(ff.gate.w) + np.asarray(ff.gate_bias.b)
    value = x @ np.asarray(ff.linear.w) + np.asarray(ff.bias.b)
    assert_matches_reference(ff(jnp.asarray(x, jnp.float32)), fn(gate) * value, rtol=1e-5, atol=1e-6)


def test_feedforward_grad_reaches_every_weight():
    ff = FeedForwardConfig(input_dims=3, output_dims=4, activation=swiglu()).build(key(0))
    x = _x((6, 3))
    grads = eqx.filter_grad(lambda m: jnp.sum(m(x) ** 2))(ff)
    for g in jax.tree.leaves(grads):
        assert np.all(np.isfinite(g)) and np.any(g != 0)


@pytest.mark.parametrize("num_layers", [1, 3])
def test_mlp_block_formula(num_layers):
    hidden = 6 if num_layers > 1 else 0
    cfg = MLPBlockConfig(
        num_layers=num_layers, input_dims=3, hidden_dims=hidden, output_dims=2, activation=ActivationConfig(name="tanh")
    )
    mlp = cfg.build(key(0))
    dims = [3] + [6] * (num_layers - 1) + [2]
    assert [(layer.linear.w.shape) for layer in mlp.layers] == list(zip(dims[:-1], dims[1:]))
    mlp = _with_random(mlp, *[lambda m, i=i: m.layers[i].bias.b for i in range(num_layers)])
    x = np.asarray(_x((4, 3)), np.float64)
    h = x
    for layer in mlp.layers:
        h = np.tanh(h @ np.asarray(layer.linear.w) + np.asarray(layer.bias.b))
    assert_matches_reference(mlp(jnp.asarray(x, jnp.float32)), h, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "fields, named",
    [
        (dict(num_layers=0, hidden_dims=6), "num_layers"),
        (dict(num_layers=1, hidden_dims=6), "hidden_dims=6 has no effect"),
        (dict(num_layers=2, hidden_dims=0), "hidden_dims must be > 0"),
    ],
)
def test_mlp_block_config_errors(fields, named):
    with pytest.raises(ConfigError, match=named):
        MLPBlockConfig(input_dims=3, output_dims=2, **fields)


def test_sizes_must_be_positive():
    with pytest.raises(ConfigError, match="output_dims"):
        LinearConfig(input_dims=3, output_dims=0)
    with pytest.raises(ConfigError, match="dims"):
        BiasConfig(dims=0)
