"""LayerNorm ((1 + scale), eps 1e-6), RmsNorm and RmsNormNoScale against numpy formulas."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from layer_reference import random_normal
from tolerances import assert_same_math

from pax_eqx.config import ConfigError
from pax_eqx.layers import LayerNorm, NormConfig, RmsNorm, rms_norm_no_scale
from pax_eqx.layers.normalizations import LayerNormConfig, RmsNormConfig, RmsNormNoScaleConfig


def _x(shape=(2, 3, 8), seed=0, offset=3.0):
    # A large offset makes a missing mean subtraction or a wrong epsilon visible.
    return random_normal(shape, seed) * 2.0 + offset


def _randomize(norm, seed=5):
    for i, name in enumerate(("scale", "bias")):
        if getattr(norm, name, None) is not None:
            norm = eqx.tree_at(lambda m, n=name: getattr(m, n), norm, random_normal((8,), seed + i))
    return norm


def test_layer_norm_praxis_formula():
    norm = LayerNormConfig().build(8)
    assert isinstance(norm, LayerNorm) and norm.epsilon == 1e-6
    np.testing.assert_array_equal(norm.scale, np.zeros(8))  # stored as an offset from one
    norm = _randomize(norm)
    x = np.asarray(_x(), np.float64)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    expected = (x - mean) / np.sqrt(var + 1e-6) * (1.0 + np.asarray(norm.scale)) + np.asarray(norm.bias)
    np.testing.assert_allclose(norm(jnp.asarray(x, jnp.float32)), expected, rtol=1e-5, atol=1e-5)


def test_layer_norm_at_init_is_a_plain_standardisation():
    x = _x()
    y = np.asarray(LayerNormConfig().build(8)(x))
    np.testing.assert_allclose(y.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(y.var(-1), 1.0, rtol=1e-4)


def test_layer_norm_epsilon_matters_for_a_constant_row():
    x = jnp.full((1, 8), 2.0).at[0, 0].set(2.001)
    a = LayerNormConfig(epsilon=1e-6).build(8)(x)
    b = LayerNormConfig(epsilon=1.0).build(8)(x)
    assert float(jnp.max(jnp.abs(a))) > 100 * float(jnp.max(jnp.abs(b)))


def test_layer_norm_without_scale_or_bias():
    norm = LayerNormConfig(use_scale=False, use_bias=False).build(8)
    assert norm.scale is None and norm.bias is None
    x = np.asarray(_x(), np.float64)
    expected = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(norm(jnp.asarray(x, jnp.float32)), expected, rtol=1e-5, atol=1e-5)


def test_rms_norm_formula():
    norm = RmsNormConfig().build(8)
    assert isinstance(norm, RmsNorm)
    np.testing.assert_array_equal(norm.scale, np.ones(8))
    norm = _randomize(norm)
    x = np.asarray(_x(), np.float64)
    expected = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * np.asarray(norm.scale)
    np.testing.assert_allclose(norm(jnp.asarray(x, jnp.float32)), expected, rtol=1e-5, atol=1e-5)


def test_rms_norm_no_scale_formula():
    cfg = rms_norm_no_scale(epsilon=1e-3)
    assert cfg.kind == "rms_norm_no_scale"
    norm = cfg.build(8)
    assert isinstance(norm, RmsNorm) and norm.scale is None
    x = np.asarray(_x(), np.float64)
    expected = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-3)
    np.testing.assert_allclose(norm(jnp.asarray(x, jnp.float32)), expected, rtol=1e-5, atol=1e-5)


KINDS = {"layer_norm": LayerNormConfig, "rms_norm": RmsNormConfig, "rms_norm_no_scale": RmsNormNoScaleConfig}


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
def test_bf16_input_uses_float32_statistics(kind):
    norm = _randomize(KINDS[kind]().build(8))
    x = _x().astype(jnp.bfloat16)
    y = norm(x)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_array_equal(y, norm(x.astype(jnp.float32)).astype(jnp.bfloat16))


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm", "rms_norm_no_scale"])
def test_norms_jit_and_grad(kind):
    norm = KINDS[kind]().build(8)
    assert KINDS[kind].kind == kind
    x = _x()
    assert_same_math(eqx.filter_jit(lambda m, x: m(x))(norm, x), norm(x))
    g = jax.grad(lambda x: jnp.sum(norm(x) * jnp.arange(8.0)))(x)
    assert g.shape == x.shape and np.all(np.isfinite(g))
    # Normalisation is invariant to the input's scale, so the gradient is orthogonal to x.
    np.testing.assert_allclose(jnp.sum(g * x, -1), 0.0, atol=1e-3)


def test_norm_config_errors():
    with pytest.raises(ValueError, match="dims"):
        LayerNormConfig().build(0)
    with pytest.raises(ConfigError, match="epsilon"):
        RmsNormConfig(epsilon=-1.0)


def test_a_norm_holds_only_what_its_kind_reads():
    """The fields an RMS norm would ignore (a bias, LayerNorm's use_scale) are not fields of it:
    they are refused by name, never silently dropped."""
    with pytest.raises(ConfigError, match="use_bias"):
        RmsNormConfig(use_bias=False)
    with pytest.raises(ConfigError, match="direct_scale"):
        RmsNormNoScaleConfig(direct_scale=True)


def test_a_norm_choice_round_trips_through_json_and_reads_the_old_flat_form():
    from pax_eqx.config import _from_jsonable, _to_jsonable

    for cfg in (
        LayerNormConfig(epsilon=1e-5, use_bias=False),
        RmsNormConfig(direct_scale=False),
        RmsNormNoScaleConfig(),
    ):
        assert _from_jsonable(NormConfig, _to_jsonable(cfg), "norm") == cfg
    old = {"kind": "rms_norm", "epsilon": 1e-5, "use_scale": True, "use_bias": True, "direct_scale": None}
    assert _from_jsonable(NormConfig, old, "norm") == RmsNormConfig(epsilon=1e-5)
    with pytest.raises(ConfigError, match="epsilonn"):
        _from_jsonable(NormConfig, {"kind": "rms_norm", "epsilonn": 1.0}, "norm")


# Praxis' direct_scale: each kind's default form, and the other one on request ------------------
def _layer_norm_reference(x, scale, bias):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-6) * scale + bias


@pytest.mark.parametrize("direct_scale", [False, True])
def test_layer_norm_direct_scale(direct_scale):
    """Praxis LayerNorm: direct_scale=False (its default) -> * (1 + scale), scale init 0;
    True -> * scale, scale init 1."""
    norm = LayerNormConfig(direct_scale=direct_scale).build(8)
    direct = bool(direct_scale)
    assert norm.direct_scale is direct
    np.testing.assert_array_equal(norm.scale, np.full(8, 1.0 if direct else 0.0))
    norm = _randomize(norm)
    x = np.asarray(_x(), np.float64)
    scale = np.asarray(norm.scale, np.float64)
    expected = _layer_norm_reference(x, scale if direct else 1.0 + scale, np.asarray(norm.bias))
    np.testing.assert_allclose(norm(jnp.asarray(x, jnp.float32)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("direct_scale", [True, False])
def test_rms_norm_direct_scale(direct_scale):
    """Praxis RmsNorm: direct_scale=True (its default) -> * scale, scale init 1;
    False -> * (1 + scale), scale init 0."""
    norm = RmsNormConfig(direct_scale=direct_scale).build(8)
    direct = direct_scale is not False
    assert norm.direct_scale is direct
    np.testing.assert_array_equal(norm.scale, np.full(8, 1.0 if direct else 0.0))
    norm = _randomize(norm)
    x = np.asarray(_x(), np.float64)
    scale = np.asarray(norm.scale, np.float64)
    expected = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * (scale if direct else 1.0 + scale)
    np.testing.assert_allclose(norm(jnp.asarray(x, jnp.float32)), expected, rtol=1e-5, atol=1e-5)


def test_the_two_scale_forms_agree_at_init():
    """Either form is the identity scaling at init, so switching it changes only the parametrisation."""
    x = _x()
    for cls in (LayerNormConfig, RmsNormConfig):
        a, b = (cls(direct_scale=d).build(8)(x) for d in (False, True))
        assert_same_math(a, b)


def test_direct_scale_without_a_scale_is_rejected():
    with pytest.raises(ConfigError, match=r"direct_scale=True has no effect with use_scale=False"):
        LayerNormConfig(use_scale=False, direct_scale=True)
