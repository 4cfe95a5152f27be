"""Every activation against its formula, written here in numpy (float64)."""

import math
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import assert_matches_reference, assert_same_math

from pax_eqx.config import ConfigError
from pax_eqx.layers import Activation, ActivationConfig, geglu, swiglu
from pax_eqx.layers.activations import ActivationName

_erf = np.vectorize(math.erf)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


FORMULAS = {
    "relu": lambda x: np.maximum(x, 0.0),
    "relu6": lambda x: np.minimum(np.maximum(x, 0.0), 6.0),
    "squared_relu": lambda x: np.maximum(x, 0.0) ** 2,
    "leaky_relu": lambda x: np.where(x >= 0, x, 0.01 * x),
    "elu": lambda x: np.where(x > 0, x, np.exp(x) - 1.0),
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    # Praxis' default GELU is the tanh approximation.
    "gelu": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
    "gelu_exact": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "silu": lambda x: x * _sigmoid(x),
    "swish": lambda x: x * _sigmoid(x),
    "softplus": lambda x: np.log1p(np.exp(x)),
    "identity": lambda x: x,
}

X = np.linspace(-8.0, 8.0, 65)


def test_every_activation_name_has_a_formula_here():
    assert set(typing.get_args(ActivationName)) == set(FORMULAS)


@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_activation_matches_formula(name):
    act = ActivationConfig(name=name).build()
    y = act(jnp.asarray(X, jnp.float32).reshape(5, 13))
    assert y.shape == (5, 13) and y.dtype == jnp.float32
    assert_matches_reference(y.reshape(-1), FORMULAS[name](X), rtol=1e-5, atol=1e-6)


def test_leaky_relu_slope_is_configurable():
    act = ActivationConfig(name="leaky_relu", negative_slope=0.3).build()
    np.testing.assert_allclose(act(jnp.asarray([-2.0, 3.0])), [-0.6, 3.0], rtol=1e-6)


def test_gelu_approximate_and_exact_differ():
    x = jnp.asarray([1.5])
    assert float(ActivationConfig(name="gelu").build()(x)[0]) != float(
        ActivationConfig(name="gelu_exact").build()(x)[0]
    )


def test_activation_under_jit_and_grad():
    act = ActivationConfig(name="silu").build()
    x = jnp.asarray(X[::8], jnp.float32)
    assert_same_math(jax.jit(act)(x), act(x))
    s = _sigmoid(np.asarray(x, np.float64))
    assert_matches_reference(jax.vmap(jax.grad(act))(x), s * (1 + np.asarray(x) * (1 - s)), rtol=1e-5, atol=1e-6)


def test_gated_presets():
    assert geglu() == ActivationConfig(name="gelu", gated=True)
    assert swiglu() == ActivationConfig(name="silu", gated=True)
    assert Activation().name == "relu"


def test_unknown_activation_name_fails_when_built():
    with pytest.raises(ConfigError, match="'gleu'.*'gelu'"):
        ActivationConfig(name="gleu").build()


def test_gelu_exact_gradient_matches_its_derivative_and_jax_erfc_form():
    """The erf form (cheap on CPU) is the same function as jax's erfc form, and its gradient is
    Phi(x) + x phi(x)."""
    x = np.linspace(-10.0, 10.0, 2001)
    act = ActivationConfig(name="gelu_exact").build()
    xs = jnp.asarray(x, jnp.float32)
    assert_matches_reference(act(xs), jax.nn.gelu(xs, approximate=False), rtol=1e-5, atol=1e-6)
    grad = jax.vmap(jax.grad(act))(xs)
    phi = np.exp(-0.5 * x**2) / math.sqrt(2.0 * math.pi)
    assert_matches_reference(grad, 0.5 * (1.0 + _erf(x / math.sqrt(2.0))) + x * phi, rtol=1e-5, atol=1e-6)
