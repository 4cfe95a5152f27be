"""Dropout and StochasticResidual: statistics, scaling, keys, and the eval/no-op paths."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from layer_reference import key, random_normal

from pax_eqx.layers import Context, DropoutConfig, Mode, StochasticResidualConfig, apply
from pax_eqx.layers.stochastics import drop_path


def test_dropout_statistics_and_scaling():
    rate, n = 0.25, 40_000
    drop = DropoutConfig(rate=rate).build()
    x = jnp.ones((4, n // 4))
    y = np.asarray(apply(drop, x, key=key(0)))
    zero = y == 0.0
    # Binomial: the dropped fraction is within 5 standard deviations of the rate.
    assert abs(zero.mean() - rate) < 5 * np.sqrt(rate * (1 - rate) / n)
    np.testing.assert_allclose(y[~zero], 1.0 / (1.0 - rate), rtol=1e-6)  # inverted dropout
    assert abs(y.mean() - 1.0) < 0.02  # expectation preserved


def test_dropout_with_the_default_threefry_key():
    drop = DropoutConfig(rate=0.5).build()
    y = apply(drop, jnp.ones(64), key=jax.random.key(0))
    assert 0 < int(jnp.sum(y == 0)) < 64 and set(np.unique(np.asarray(y))) == {0.0, 2.0}


def test_dropout_same_key_same_mask_new_key_new_mask():
    drop = DropoutConfig(rate=0.5).build()
    x = jnp.arange(1.0, 65.0)
    a = apply(drop, x, key=key(1))
    np.testing.assert_array_equal(a, apply(drop, x, key=key(1)))
    assert not np.array_equal(a, apply(drop, x, key=key(2)))


def test_two_dropouts_in_a_row_use_different_keys():
    drop = DropoutConfig(rate=0.5).build()
    x = jnp.ones(256)
    ctx = Context(key=key(0))
    a, ctx = drop(x, ctx)
    b, ctx = drop(x, ctx)
    assert not np.array_equal(a == 0, b == 0)


@pytest.mark.parametrize("mode", [Mode.EVAL, Mode.DECODE])
def test_dropout_is_identity_outside_training_and_needs_no_key(mode):
    drop = DropoutConfig(rate=0.9).build()
    x = jnp.arange(6.0)
    np.testing.assert_array_equal(apply(drop, x, mode=mode), x)


def test_zero_rate_dropout_needs_no_key():
    x = jnp.arange(6.0)
    y, ctx = apply(DropoutConfig(rate=0.0).build(), x, mutable=True)
    np.testing.assert_array_equal(y, x)
    assert ctx.key is None


def test_dropout_without_key_in_training_is_a_clear_error():
    with pytest.raises(ValueError, match="needs randomness.*key="):
        apply(DropoutConfig(rate=0.1).build(), jnp.ones(3))


def test_dropout_under_jit_and_grad():
    drop = DropoutConfig(rate=0.5).build()
    x = jnp.arange(1.0, 9.0)
    k = key(3)
    f = jax.jit(lambda x, k: apply(drop, x, key=k))
    y = f(x, k)
    np.testing.assert_array_equal(y, apply(drop, x, key=k))
    g = jax.grad(lambda x: jnp.sum(f(x, k)))(x)
    np.testing.assert_array_equal(g, np.where(np.asarray(y) == 0, 0.0, 2.0))


@pytest.mark.parametrize("rate", [-0.1, 1.0])
def test_dropout_rate_is_validated(rate):
    with pytest.raises(ValueError, match="rate"):
        DropoutConfig(rate=rate).build()


def test_stochastic_residual_eval_is_a_weighted_sum():
    layer = StochasticResidualConfig(residual_weight=0.5, survival_prob=0.3).build()
    x, r = jnp.ones((3, 2)), jnp.full((3, 2), 4.0)
    np.testing.assert_allclose(apply(layer, x, r, mode=Mode.EVAL), np.full((3, 2), 3.0))


def test_stochastic_residual_drops_whole_examples():
    p, w, n = 0.7, 0.5, 4000
    layer = StochasticResidualConfig(residual_weight=w, survival_prob=p).build()
    x = jnp.zeros((n, 3, 2))
    r = jnp.ones((n, 3, 2))
    y = np.asarray(apply(layer, x, r, key=key(0)))
    kept = y[:, 0, 0] != 0.0
    # Per example, every element is kept or every element dropped.
    np.testing.assert_allclose(y, np.where(kept[:, None, None], w / p, 0.0) * np.ones((n, 3, 2)), rtol=1e-6)
    assert abs(kept.mean() - p) < 5 * np.sqrt(p * (1 - p) / n)


def test_stochastic_residual_survival_one_needs_no_key():
    layer = StochasticResidualConfig(residual_weight=2.0).build()
    np.testing.assert_allclose(apply(layer, jnp.ones((2, 2)), jnp.ones((2, 2))), np.full((2, 2), 3.0))
    with pytest.raises(ValueError, match="survival_prob"):
        StochasticResidualConfig(survival_prob=0.0).build()


@pytest.mark.parametrize("traced", [False, True])
def test_drop_path_keeps_the_expectation_and_drops_whole_examples(traced):
    """Stochastic depth: E[drop_path(r)] = r (kept rows are r / survival), with a Python or a
    traced survival probability (a scanned stack's schedule)."""
    survival, n = 0.6, 4000
    r = jnp.ones((n, 3, 2))

    def run(r, key_):
        p = jnp.float32(survival) if traced else survival
        return drop_path(r, p, Context(key=key_))[0]

    y = np.asarray(jax.jit(run)(r, key(3)))
    kept = y[:, 0, 0] != 0.0
    np.testing.assert_allclose(y, np.where(kept[:, None, None], 1 / survival, 0.0) * np.ones((n, 3, 2)), rtol=1e-6)
    assert abs(kept.mean() - survival) < 5 * np.sqrt(survival * (1 - survival) / n)
    assert abs(y.mean() - 1.0) < 5 * np.sqrt((1 - survival) / survival / n)  # the expectation is r


@pytest.mark.parametrize("mode", [Mode.EVAL, Mode.DECODE])
def test_drop_path_is_deterministic_outside_training_and_needs_no_key(mode):
    r = random_normal((5, 4), 1)
    y, ctx = drop_path(r, 0.3, Context(mode=mode))
    np.testing.assert_array_equal(y, r)
    assert ctx.key is None
