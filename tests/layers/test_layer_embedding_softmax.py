"""Embedding, FullSoftmax and SharedEmbeddingSoftmax: lookups, logits, capping and the loss."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import TypeCheckError
from layer_reference import jit, key, random_normal
from tolerances import assert_matches_reference, assert_same_math

from pax_eqx.layers import (
    EmbeddingConfig,
    SharedEmbeddingSoftmaxConfig,
    SoftmaxConfig,
    cross_entropy,
    soft_cap,
)

V, D = 7, 4


def _log_softmax(logits):
    logits = np.asarray(logits, np.float64)
    m = logits.max(-1, keepdims=True)
    return logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))


def _xent(logits, labels, smoothing):
    """-sum(target * log_softmax), target = (1 - p) * onehot + p / V (optax.smooth_labels)."""
    onehot = np.eye(logits.shape[-1])[np.asarray(labels)]
    target = (1.0 - smoothing) * onehot + smoothing / logits.shape[-1]
    return -(target * _log_softmax(logits)).sum(-1)


def _ids(shape=(2, 5), seed=3):
    return jnp.asarray(np.random.default_rng(seed).integers(0, V, shape))


def _x(shape=(2, 5, D), seed=4):
    return random_normal(shape, seed)


@pytest.mark.parametrize("scale", [False, True])
def test_embedding_lookup(scale):
    emb = EmbeddingConfig(num_classes=V, input_dims=D, scale_sqrt_depth=scale).build(key(0))
    assert emb.emb_var.shape == (V, D)
    ids = _ids()
    expected = np.asarray(emb.emb_var)[np.asarray(ids)] * (math.sqrt(D) if scale else 1.0)
    np.testing.assert_allclose(emb(ids), expected, rtol=1e-6)


def test_embedding_grad_counts_each_lookup():
    emb = EmbeddingConfig(num_classes=V, input_dims=D).build(key(0))
    ids = jnp.asarray([[0, 2, 2], [6, 2, 0]])
    g = eqx.filter_grad(lambda m: jnp.sum(m(ids)))(emb).emb_var
    counts = np.bincount(np.asarray(ids).ravel(), minlength=V)
    np.testing.assert_allclose(g, np.repeat(counts[:, None], D, axis=1))


def test_embedding_rejects_float_ids():
    emb = EmbeddingConfig(num_classes=V, input_dims=D).build(key(0))
    with pytest.raises(TypeCheckError):
        emb(jnp.zeros((2, 3), jnp.float32))


def test_full_softmax_logits_formula():
    sm = SoftmaxConfig(input_dims=D, num_classes=V).build(key(0))
    assert sm.w.shape == (D, V) and sm.b.shape == (V,)
    sm = eqx.tree_at(lambda m: m.b, sm, random_normal((V,), 9))
    x = _x()
    expected = np.asarray(x) @ np.asarray(sm.w) + np.asarray(sm.b)
    assert_matches_reference(sm.logits(x), expected, rtol=1e-5, atol=1e-6)
    assert SoftmaxConfig(input_dims=D, num_classes=V, use_bias=False).build(key(0)).b is None


def test_full_softmax_soft_cap():
    sm = SoftmaxConfig(input_dims=D, num_classes=V, soft_cap_logits=0.5).build(key(0))
    x = _x() * 10.0
    raw = np.asarray(x) @ np.asarray(sm.w) + np.asarray(sm.b)
    logits = sm.logits(x)
    assert_matches_reference(logits, 0.5 * np.tanh(raw / 0.5), rtol=1e-5, atol=1e-6)
    assert float(jnp.max(jnp.abs(logits))) <= 0.5


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_full_softmax_cross_entropy(smoothing):
    sm = SoftmaxConfig(input_dims=D, num_classes=V, label_smoothing_prob=smoothing).build(key(0))
    logits, labels = sm.logits(_x()), _ids()
    xent = sm.xent(logits, labels)
    assert xent.shape == (2, 5) and xent.dtype == jnp.float32
    np.testing.assert_allclose(xent, _xent(logits, labels, smoothing), rtol=1e-5)


def test_label_smoothing_changes_the_loss_of_a_confident_prediction():
    logits = jnp.asarray([[10.0, 0.0, 0.0]])
    labels = jnp.asarray([0])
    plain, smoothed = cross_entropy(logits, labels), cross_entropy(logits, labels, 0.3)
    assert float(smoothed[0]) > 10 * float(plain[0])
    np.testing.assert_allclose(smoothed, _xent(logits, labels, 0.3), rtol=1e-5)


def test_cross_entropy_is_float32_for_bf16_logits():
    logits = _x((3, V)).astype(jnp.bfloat16)
    labels = jnp.asarray([0, 3, 6])
    xent = cross_entropy(logits, labels)
    assert xent.dtype == jnp.float32
    np.testing.assert_allclose(xent, _xent(np.asarray(logits.astype(jnp.float32)), labels, 0.0), rtol=1e-5)


def test_cross_entropy_label_shape_is_checked():
    with pytest.raises(TypeCheckError):
        cross_entropy(jnp.zeros((2, 5, V)), jnp.zeros((2, 4), jnp.int32))


def test_soft_cap_formula_and_off_switch():
    x = jnp.linspace(-20.0, 20.0, 9)
    np.testing.assert_array_equal(soft_cap(x, 0.0), x)
    np.testing.assert_allclose(soft_cap(x, 5.0), 5.0 * np.tanh(np.asarray(x) / 5.0), rtol=1e-6)
    assert soft_cap(x.astype(jnp.bfloat16), 5.0).dtype == jnp.bfloat16


def test_shared_embedding_softmax_uses_one_weight_both_ways():
    cfg = SharedEmbeddingSoftmaxConfig(num_classes=V, input_dims=D, scale_sqrt_depth=True, soft_cap_logits=3.0)
    layer = cfg.build(key(0))
    assert layer.w.shape == (V, D) and len(jax.tree.leaves(layer)) == 1
    ids, x = _ids(), _x()
    w = np.asarray(layer.w)
    np.testing.assert_allclose(layer.lookup(ids), w[np.asarray(ids)] * math.sqrt(D), rtol=1e-6)
    assert_matches_reference(layer.logits(x), 3.0 * np.tanh(np.asarray(x) @ w.T / 3.0), rtol=1e-5, atol=1e-6)


def test_shared_embedding_softmax_bias_is_added_to_the_logits_only():
    """Praxis' SharedEmbeddingSoftmax is a FullSoftmax: its logits carry a [vocab] bias (zeros at
    init); the lookup does not."""
    layer = SharedEmbeddingSoftmaxConfig(num_classes=V, input_dims=D, use_bias=True).build(key(0))
    assert layer.b.shape == (V,) and not np.any(layer.b)
    layer = eqx.tree_at(lambda m: m.b, layer, random_normal((V,), 9))
    ids, x = _ids(), _x()
    w, b = np.asarray(layer.w), np.asarray(layer.b)
    np.testing.assert_allclose(layer.lookup(ids), w[np.asarray(ids)], rtol=1e-6)
    assert_matches_reference(layer.logits(x), np.asarray(x) @ w.T + b, rtol=1e-5, atol=1e-6)


def test_shared_embedding_softmax_grad_is_the_sum_of_both_uses():
    layer = SharedEmbeddingSoftmaxConfig(num_classes=V, input_dims=D).build(key(0))
    ids, x, labels = _ids(), _x(), _ids(seed=8)

    def embed_loss(m):
        return jnp.sum(m.lookup(ids) ** 2)

    def softmax_loss(m):
        return jnp.sum(m.xent(m.logits(x), labels))

    @jit
    def grads(m):
        grad = lambda f: eqx.filter_grad(f)(m).w
        return grad(lambda m: embed_loss(m) + softmax_loss(m)), grad(embed_loss), grad(softmax_loss)

    both, g_embed, g_softmax = grads(layer)
    assert_same_math(both, g_embed + g_softmax)
    assert np.any(np.asarray(g_embed) != 0) and np.any(np.asarray(g_softmax) != 0)


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_shared_softmax_xent_and_jit(smoothing):
    layer = SharedEmbeddingSoftmaxConfig(num_classes=V, input_dims=D, label_smoothing_prob=smoothing).build(key(0))
    x, labels = _x(), _ids()
    fn = eqx.filter_jit(lambda m, x, y: m.xent(m.logits(x), y))
    np.testing.assert_allclose(fn(layer, x, labels), _xent(layer.logits(x), labels, smoothing), rtol=1e-5)
