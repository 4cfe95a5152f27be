"""pax_eqx.quantization's operations and products against formulas written out in NumPy.

The Praxis references (tests/praxis/test_praxis_quantization.py) pin the numbers to Praxis'; these
pin them to the math, on other shapes and settings (2 to 8 bits, several contraction axes, a
clipping coefficient, per-tensor scales, the straight-through gradient written as a formula), so
a change that moved both would still be seen. NumPy's float32 division and np.round (half to
even) are the operations the module doc names, so the integers and scales compare exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import assert_matches_reference

from pax_eqx.quantization import (
    ActivationQuantizationConfig,
    WeightQuantizationConfig,
    fake_quant,
    pack_int4,
    quantize,
    quantize_weight,
    quantized_conv,
    quantized_lookup,
    quantized_matmul,
    unpack_int4,
)
from pax_eqx.quantization.operations import int_matmul

RNG = np.random.default_rng(7)


def np_quantize(t, bits, axes, symmetric=True, clipping=1.0):
    """The module doc's formulas in float32 NumPy."""
    f = np.float32
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    if symmetric:
        bound, levels, t_min = np.max(np.abs(t), axis=axes, keepdims=True), hi, None
    else:
        t_min = np.min(t, axis=axes, keepdims=True)
        bound, levels = np.max(t, axis=axes, keepdims=True) - t_min, hi - lo
    if clipping < 1.0:
        bound = bound * f(clipping)
    scale = bound / f(levels)
    scale = np.where(scale == 0, f(1), scale).astype(f)
    if symmetric:
        return np.clip(np.round(t / scale), lo, hi).astype(np.int8), scale, None
    z = (f(lo) - t_min / scale).astype(f)
    q = np.clip(np.round(t / scale + z), lo, hi).astype(np.int8)
    return q, scale, (scale * z).astype(f)


def weight(shape, zero_channel=True):
    """Gaussian, with the last output channel all zero (the zero-scale rule)."""
    t = (RNG.standard_normal(shape) * 2.0).astype(np.float32)
    if zero_channel:
        t[..., -1] = 0.0
    return t


@pytest.mark.parametrize(
    "bits, symmetric, axes",
    [
        (2, True, (0,)),
        (3, False, (0,)),
        (5, True, (0, 1, 2)),
        (4, False, (0, 1, 2)),
        (8, True, None),
        (8, False, (-1,)),
    ],
)
def test_quantize_is_the_formula(bits, symmetric, axes):
    t = weight((3, 2, 4, 5))
    q, scale, zero_point = quantize(jnp.asarray(t), bits, axes, symmetric)
    q_np, scale_np, zp_np = np_quantize(t, bits, axes, symmetric)
    np.testing.assert_array_equal(q, q_np)
    np.testing.assert_array_equal(scale, scale_np)
    if symmetric:
        assert zero_point is None
        assert int(np.min(q)) >= -(2 ** (bits - 1)) + 1  # a symmetric grid never uses lo
    else:
        np.testing.assert_array_equal(zero_point, zp_np)


def test_quantize_clipping_saturates():
    t = weight((16, 4), zero_channel=False)
    q, scale, _ = quantize(jnp.asarray(t), 8, (0,), True, 0.5)
    q_np, scale_np, _ = np_quantize(t, 8, (0,), True, 0.5)
    np.testing.assert_array_equal(q, q_np)
    np.testing.assert_array_equal(scale, scale_np)
    assert (np.abs(np.asarray(q)) == 127).sum() > 4  # the channel's top half saturated


def np_fake_quant_vjp(t, g, bits, axes):
    """Praxis' straight-through gradient, symmetric, as a formula. With u = t / s, q = round(u),
    c = clip(q) and s = max|t| / hi over `axes`:
        out = c * s
        d out / d t = g * k  +  [a channel's sum of g * (c - k * u)] * ds/dt,
    k = 1 inside (lo, hi), 1/2 where q is at lo or hi (jnp.clip's derivative there), 0 beyond;
    ds/dt = sign(t) / hi at the channel's max |t| (split between ties), 0 elsewhere."""
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    m = np.max(np.abs(t), axis=axes, keepdims=True)
    s = np.where(m == 0, np.float32(1), m / np.float32(hi)).astype(np.float32)
    u = t / s
    q = np.round(u)
    c = np.clip(q, lo, hi)
    k = np.where((q > lo) & (q < hi), 1.0, np.where((q == lo) | (q == hi), 0.5, 0.0))
    at_max = (np.abs(t) == m) & (m > 0)
    ds_dt = np.sign(t) * at_max / np.sum(at_max, axis=axes, keepdims=True).clip(1) / hi
    channel = np.sum(g.astype(np.float64) * (c - k * u), axis=axes, keepdims=True)
    return c * s, g * k + channel * ds_dt


@pytest.mark.parametrize("bits, axes", [(8, (0,)), (3, (-1,)), (4, None)])
def test_fake_quant_and_its_gradient_are_the_formula(bits, axes):
    t, g = weight((12, 6)), RNG.standard_normal((12, 6)).astype(np.float32)
    out, vjp = jax.vjp(lambda a: fake_quant(a, bits, axes), jnp.asarray(t))
    out_np, grad_np = np_fake_quant_vjp(t, g, bits, axes)
    np.testing.assert_array_equal(out, out_np.astype(np.float32))
    # Float32 against float64 sums of a channel's dozen terms: a few ulps of the gradient's scale.
    assert_matches_reference(np.asarray(vjp(jnp.asarray(g))[0]), grad_np, rtol=1e-5, atol=1e-5)


