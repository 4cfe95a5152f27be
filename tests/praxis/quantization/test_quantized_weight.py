"""QuantizedWeight as a weight type: the views a layer takes of it, the refusals, the sharding names,
the bytes it stores, and the layers that take it in their weight's place (beyond the Praxis
references: a scanned-free Linear under jit, bf16 inputs, the tied softmax's chunked loss)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import assert_matches_reference

from pax_eqx.config import ConfigError
from pax_eqx.layers import LinearConfig, SharedEmbeddingSoftmaxConfig
from pax_eqx.layers.fp8 import Fp8Scales
from pax_eqx.layers.linears import dense
from pax_eqx.quantization import (
    ActivationQuantizationConfig,
    WeightQuantizationConfig,
    pack_int4,
    quantize_weight,
)
from pax_eqx.sharding.logical import logical_axes

RNG = np.random.default_rng(11)
INT4 = WeightQuantizationConfig(bits=4)
ASYMMETRIC = WeightQuantizationConfig(symmetric=False)
INT8_ACTS = ActivationQuantizationConfig()


def gaussian(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def built(cfg, **arrays):
    """The layer `cfg` builds, with these arrays as its weights (no initialiser compiles)."""
    layer = eqx.filter_eval_shape(cfg.build, jax.random.PRNGKey(0))
    names = list(arrays)
    return eqx.tree_at(lambda m: [getattr(m, n) for n in names], layer, [jnp.asarray(arrays[n]) for n in names])


def test_views_keep_the_channels():
    """reshape (a projection's [embed, heads, head_dim] -> [embed, heads * head_dim], packed pairs
    kept; an output projection's [heads, head_dim, embed] -> [heads * head_dim, embed], unpacked
    first) and .T (the tied table) dequantize to the float views of the dequantized weight."""
    w_q = quantize_weight(gaussian(8, 2, 4), (0,), INT4)
    flat = w_q.reshape(8, 8)
    assert flat.packed_axis == -2 and flat.values.shape == (4, 8) and flat.contract_axes == (-2,)
    np.testing.assert_array_equal(flat.dequantize(), w_q.dequantize().reshape(8, 8))
    w_o = quantize_weight(gaussian(2, 4, 8), (0, 1), INT4)
    flat = w_o.reshape(8, 8)
    assert flat.packed_axis is None and flat.contract_axes == (-2,)
    np.testing.assert_array_equal(flat.dequantize(), w_o.dequantize().reshape(8, 8))
    table = quantize_weight(gaussian(10, 6), (1,), INT4)
    assert table.T.contract_axes == (-2,) and table.T.packed_axis == -2 and table.T.shape == (6, 10)
    np.testing.assert_array_equal(table.T.dequantize(), table.dequantize().T)


def test_every_other_use_is_refused():
    w = quantize_weight(gaussian(8, 6), (0,))
    for use in (
        lambda: jnp.asarray(w),
        lambda: np.asarray(w),
        lambda: w[0],
        lambda: w.astype(jnp.bfloat16),
        lambda: jnp.sum(w),
        lambda: w.reshape(4, 12),  # mixes the input side with the output side
        lambda: quantize_weight(gaussian(2, 8, 6), (1,)).reshape(16, 6),  # contraction axes not leading
        lambda: quantize_weight(gaussian(2, 3, 4), (0,)).T,
        lambda: dense(jnp.ones((2, 8)), w, Fp8Scales()),
        lambda: dense(jnp.ones((2, 6)), quantize_weight(gaussian(8, 6), (1,)).T.T),  # a table, not [in, out]
        lambda: dense(jnp.ones((2, 8)), quantize_weight(gaussian(8, 6), (0,), ASYMMETRIC, activations=INT8_ACTS)),
        lambda: quantize_weight(gaussian(7, 6), (0,), INT4),  # odd size on the packed axis
        lambda: quantize_weight(gaussian(8, 6), (0, 1)),
        lambda: quantize_weight(gaussian(8, 6), (2,)),
    ):  # fmt: skip
        with pytest.raises(ConfigError):
            use()


@pytest.mark.parametrize(
    "field, value", [("bits", 1), ("bits", 9), ("bits", True), ("bits", 8.0), ("clipping", 0.0), ("clipping", 1.5)]
)
def test_configs_name_a_bad_value(field, value):
    with pytest.raises(ConfigError, match=field):
        WeightQuantizationConfig(**{field: value})
    if field == "bits":
        with pytest.raises(ConfigError, match=field):
            ActivationQuantizationConfig(bits=value)


def test_sharding_names_and_stored_bytes():
    """The sharding walker names each array from the float weight's axes (the scales replicated
    on the contraction axes); int8 stores a quarter of float32's bytes, int4 an eighth (+ scales)."""
    layer = built(LinearConfig(input_dims=16, output_dims=32), w=gaussian(16, 32))
    for spec, fraction in ((WeightQuantizationConfig(), 1 / 4), (INT4, 1 / 8)):
        qw = quantize_weight(layer.w, (0,), spec, axes=layer.param_axes()["w"])
        axes = logical_axes(eqx.tree_at(lambda m: m.w, layer, qw)).w
        assert (axes.values, axes.scale, axes.zero_point) == (("embed", "mlp"), (None, "mlp"), None)
        assert qw.values.nbytes == layer.w.nbytes * fraction
        assert pack_int4(jnp.zeros((4, 2), jnp.int8), 0).dtype == jnp.int8
    with pytest.raises(ValueError, match="axes"):
        quantize_weight(layer.w, (0,)).param_axes()


def test_a_quantized_linear_under_jit_and_in_bfloat16():
    layer = built(LinearConfig(input_dims=16, output_dims=8), w=gaussian(16, 8))
    quantized = eqx.tree_at(lambda m: m.w, layer, quantize_weight(layer.w, (0,)))
    x = jnp.asarray(gaussian(3, 16))
    y = eqx.filter_jit(lambda m, x: m(x))(quantized, x)
    w_deq = np.asarray(quantized.w.dequantize(), np.float64)
    assert_matches_reference(np.asarray(y), np.asarray(x, np.float64) @ w_deq, rtol=1e-5, atol=1e-5)
    y16 = quantized(x.astype(jnp.bfloat16))
    assert y16.dtype == jnp.bfloat16
    # bf16 inputs (8 bits of mantissa), float32 accumulation and scaling: the output's bf16 rounding.
    assert_matches_reference(np.asarray(y16, np.float32), np.asarray(y), rtol=2e-2, atol=2e-2)


def test_tied_softmax_chunked_loss_reads_the_quantized_table():
    """The chunked cross-entropy (which reads the [vocab, embed] table in slices of its own)
    equals the one of the float table the integers stand for."""
    layer = built(SharedEmbeddingSoftmaxConfig(num_classes=12, input_dims=8), w=gaussian(12, 8))
    qw = quantize_weight(layer.w, (1,), INT4)
    quantized, dequantized = (eqx.tree_at(lambda m: m.w, layer, w) for w in (qw, qw.dequantize()))
    x, labels = jnp.asarray(gaussian(2, 6, 8)), jnp.asarray(RNG.integers(0, 12, (2, 6)), jnp.int32)
    weights = jnp.ones((2, 6), jnp.float32)
    a, b = (m.chunked_xent_sums(x, labels, weights, 3) for m in (quantized, dequantized))
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
    assert_matches_reference(np.asarray(quantized.logits(x)), np.asarray(dequantized.logits(x)), rtol=1e-5, atol=1e-5)
