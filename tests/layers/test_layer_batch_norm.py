"""BatchNorm: train/eval formulas, and its moving statistics threaded through the state."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from layer_reference import jit, key, random_normal
from tolerances import assert_matches_reference, assert_same_math

from pax_eqx.layers import BatchNormConfig, Context, Mode, apply, init, mean_sync_markers

C = 3


def _x(shape=(4, 5, C), seed=0):
    return random_normal(shape, seed) * 2.0 + jnp.arange(C, dtype=jnp.float32)


def _with_affine(bn):
    bn = eqx.tree_at(lambda m: m.gamma, bn, jnp.asarray([0.5, -0.25, 1.0]))
    return eqx.tree_at(lambda m: m.beta, bn, jnp.asarray([0.1, 0.2, -0.3]))


def _normalise(x, mean, var, bn, eps):
    return (x - mean) / np.sqrt(var + eps) * (1.0 + np.asarray(bn.gamma)) + np.asarray(bn.beta)


def test_train_uses_batch_stats_and_updates_moving_averages():
    bn, state = init(BatchNormConfig(dims=C, decay=0.9), key(0))
    bn = _with_affine(bn)
    x = _x()
    y, ctx = apply(bn, x, state=state, mode=Mode.TRAIN, mutable=True)
    xn = np.asarray(x, np.float64).reshape(-1, C)
    mean, var = xn.mean(0), xn.var(0)
    np.testing.assert_allclose(y, _normalise(np.asarray(x), mean, var, bn, 1e-3), rtol=1e-5, atol=1e-5)
    assert_matches_reference(ctx.get_var(bn.moving_mean), 0.9 * 0.0 + 0.1 * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ctx.get_var(bn.moving_variance), 0.9 * 1.0 + 0.1 * var, rtol=1e-5)
    # The input state is untouched: the new values live only in the returned context.
    np.testing.assert_array_equal(state.get(bn.moving_mean), np.zeros(C))


def test_moving_averages_over_several_steps():
    bn, state = init(BatchNormConfig(dims=C, decay=0.5), key(0))
    step = eqx.filter_jit(lambda bn, x, s: apply(bn, x, state=s, mutable=True)[1].state)
    mean, var = np.zeros(C), np.ones(C)
    for seed in range(3):
        x = _x(seed=seed)
        state = step(bn, x, state)
        xn = np.asarray(x, np.float64).reshape(-1, C)
        mean, var = 0.5 * mean + 0.5 * xn.mean(0), 0.5 * var + 0.5 * xn.var(0)
    np.testing.assert_allclose(state.get(bn.moving_mean), mean, rtol=1e-5)
    np.testing.assert_allclose(state.get(bn.moving_variance), var, rtol=1e-5)


@pytest.mark.parametrize("mode", [Mode.EVAL, Mode.DECODE])
def test_eval_uses_moving_stats_and_leaves_state_alone(mode):
    bn, state = init(BatchNormConfig(dims=C), key(0))
    bn = _with_affine(bn)
    moving_mean, moving_var = jnp.asarray([1.0, -1.0, 0.5]), jnp.asarray([4.0, 0.25, 1.0])
    state = state.set(bn.moving_mean, moving_mean).set(bn.moving_variance, moving_var)
    x = _x()
    y, ctx = apply(bn, x, state=state, mode=mode, mutable=True)
    expected = _normalise(np.asarray(x), np.asarray(moving_mean), np.asarray(moving_var), bn, 1e-3)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ctx.get_var(bn.moving_mean), moving_mean)
    np.testing.assert_array_equal(ctx.get_var(bn.moving_variance), moving_var)


def test_paddings_are_left_out_of_the_batch_statistics():
    bn, state = init(BatchNormConfig(dims=C, decay=0.0), key(0))
    x = _x((2, 4, C))
    paddings = jnp.asarray([[0, 0, 0, 1], [0, 0, 1, 1]], jnp.float32)
    y, ctx = apply(bn, x, state=state, mutable=True, paddings=paddings)
    valid = np.asarray(x)[np.asarray(paddings) == 0]  # [5, C]
    np.testing.assert_allclose(ctx.get_var(bn.moving_mean), valid.mean(0), rtol=1e-5)
    np.testing.assert_allclose(ctx.get_var(bn.moving_variance), valid.var(0), rtol=1e-5)
    # Changing a padded position changes neither the statistics nor the other outputs.
    y2, _ = apply(bn, x.at[1, 3].set(100.0), state=state, mutable=True, paddings=paddings)
    assert_same_math(y2[0], y[0])
    assert_same_math(y2[1, :3], y[1, :3])


def test_use_moving_avg_in_training_normalises_with_the_old_moving_stats():
    cfg = BatchNormConfig(dims=C, decay=0.9, use_moving_avg_in_training=True)
    bn, state = init(cfg, key(0))
    x = _x()
    y, ctx = apply(bn, x, state=state, mutable=True)
    np.testing.assert_allclose(y, np.asarray(x) / np.sqrt(1.0 + 1e-3), rtol=1e-5)
    assert not np.allclose(ctx.get_var(bn.moving_mean), 0.0)  # still updated


def test_moving_stats_are_mean_synced_and_never_trained():
    bn, _ = init(BatchNormConfig(dims=C), key(0))
    markers = mean_sync_markers(bn)
    assert markers == {bn.moving_mean.marker, bn.moving_variance.marker}
    assert all(m.endswith("#mean_sync") for m in markers)
    params = eqx.filter(bn, eqx.is_array)
    assert {id(a) for a in jax.tree.leaves(params)} == {id(bn.beta), id(bn.gamma)}


def test_grad_flows_through_batch_statistics():
    bn, state = init(BatchNormConfig(dims=C), key(0))
    x = _x()

    def loss(bn, x):
        y, ctx = bn(x, Context(state=state))
        return jnp.sum(y * jnp.arange(C, dtype=jnp.float32))

    g_bn, g_x = jit(lambda bn, x: (eqx.filter_grad(loss)(bn, x), jax.grad(loss, argnums=1)(bn, x)))(bn, x)
    np.testing.assert_allclose(g_bn.beta, np.full(C, 20.0) * np.arange(C), rtol=1e-6)
    # Each channel's output is invariant to shifting that channel's inputs: gradients sum to 0.
    np.testing.assert_allclose(np.asarray(g_x).reshape(-1, C).sum(0), 0.0, atol=1e-4)


def test_missing_state_is_a_clear_error():
    bn = BatchNormConfig(dims=C).build()
    with pytest.raises(ValueError, match="non-trainable variable.*init"):
        apply(bn, _x())
