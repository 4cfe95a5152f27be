"""Masks and the XLA attention kernel, checked element by element."""

import jax.numpy as jnp
import numpy as np
from layer_reference import random_normal

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
    np.testing.assert_allclose(grouped, full, rtol=1e-5, atol=1e-6)


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
