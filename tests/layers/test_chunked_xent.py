"""chunked_softmax_xent against the direct formula: values, and gradients w.r.t. every input."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tolerances import assert_same_math, assert_same_math_tree

from pax_eqx.layers.chunked_xent import chunked_softmax_xent

B, T, D, V = 2, 7, 8, 11


def _inputs(seed=0):
    k = jax.random.split(jax.random.key(seed), 5)
    h = jax.random.normal(k[0], (B, T, D))
    w = jax.random.normal(k[1], (V, D)) * 0.5
    b = jax.random.normal(k[2], (V,)) * 0.1
    labels = jax.random.randint(k[3], (B, T), 0, V)
    weights = jnp.ones((B, T)).at[1, 4:].set(0.0).at[0, 2].set(0.5)
    return h, w, b, labels, weights


def _direct(h, w, b, labels, weights, soft_cap, smoothing):
    """The whole [B, T, V] logits at once, through optax."""
    z = h @ w.T + (0.0 if b is None else b)
    if soft_cap:
        z = soft_cap * jnp.tanh(z / soft_cap)
    targets = optax.smooth_labels(jax.nn.one_hot(labels, V), smoothing)
    xent = optax.softmax_cross_entropy(z, targets)
    return jnp.sum(xent * weights), jnp.sum((jnp.argmax(z, -1) == labels) * weights)


@pytest.mark.parametrize("chunk", [1, 3, 7, 16])  # 3 pads 7 positions to 9; 16 is one padded chunk
@pytest.mark.parametrize(
    "soft_cap, smoothing, bias", [(0.0, 0.0, True), (2.0, 0.0, False), (0.0, 0.1, True), (2.0, 0.1, True)]
)
def test_sums_and_gradients_equal_the_whole_logits_formula(chunk, soft_cap, smoothing, bias):
    h, w, b, labels, weights = _inputs()
    b = b if bias else None

    def fused(h, w, b, weights):
        return chunked_softmax_xent(h, w, b, labels, weights, chunk=chunk, soft_cap=soft_cap, label_smoothing=smoothing)

    def direct(h, w, b, weights):
        return _direct(h, w, b, labels, weights, soft_cap, smoothing)

    got, want = fused(h, w, b, weights), direct(h, w, b, weights)
    assert_same_math(got[0], want[0])
    assert_same_math(got[1], want[1])
    # 0.7 x: the cotangent is scaled through, as a loss divided by its weight sum would be
    grad = lambda f: jax.grad(lambda *a: 0.7 * f(*a)[0], argnums=(0, 1, 2, 3))(h, w, b, weights)  # noqa: E731
    assert_same_math_tree(grad(fused), grad(direct))


def test_gradients_come_back_in_each_inputs_dtype():
    h, w, b, labels, weights = _inputs()
    loss = lambda h, w, b: chunked_softmax_xent(h, w, b, labels, weights, chunk=4)[0]  # noqa: E731
    dh, dw, db = jax.grad(loss, argnums=(0, 1, 2))(h.astype(jnp.bfloat16), w, b)
    assert (dh.dtype, dw.dtype, db.dtype) == (jnp.bfloat16, jnp.float32, jnp.float32)
    want = jax.grad(lambda w: _direct(h, w, b, labels, weights, 0.0, 0.0)[0])(w)
    np.testing.assert_allclose(dw, want, rtol=0.05, atol=0.02)  # bf16 activations: close, not equal


def test_a_non_positive_chunk_is_an_error_naming_it():
    h, w, b, labels, weights = _inputs()
    with pytest.raises(ValueError, match="chunk must be > 0, got 0"):
        chunked_softmax_xent(h, w, b, labels, weights, chunk=0)


def test_chunks_are_even_and_never_longer_than_the_sequence():
    """7 positions in chunks of at most 4 run as 2 chunks of 4 (one pad); a chunk of 100 runs as
    one chunk of 7, not 100 (the logits' time axis in the program is 4, then 7)."""
    h, w, b, labels, weights = _inputs()
    for chunk, length in ((4, 4), (100, 7)):
        loss = lambda h: chunked_softmax_xent(h, w, b, labels, weights, chunk=chunk)[0]  # noqa: B023, E731
        jaxpr = str(jax.make_jaxpr(jax.grad(loss))(h))
        assert f"f32[{B},{length},{V}]" in jaxpr and f"f32[{B},100,{V}]" not in jaxpr
        assert_same_math(loss(h), _direct(h, w, b, labels, weights, 0.0, 0.0)[0])
