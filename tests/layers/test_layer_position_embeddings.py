"""Trainable, sinusoidal and rotary position embeddings against the Praxis formulas."""

import math

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import TypeCheckError
from layer_reference import key, random_normal

from pax_eqx.layers import TrainablePositionalEmbeddingConfig, apply_rotary, sinusoidal_position_embedding


def _praxis_sinusoid(positions, dims, min_ts=1.0, max_ts=10_000.0):
    """praxis.layers.embedding_softmax.PositionalEmbedding, written out in numpy."""
    positions = np.asarray(positions, np.float64)
    n = dims // 2
    increment = math.log(max_ts / min_ts) / max(n - 1, 1)
    inv = min_ts * np.exp(np.arange(n) * -increment)
    scaled = positions[..., None] * inv
    signal = np.concatenate([np.sin(scaled), np.cos(scaled)], axis=-1)
    return np.pad(signal, [(0, 0)] * (signal.ndim - 1) + [(0, dims % 2)])


def _praxis_rotary(x, positions, min_ts=1.0, max_ts=10_000.0):
    """praxis RotaryPositionalEmbedding: rotate the first half of each head against the second."""
    x = np.asarray(x, np.float64)
    dim = x.shape[-1]
    fraction = 2 * np.arange(dim // 2) / dim
    timescale = min_ts * (max_ts / min_ts) ** fraction
    angle = np.asarray(positions, np.float64)[:, :, None, None] / timescale
    sin, cos = np.sin(angle), np.cos(angle)
    first, second = np.split(x, 2, axis=-1)
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def test_trainable_position_embedding_is_a_table_lookup():
    layer = TrainablePositionalEmbeddingConfig(max_seq_length=10, embedding_dims=4).build(key(0))
    assert layer.emb_var.shape == (10, 4)
    np.testing.assert_allclose(np.std(np.asarray(layer.emb_var)), 0.02, rtol=0.5)
    positions = jnp.asarray([[0, 1, 2, 9], [3, 3, 0, 1]])
    np.testing.assert_array_equal(layer(positions), np.asarray(layer.emb_var)[np.asarray(positions)])
    g = eqx.filter_grad(lambda m: jnp.sum(m(positions)))(layer).emb_var
    np.testing.assert_array_equal(g[:, 0], np.bincount(np.asarray(positions).ravel(), minlength=10))


@pytest.mark.parametrize("dims", [8, 7])
def test_sinusoidal_matches_praxis(dims):
    positions = jnp.asarray([[0, 1, 2, 50], [7, 0, 1000, 3]])
    got = sinusoidal_position_embedding(positions, dims)
    assert got.shape == (2, 4, dims)
    np.testing.assert_allclose(got, _praxis_sinusoid(positions, dims), rtol=1e-5, atol=2e-5)
    if dims % 2:
        np.testing.assert_array_equal(got[..., -1], 0.0)


def test_sinusoidal_position_zero_is_zeros_then_ones():
    got = sinusoidal_position_embedding(jnp.zeros((1, 1), jnp.int32), 6)
    np.testing.assert_array_equal(got[0, 0], [0, 0, 0, 1, 1, 1])


def test_sinusoidal_custom_timescales():
    positions = jnp.arange(5)[None]
    got = sinusoidal_position_embedding(positions, 6, min_timescale=2.0, max_timescale=100.0)
    np.testing.assert_allclose(got, _praxis_sinusoid(positions, 6, 2.0, 100.0), rtol=1e-5, atol=1e-6)


def test_rotary_matches_praxis():
    x = random_normal((2, 5, 3, 8), 0)
    positions = jnp.asarray([[0, 1, 2, 3, 4], [9, 3, 0, 1, 2]])
    got = apply_rotary(x, positions)
    assert got.shape == x.shape
    np.testing.assert_allclose(got, _praxis_rotary(x, positions), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        apply_rotary(x, positions, max_timescale=100.0),
        _praxis_rotary(x, positions, max_ts=100.0),
        rtol=1e-5,
        atol=1e-5,
    )


def test_rotary_is_a_rotation_whose_dot_products_depend_on_distance_only():
    q = random_normal((1, 1, 1, 8), 1)
    k = random_normal((1, 1, 1, 8), 2)
    at = lambda v, p: apply_rotary(v, jnp.asarray([[p]]))[0, 0, 0]
    np.testing.assert_allclose(jnp.linalg.norm(at(q, 17)), jnp.linalg.norm(q), rtol=1e-5)
    np.testing.assert_allclose(at(q, 0), q[0, 0, 0], rtol=1e-6)
    d1 = jnp.dot(at(q, 5), at(k, 2))
    d2 = jnp.dot(at(q, 105), at(k, 102))
    np.testing.assert_allclose(d1, d2, rtol=1e-4)
    assert abs(float(d1 - jnp.dot(at(q, 5), at(k, 4)))) > 1e-3


def test_rotary_keeps_dtype_and_rejects_odd_dims():
    x = jnp.ones((1, 2, 1, 4), jnp.bfloat16)
    assert apply_rotary(x, jnp.asarray([[0, 1]])).dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="even head dimension"):
        apply_rotary(jnp.ones((1, 2, 1, 5)), jnp.asarray([[0, 1]]))


def test_rotary_positions_shape_is_checked():
    with pytest.raises(TypeCheckError):
        apply_rotary(jnp.ones((1, 3, 2, 4)), jnp.asarray([[0, 1]]))
