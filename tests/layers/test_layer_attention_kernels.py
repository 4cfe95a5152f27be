"""Masks and the XLA attention kernel, checked element by element."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from layer_reference import random_normal
from tolerances import assert_matches_reference, assert_same_math

from pax_eqx.layers import attention_kernels as kernels


def test_causal_mask():
    mask = kernels.make_mask(4, 4, causal=True)
    assert mask.shape == (1, 1, 4, 4)
    np.testing.assert_array_equal(mask[0, 0], np.tril(np.ones((4, 4), bool)))


def test_causal_mask_with_query_offset_for_decoding():
    # Two queries at positions 3 and 4 of a 6-slot cache.
    mask = kernels.make_mask(2, 6, causal=True, q_offset=jnp.int32(3))
    expected = np.arange(6)[None, :] <= np.asarray([3, 4])[:, None]
    np.testing.assert_array_equal(mask[0, 0], expected)


def test_segment_and_key_valid_masks_combine_with_causal():
    seg = jnp.asarray([[1, 1, 2, 2, 0]])
    valid = jnp.asarray([[True, False, True, True, True]])
    mask = kernels.make_mask(5, 5, causal=True, segment_ids_q=seg, segment_ids_k=seg, key_valid=valid)
    s = np.asarray(seg[0])
    expected = np.tril(np.ones((5, 5), bool)) & (s[:, None] == s[None, :]) & np.asarray(valid[0])[None, :]
    np.testing.assert_array_equal(mask[0, 0], expected)


def test_no_mask_at_all():
    assert kernels.make_mask(3, 3, causal=False) is None


def test_xla_attention_grouped_equals_repeated_heads():
    q = random_normal((2, 5, 6, 4), 1)
    k = random_normal((2, 5, 2, 4), 2)
    v = random_normal((2, 5, 2, 4), 3)
    mask = kernels.make_mask(5, 5, causal=True)
    grouped = kernels.xla_attention(q, k, v, mask, scale=0.5)
    full = kernels.xla_attention(q, jnp.repeat(k, 3, axis=2), jnp.repeat(v, 3, axis=2), mask, scale=0.5)
    assert_same_math(grouped, full)


def test_fully_masked_row_is_finite():
    q = jnp.ones((1, 2, 1, 4))
    mask = jnp.zeros((1, 1, 2, 2), bool)
    out = kernels.xla_attention(q, q, q, mask, scale=1.0)
    assert np.all(np.isfinite(out))


def test_cudnn_does_not_qualify_on_cpu_or_with_a_logit_cap():
    q = jnp.ones((1, 2, 1, 64), jnp.bfloat16)
    assert not kernels.cudnn_qualifies(q, 0.0, False)  # the tests run on CPU
    assert not kernels.cudnn_qualifies(q, 50.0, False)
    assert not kernels.cudnn_qualifies(q, 0.0, True)


def _dead_row_case():
    """q [1, 4, 4(heads), 4], k/v with 2 kv heads, a causal mask with the first two keys padded and
    Praxis' padded query rows: rows 0 and 1 (left padding) and 3 (a padded query) have no key."""
    q, k, v = random_normal((1, 4, 4, 4), 1), random_normal((1, 4, 2, 4), 2), random_normal((1, 4, 2, 4), 3)
    valid = jnp.asarray([[False, False, True, False]])
    mask = kernels.make_mask(4, 4, causal=True, key_valid=valid) & valid[:, None, :, None]
    return q, k, v, mask


@pytest.mark.parametrize("kernel", ["xla", "cudnn_wrapper"])
def test_rows_without_a_key_are_uniform_and_pass_no_gradient_to_queries_keys_or_bias(kernel):
    """Praxis replaces masked logits, so a row without a key is the values' mean and its output
    depends on neither queries, keys nor a logit bias. cudnn_wrapper: `cudnn_attention`'s
    handling of such rows around JAX's XLA reference of the cuDNN call (no GPU here)."""
    q, k, v, mask = _dead_row_case()
    bias = random_normal((1, 4, 4, 4), 4)
    dead = np.asarray([0, 1, 3])

    def attend(q, k, v, bias):
        if kernel == "xla":
            return kernels.xla_attention(q, k, v, mask, scale=0.5, bias=bias)
        return kernels.cudnn_attention(q, k, v, mask, scale=0.5, causal_only=False, bias=bias, implementation="xla")

    out = attend(q, k, v, bias)
    uniform = np.repeat(np.asarray(v).mean(axis=1), 2, axis=1)  # [1, heads, dim]
    for row in dead:
        assert_matches_reference(out[0, row], uniform[0], rtol=0, atol=1e-6)
    cotangent = jnp.zeros(out.shape).at[:, dead].set(random_normal((1, 3, 4, 4), 5))
    dq, dk, dv, dbias = jax.grad(lambda *a: jnp.sum(attend(*a) * cotangent), argnums=(0, 1, 2, 3))(q, k, v, bias)
    assert not np.any(dq) and not np.any(dk) and not np.any(dbias)
    assert np.all(np.abs(dv) > 0)  # the mean of the values is what those rows are


def test_cudnn_wrapper_equals_xla_kernel_in_outputs_and_gradients():
    q, k, v, mask = _dead_row_case()
    cotangent = random_normal((1, 4, 4, 4), 6)
    xla = lambda q, k, v: jnp.sum(kernels.xla_attention(q, k, v, mask, scale=0.5) * cotangent)
    wrapped = lambda q, k, v: jnp.sum(
        kernels.cudnn_attention(q, k, v, mask, scale=0.5, causal_only=False, implementation="xla") * cotangent
    )
    for a, b in zip(jax.grad(xla, argnums=(0, 1, 2))(q, k, v), jax.grad(wrapped, argnums=(0, 1, 2))(q, k, v)):
        assert_same_math(a, b)


@pytest.mark.parametrize("mask_mode, paddings", [("praxis", [[0, 0, 1, 1]]), ("pax_eqx", [[1, 1, 0, 0]])])
def test_attention_layer_rows_without_a_key_ignore_q_and_k_weights(mask_mode, paddings):
    """The issue's repro: scaling w_q and w_k does not change a row without a key, so their
    gradients from that row are 0 (they were up to 1.69 with the mask added to the logits), in
    Praxis' mask mode (a padded query) and the default one (a left-padded query at position 0)."""
    from pax_eqx.layers import AttentionConfig
    from pax_eqx.layers.base import Context

    att = AttentionConfig(mask_mode=mask_mode, implementation="xla", use_bias=True).build(
        jax.random.PRNGKey(0), input_dims=8, num_heads=2, dim_per_head=4
    )
    x, pad = random_normal((1, 4, 8), 7), jnp.asarray(paddings, jnp.float32)
    row = 3 if mask_mode == "praxis" else 0
    grads = eqx.filter_grad(lambda m: jnp.sum(m(x, Context(), paddings=pad)[0][:, row]))(att)
    for name in ("w_q", "w_k", "b_q", "b_k"):
        assert not np.any(getattr(grads, name)), name
    assert np.any(grads.w_v) and np.any(grads.w_o)