def test_fake_quant_asymmetric_forward_and_dtype():
    t = weight((10, 3))
    q, scale, zp = np_quantize(t, 4, (0,), symmetric=False)
    # q * scale - zero_point: XLA may fuse it into one multiply-add (1 ulp from NumPy's two roundings).
    expected = q.astype(np.float64) * scale - zp
    assert_matches_reference(np.asarray(fake_quant(jnp.asarray(t), 4, (0,), False)), expected, rtol=1e-6, atol=1e-7)
    assert fake_quant(jnp.asarray(t, jnp.bfloat16), 8, (0,)).dtype == jnp.bfloat16


@pytest.mark.parametrize("axis", [0, -1])
def test_int4_packing_is_the_formula(axis):
    ints = RNG.integers(-8, 8, (4, 6, 2)).astype(np.int8)
    moved = np.moveaxis(ints, axis, 0)
    low, high = moved[0::2].astype(np.uint8) & 0x0F, moved[1::2].astype(np.uint8) & 0x0F
    expected = np.moveaxis((low | (high << 4)).view(np.int8), 0, axis)
    packed = pack_int4(jnp.asarray(ints), axis)
    np.testing.assert_array_equal(packed, expected)
    np.testing.assert_array_equal(unpack_int4(packed, axis), ints)


def test_int_matmul_is_exact_at_the_extremes():
    x = np.full((2, 300), -128, np.int8)
    w = RNG.integers(-128, 128, (300, 5)).astype(np.int8)
    w[:, 0] = -128
    y = int_matmul(jnp.asarray(x), jnp.asarray(w))
    assert y.dtype == jnp.int32
    np.testing.assert_array_equal(y, x.astype(np.int64) @ w.astype(np.int64))  # 4.9M in column 0


@pytest.mark.parametrize("bits, symmetric", [(8, True), (4, False)])
def test_matmul_is_x_times_the_dequantized_weight(bits, symmetric):
    x, w = RNG.standard_normal((3, 4, 8)).astype(np.float32), weight((8, 6))
    qw = quantize_weight(w, (0,), WeightQuantizationConfig(bits=bits, symmetric=symmetric))
    q, scale, zp = np_quantize(w, bits, (0,), symmetric)
    w_deq = q.astype(np.float64) * scale - (0 if zp is None else zp)
    assert_matches_reference(np.asarray(qw.dequantize()), w_deq, rtol=1e-6, atol=1e-7)  # 1 ulp: see above
    assert_matches_reference(np.asarray(quantized_matmul(jnp.asarray(x), qw)), x @ w_deq, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("per_token", [True, False])
def test_matmul_with_int8_activations_is_the_formula(per_token):
    x, w = RNG.standard_normal((5, 8)).astype(np.float32) * 3, weight((8, 6))
    acts = ActivationQuantizationConfig(per_token=per_token)
    qw = quantize_weight(w, (0,), activations=acts)
    xq, xs, _ = np_quantize(x, 8, (-1,) if per_token else None)
    q, s, _ = np_quantize(w, 8, (0,))
    expected = (xq.astype(np.int64) @ q.astype(np.int64)) * xs.astype(np.float64) * s
    assert_matches_reference(np.asarray(quantized_matmul(jnp.asarray(x), qw)), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bits, symmetric", [(8, True), (4, False)])
def test_lookup_is_the_rows_of_the_dequantized_table(bits, symmetric):
    table, ids = weight((9, 6)), RNG.integers(0, 9, (2, 5)).astype(np.int32)
    qt = quantize_weight(table, (1,), WeightQuantizationConfig(bits=bits, symmetric=symmetric))
    q, scale, zp = np_quantize(table, bits, (1,), symmetric)
    rows = q * scale - (0 if zp is None else zp)
    np.testing.assert_array_equal(quantized_lookup(qt, jnp.asarray(ids)), rows[ids])


@pytest.mark.parametrize("activations", [None, ActivationQuantizationConfig(per_token=False)])
def test_conv_is_the_conv_of_the_dequantized_kernel(activations):
    x, w = RNG.standard_normal((2, 5, 6, 4)).astype(np.float32), weight((2, 3, 4, 6))
    qw = quantize_weight(w, (0, 1, 2), WeightQuantizationConfig(bits=4), activations=activations)
    conv = dict(window_strides=(1, 2), padding="SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    q, s, _ = np_quantize(w, 4, (0, 1, 2))
    x_used = x
    if activations is not None:  # the input quantized per tensor, convolved in int32
        xq, xs, _ = np_quantize(x, 8, None)
        x_used = xq.astype(np.float64) * xs
    expected = jax.lax.conv_general_dilated(
        jnp.asarray(x_used, jnp.float32), jnp.asarray(q * s, jnp.float32), precision="highest", **conv
    )
    assert_matches_reference(np.asarray(quantized_conv(jnp.asarray(x), qw, **conv)), expected, rtol=1e-5, atol=1e-5)
