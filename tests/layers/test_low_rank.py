"""LowRankAdapted against the math in numpy: x @ W + s (x * m / (1 - p)) @ A @ B, with the mask m read
back from the layer itself (W = 0, A = B = I, x = 1 gives s m / (1 - p)), through a Linear, an
attention input projection and the output projection, and layer by layer through a pipelined stack;
the reshapes it allows and the uses it refuses."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_eqx.config import ConfigError
from pax_eqx.layers.attentions import _project
from pax_eqx.layers.fp8 import Fp8Scales
from pax_eqx.layers.linears import LinearConfig, dense
from pax_eqx.layers.low_rank import LowRankAdapted
from pax_eqx.layers.pipeline import PipelineConfig, run_pipeline

P, S, R = 0.3, 2.0, 3


def adapted(w, a, b, key, num_in=1, rate=P):
    return LowRankAdapted(jnp.asarray(w), jnp.asarray(a), jnp.asarray(b), key, S, rate, num_in, "test.w")


def mask_of(key, rows: int, fan_in: int) -> np.ndarray:
    """The layer's own mask for an input of `rows` x `fan_in`, read through the math: with W = 0 and
    A = B = I the layer computes s * dropout(x), so x = 1 shows s * m / (1 - p)."""
    eye = np.eye(fan_in, dtype=np.float32)
    probe = adapted(np.zeros((fan_in, fan_in), np.float32), eye, eye, key)
    y = np.asarray(dense(jnp.ones((rows, fan_in), jnp.float32), probe))
    kept = y != 0
    np.testing.assert_allclose(y[kept], S / (1 - P), rtol=1e-6)  # inverted dropout: kept entries scaled
    return kept.astype(np.float32)


def test_a_linear_computes_x_w_plus_scaled_dropped_x_a_b():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 5, 6)).astype(np.float32)
    w, a, b = (rng.normal(size=s).astype(np.float32) for s in ((6, 7), (6, R), (R, 7)))
    key = jax.random.PRNGKey(7)
    layer = eqx.tree_at(
        lambda lin: lin.w, LinearConfig(input_dims=6, output_dims=7).build(jax.random.PRNGKey(0)), adapted(w, a, b, key)
    )
    m = mask_of(key, 20, 6).reshape(4, 5, 6)
    assert 0.4 < m.mean() < 0.95  # p = 0.3 of 120 entries dropped, give or take
    want = x @ w + S * ((x * m / (1 - P)) @ a @ b)
    np.testing.assert_allclose(np.asarray(layer(jnp.asarray(x))), want, rtol=1e-5, atol=1e-5)


def test_attention_projections_split_the_adapter_by_the_weights_input_and_output_sides():
    rng = np.random.default_rng(1)
    d, n, h = 8, 2, 4
    x = rng.normal(size=(2, 3, d)).astype(np.float32)
    key = jax.random.PRNGKey(3)
    m = mask_of(key, 6, d).reshape(2, 3, d)
    # w_q [embed, heads, head_dim]: input embed, output heads x head_dim
    w, a, b = (rng.normal(size=s).astype(np.float32) for s in ((d, n, h), (d, R), (R, n, h)))
    got = np.asarray(_project(jnp.asarray(x), adapted(w, a, b, key), None))
    want = (x @ w.reshape(d, n * h) + S * (x * m / (1 - P)) @ a @ b.reshape(R, n * h)).reshape(2, 3, n, h)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # w_o [heads, head_dim, embed]: input heads x head_dim (the attention's reshape, then dense)
    o = rng.normal(size=(2, 3, n, h)).astype(np.float32)
    w, a, b = (rng.normal(size=s).astype(np.float32) for s in ((n, h, d), (n, h, R), (R, d)))
    w_o = adapted(w, a, b, key, num_in=2)
    assert w_o.shape == (n, h, d)
    got = np.asarray(dense(jnp.asarray(o).reshape(2, 3, n * h), w_o.reshape(n * h, d)))
    flat = o.reshape(6, n * h)
    mo = mask_of(key, 6, n * h)
    want = flat @ w.reshape(n * h, d) + S * (flat * mo / (1 - P)) @ a.reshape(n * h, R) @ b
    np.testing.assert_allclose(got, want.reshape(2, 3, d), rtol=1e-5, atol=1e-5)


def test_the_gradient_reaches_a_and_b():
    rng = np.random.default_rng(2)
    w, a, b = (rng.normal(size=s).astype(np.float32) for s in ((6, 5), (6, R), (R, 5)))
    x = jnp.asarray(rng.normal(size=(4, 6)), jnp.float32)
    key = jax.random.PRNGKey(5)
    m = mask_of(key, 4, 6)
    ga, gb = jax.grad(lambda a_, b_: jnp.sum(dense(x, adapted(w, a_, b_, key))), argnums=(0, 1))(a, b)
    xd = np.asarray(x) * m / (1 - P)  # d sum(s xd A B) / dA = s xd^T 1 B^T; / dB = s (xd A)^T 1
    ones = np.ones((4, 5), np.float32)
    np.testing.assert_allclose(np.asarray(ga), S * xd.T @ ones @ b.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gb), S * (xd @ a).T @ ones, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "use, match",
    [
        (lambda m: m[0], r"indexing"),
        (lambda m: m.T, r"a transpose"),
        (lambda m: jnp.take(m, jnp.array([0]), axis=0), r"converts it to an array"),
        (lambda m: m.astype(jnp.bfloat16), r"a cast"),
        (lambda m: m.reshape(4, 3), r"a reshape to \(4, 3\)"),
        (lambda m: dense(jnp.ones((1, 6)), m, Fp8Scales()), r"fp8"),
    ],
)
def test_any_other_use_of_the_weight_is_refused_naming_it_and_the_fix(use, match):
    rng = np.random.default_rng(4)
    module = adapted(*(rng.normal(size=s).astype(np.float32) for s in ((6, 2), (6, R), (R, 2))), jax.random.PRNGKey(0))
    with pytest.raises(ConfigError, match=match) as error:
        use(module)
    assert "test.w" in str(error.value)
    assert "fp8" in match or "--lora.dropout 0" in str(error.value)


def test_a_pipelined_stack_slices_each_layers_key_with_its_weights():
    """Adapted weights with a leading [layers] axis (keys [layers, 2]) through a circular `run_pipeline`:
    each microbatch (rows j::m) gets layer i's W, A, B and mask, as numpy computes layer by layer. The
    key travels with the weights, so a step's microbatches share each layer's mask."""
    layers, rows, d = 4, 8, 6
    rng = np.random.default_rng(5)
    w, a, b = (rng.normal(size=s).astype(np.float32) * 0.5 for s in ((layers, d, d), (layers, d, R), (layers, R, d)))
    keys = jax.random.split(jax.random.PRNGKey(11), layers)
    stack = LowRankAdapted(jnp.asarray(w), jnp.asarray(a), jnp.asarray(b), keys, S, P, 1, "test.w")

    def stage(stage_units, round_, h, inputs, key):
        def body(h, unit):
            return jnp.tanh(dense(h, unit)), None

        h, _ = jax.lax.scan(body, h, jax.tree.map(lambda x: x[round_], stage_units))
        return h, {}, {}

    x = rng.normal(size=(rows, d)).astype(np.float32)
    microbatches = 2
    cfg = PipelineConfig(num_stages=2, num_microbatches=microbatches, circular_repeat=2)  # 4 layers, 2 rounds
    got = np.asarray(run_pipeline(stage, stack, jnp.asarray(x), {}, None, cfg)[0])
    want = np.empty_like(x)
    masks = [mask_of(keys[i], rows // microbatches, d) for i in range(layers)]
    assert not np.array_equal(masks[0], masks[1])
    for j in range(microbatches):
        h = x[j::microbatches]
        for i in range(layers):
            h = np.tanh(h @ w[i] + S * (h * masks[i] / (1 - P)) @ a[i] @ b[i])
        want[j::microbatches] = h
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
