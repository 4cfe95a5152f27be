"""Quantized weights against Praxis 1.4 itself (praxis/layers/quantization).

quantization/expected.npz is written by quantization/generate.py in Praxis' own environment: for
Linear, AttentionProjection (q and output projections), CombinedQKVProjectionLayer, Embedding,
SharedEmbeddingSoftmax and Conv2D, the integers and scales Praxis materializes (int8; int4 packed
two a byte; symmetric and asymmetric) and its INFERENCE outputs on them, and its training outputs
and gradients with fake quantization (QuantizationType.FQ); and Praxis' operations alone.

The claims: pax_eqx's integers (packed bytes included) EQUAL Praxis', and so do the scales and
zero points (the same float32 operations in the same order); the outputs and gradients are within
Praxis' own test tolerance, assertAllClose's rtol = atol = 1e-5 (praxis/test_utils.py; its
quantization tests compare a layer with its float twin at that default). The layers run as they
are, with a QuantizedWeight (or the fake-quantized float weight) in their weight's place; the
attention projections as `Attention._project` computes them (`dense` of the reshaped weight).

Praxis' [input_dims, num_classes] tied softmax weight is pax_eqx's [vocab, embed] table transposed.
"""

from __future__ import annotations

from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import assert_matches_reference

from pax_eqx.layers import (
    Conv2DConfig,
    EmbeddingConfig,
    LinearConfig,
    SharedEmbeddingSoftmaxConfig,
)
from pax_eqx.layers.linears import dense
from pax_eqx.quantization import (
    ActivationQuantizationConfig,
    WeightQuantizationConfig,
    fake_quant,
    pack_int4,
    quantize,
    quantize_weight,
    unpack_int4,
)

EXPECTED = np.load(Path(__file__).resolve().parent / "quantization" / "expected.npz")
PRAXIS_TOL = dict(rtol=1e-5, atol=1e-5)  # praxis.test_utils.TestCase.assertAllClose's default
KEY = jax.random.PRNGKey(0)
INFERENCE = [(8, True), (8, False), (4, True), (4, False)]


def e(name: str) -> np.ndarray:
    return EXPECTED[name]


def case_name(bits: int, symmetric: bool) -> str:
    return f"int{bits}_{'symmetric' if symmetric else 'asymmetric'}"


def assert_quantized_equal(qw, prefix: str, *, transpose: bool = False):
    """The integers (as stored: packed bytes for int4), scales and zero points equal Praxis'
    (whose scales are squeezed to the output channels)."""
    flip = np.transpose if transpose else (lambda a: a)
    np.testing.assert_array_equal(flip(np.asarray(qw.values)), e(f"{prefix}/values"))
    np.testing.assert_array_equal(flip(np.asarray(qw.scale)).squeeze(), e(f"{prefix}/scale"))
    if f"{prefix}/zero_point" in EXPECTED:
        np.testing.assert_array_equal(flip(np.asarray(qw.zero_point)).squeeze(), e(f"{prefix}/zero_point"))
    else:
        assert qw.zero_point is None


def praxis_close(actual, name: str):
    assert_matches_reference(np.asarray(actual), e(name), err_msg=name, **PRAXIS_TOL)


def abstract(cfg):
    """The layer `cfg` builds, its weights shapes only (no initialiser runs: each would compile):
    every test puts its own weights in."""
    return eqx.filter_eval_shape(cfg.build, KEY)


def output_and_grads(forward, args, cotangent):
    """forward(*args) and the gradients of <forward(*args), cotangent> to each arg, in one jitted
    program (op by op, each of fake_quant's dozens of small ops would compile on its own)."""

    @jax.jit
    def run(args, cotangent):
        out, vjp = jax.vjp(forward, *args)
        return out, vjp(cotangent)

    return run(tuple(jnp.asarray(a) for a in args), jax.tree.map(jnp.asarray, cotangent))


# Praxis' operations. ------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
def test_quantize_equals_praxis_reduce_precision(bits, symmetric):
    prefix = f"ops/reduce_precision_{case_name(bits, symmetric)}"
    q, scale, zero_point = quantize(jnp.asarray(e("ops/t")), bits, (0,), symmetric)
    np.testing.assert_array_equal(q, e(f"{prefix}/q"))
    np.testing.assert_array_equal(scale, e(f"{prefix}/scale"))
    if symmetric:
        assert zero_point is None
    else:
        np.testing.assert_array_equal(zero_point, e(f"{prefix}/zero_point"))


def test_quantize_clipping_and_per_tensor_equal_praxis():
    t = jnp.asarray(e("ops/t"))
    for prefix, (axes, clipping) in {
        "ops/reduce_precision_int8_symmetric_clip0.9": ((0,), 0.9),
        "ops/reduce_precision_int8_symmetric_per_tensor": (None, 1.0),
    }.items():
        q, scale, _ = quantize(t, 8, axes, True, clipping)
        np.testing.assert_array_equal(q, e(f"{prefix}/q"))
        np.testing.assert_array_equal(scale, e(f"{prefix}/scale"))


def test_int4_packing_equals_praxis():
    ints = jnp.asarray(e("ops/pack/ints"))
    for axis in (0, 1):
        packed = pack_int4(ints, axis)
        np.testing.assert_array_equal(packed, e(f"ops/pack/packed_axis{axis}"))
        np.testing.assert_array_equal(unpack_int4(packed, axis), ints)


@pytest.mark.parametrize("bits, symmetric", [(8, True), (4, False)])
def test_fake_quant_and_its_straight_through_gradient_equal_praxis(bits, symmetric):
    prefix = f"ops/fakequant_{case_name(bits, symmetric)}"
    forward = lambda t: fake_quant(t, bits, (0,), symmetric)
    out, (grad,) = output_and_grads(forward, (e("ops/t"),), e(f"{prefix}/cotangent"))
    praxis_close(out, f"{prefix}/out")
    praxis_close(grad, f"{prefix}/grad")


# Linear: Praxis' quantized Linear. ---------------------------------------------------------------


def _linear(w):
    return eqx.tree_at(lambda m: m.w, abstract(LinearConfig(input_dims=16, output_dims=12)), w)


def asymmetric_atol(x: np.ndarray, qw) -> float:
    """An asymmetric product is Praxis' (x @ q) * scale - sum(x) * zero_point: two terms up to
    thousands (|q| reaches 128, the zero point 128 * scale) whose difference is the output, so
    each side's float32 rounding of them (~1 ulp of the larger term; Praxis' own output is that far
    from the float64 value too) shows in the output. Praxis' 1e-5, plus 4 ulps of the largest term."""
    rows = np.abs(x.reshape(-1, x.shape[-1]).astype(np.float64))
    q = np.abs(np.asarray(qw.int_values(), np.float64))
    scale, zp = (np.abs(np.asarray(a, np.float64)) for a in (qw.scale, qw.zero_point))
    terms = rows @ q * scale + rows.sum(-1, keepdims=True) * zp
    return 1e-5 + 4 * float(np.finfo(np.float32).eps) * float(terms.max())


@pytest.mark.parametrize("bits, symmetric", INFERENCE)
def test_linear_inference(bits, symmetric):
    prefix = f"linear/{case_name(bits, symmetric)}"
    qw = quantize_weight(e("linear/w"), (0,), WeightQuantizationConfig(bits=bits, symmetric=symmetric))
    assert_quantized_equal(qw, prefix)
    x = e("linear/x")
    out = eqx.filter_jit(lambda layer, x: layer(x))(_linear(qw), jnp.asarray(x))
    if symmetric:
        praxis_close(out, f"{prefix}/out")
    else:
        atol = asymmetric_atol(x, qw)
        assert atol < 5e-3  # terms up to ~8000 here (4 ulps: 3.8e-3), outputs up to ~470
        assert_matches_reference(np.asarray(out), e(f"{prefix}/out"), rtol=1e-5, atol=atol, err_msg=prefix)


@pytest.mark.parametrize("per_token", [True, False])
def test_linear_inference_with_int8_activations(per_token):
    """Praxis' int8 x int8 product, accumulated in int32, scaled by both sides after."""
    acts = ActivationQuantizationConfig(bits=8, per_token=per_token)
    qw = quantize_weight(e("linear/w"), (0,), activations=acts)
    name = f"linear/int8_act8_{'per_token' if per_token else 'per_tensor'}/out"
    praxis_close(_linear(qw)(jnp.asarray(e("linear/x"))), name)


@pytest.mark.parametrize(
    "bits, symmetric, act",
    [(8, True, None), (4, True, None), (8, False, None), (8, True, 8), (4, True, 4)],
)
def test_linear_fake_quant_training(bits, symmetric, act):
    """Praxis' FQ training: the weight (and the activations, per token as Praxis' default)
    fake-quantized, the product in float; the output and both gradients."""
    name = f"linear/fq_{case_name(bits, symmetric)}" + (f"_act{act}" if act else "")

    def forward(x, w):
        x = x if act is None else fake_quant(x, act, (-1,))
        return _linear(fake_quant(w, bits, (0,), symmetric))(x)

    out, (grad_x, grad_w) = output_and_grads(forward, (e("linear/x"), e("linear/w")), e("linear/cotangent"))
    praxis_close(out, f"{name}/out")
    praxis_close(grad_x, f"{name}/grad_x")
    praxis_close(grad_w, f"{name}/grad_w")


# Attention projections: Praxis' AttentionProjection and CombinedQKVProjectionLayer. ----------------


def _project_q(x, w):
    """`attentions._project`: x [B, T, D] by w [D, N, H] as one [D, N * H] product."""
    d, n, h = w.shape
    return dense(x, w.reshape(d, n * h)).reshape(*x.shape[:-1], n, h)


def _project_o(x, w):
    """`Attention`'s output projection: x [B, T, N, H] by w [N, H, D] as one [N * H, D] product."""
    n, h, d = w.shape
    return dense(x.reshape(*x.shape[:-2], n * h), w.reshape(n * h, d))


ATTENTION = {"q": (_project_q, (0,), "x"), "o": (_project_o, (0, 1), "x_o")}


@pytest.mark.parametrize(
    "proj, bits, symmetric", [("q", 8, True), ("q", 4, True), ("q", 8, False), ("o", 8, True), ("o", 4, True)]
)
def test_attention_projection_inference(proj, bits, symmetric):
    """The output projection's int4 values are packed along heads (the first input axis, Praxis'
    too); its [heads * head_dim, embed] reshape unpacks them first."""
    project, contract, x = ATTENTION[proj]
    prefix = f"attention/{proj}_{case_name(bits, symmetric)}"
    qw = quantize_weight(e(f"attention/w_{proj}"), contract, WeightQuantizationConfig(bits=bits, symmetric=symmetric))
    assert_quantized_equal(qw, prefix)
    praxis_close(project(jnp.asarray(e(f"attention/{x}")), qw), f"{prefix}/out")


@pytest.mark.parametrize("proj", ["q", "o"])
def test_attention_projection_fake_quant_training(proj):
    project, contract, x = ATTENTION[proj]
    name = f"attention/{proj}_fq_int8_symmetric"
    forward = lambda x, w: project(x, fake_quant(w, 8, contract))
    args = (e(f"attention/{x}"), e(f"attention/w_{proj}"))
    out, (grad_x, grad_w) = output_and_grads(forward, args, e(f"attention/cotangent_{proj}"))
    praxis_close(out, f"{name}/out")
    praxis_close(grad_x, f"{name}/grad_x")
    praxis_close(grad_w, f"{name}/grad_w")


@pytest.mark.parametrize("bits", [8, 4])
def test_combined_qkv_inference(bits):
    """Praxis quantizes [3, D, N, H] over D (one scale per projection, head and dim): the same
    integers and scales as each projection's weight quantized alone, which is how they are
    compared (pax_eqx's combined projection moves the stack axis before its product)."""
    prefix = f"combined_qkv/int{bits}_symmetric"
    w, x = e("combined_qkv/w"), jnp.asarray(e("combined_qkv/x"))
    spec = WeightQuantizationConfig(bits=bits)
    for c in range(3):
        qw = quantize_weight(w[c], (0,), spec)
        np.testing.assert_array_equal(qw.values, e(f"{prefix}/values")[c])
        np.testing.assert_array_equal(np.asarray(qw.scale).squeeze(), e(f"{prefix}/scale")[c])
        assert_matches_reference(np.asarray(_project_q(x, qw)), e(f"{prefix}/out")[c], **PRAXIS_TOL)


# Embedding and the tied softmax. -----------------------------------------------------------------


def _embedding(table):
    return eqx.tree_at(lambda m: m.emb_var, abstract(EmbeddingConfig(num_classes=10, input_dims=8)), table)


@pytest.mark.parametrize("bits, symmetric", INFERENCE)
def test_embedding_inference(bits, symmetric):
    """Per-row (per token id) scales. Praxis keeps its Embedding's int4 values one a byte;
    pax_eqx packs them, so the unpacked integers are compared."""
    prefix = f"embedding/{case_name(bits, symmetric)}"
    qw = quantize_weight(e("embedding/table"), (1,), WeightQuantizationConfig(bits=bits, symmetric=symmetric))
    np.testing.assert_array_equal(qw.int_values(), e(f"{prefix}/values"))
    assert (qw.packed_axis is not None) == (bits == 4)
    np.testing.assert_array_equal(np.asarray(qw.scale).squeeze(), e(f"{prefix}/scale"))
    if not symmetric:
        np.testing.assert_array_equal(np.asarray(qw.zero_point).squeeze(), e(f"{prefix}/zero_point"))
    praxis_close(_embedding(qw)(jnp.asarray(e("embedding/ids"))), f"{prefix}/out")


def test_embedding_fake_quant_training():
    ids = jnp.asarray(e("embedding/ids"))
    forward = lambda t: _embedding(fake_quant(t, 8, (1,)))(ids)
    out, (grad,) = output_and_grads(forward, (e("embedding/table"),), e("embedding/cotangent"))
    praxis_close(out, "embedding/fq_int8_symmetric/out")
    praxis_close(grad, "embedding/fq_int8_symmetric/grad_table")


def _shared(table, b):
    layer = abstract(SharedEmbeddingSoftmaxConfig(num_classes=10, input_dims=8, use_bias=True))
    return eqx.tree_at(lambda m: (m.w, m.b), layer, (table, b))


@pytest.mark.parametrize("bits, symmetric", INFERENCE)
def test_shared_embedding_softmax_inference(bits, symmetric):
    """One quantized [vocab, embed] table, per-vocab scales: the logits' output channels and the
    lookup's rows. Praxis' int4 bytes are packed along its input_dims, pax_eqx's along embed."""
    prefix = f"shared_softmax/{case_name(bits, symmetric)}"
    table = e("shared_softmax/w").T
    qw = quantize_weight(table, (1,), WeightQuantizationConfig(bits=bits, symmetric=symmetric))
    assert_quantized_equal(qw, prefix, transpose=True)
    layer = _shared(qw, jnp.asarray(e("shared_softmax/b")))
    praxis_close(layer.logits(jnp.asarray(e("shared_softmax/x"))), f"{prefix}/logits")
    praxis_close(layer.lookup(jnp.asarray(e("shared_softmax/ids"))), f"{prefix}/lookup")


def test_shared_embedding_softmax_fake_quant_training():
    """Praxis fake-quantizes the tied weight per class in both uses; the gradient is their sum."""
    x, ids = jnp.asarray(e("shared_softmax/x")), jnp.asarray(e("shared_softmax/ids"))

    def forward(table, b):
        layer = _shared(fake_quant(table, 8, (1,)), b)
        return layer.logits(x), layer.lookup(ids)

    args = (e("shared_softmax/w").T, e("shared_softmax/b"))
    cotangent = (e("shared_softmax/cotangent_logits"), e("shared_softmax/cotangent_lookup"))
    (logits, lookup), (grad_table, grad_b) = output_and_grads(forward, args, cotangent)
    praxis_close(logits, "shared_softmax/fq_int8_symmetric/logits")
    praxis_close(lookup, "shared_softmax/fq_int8_symmetric/lookup")
    praxis_close(grad_table.T, "shared_softmax/fq_int8_symmetric/grad_w")
    praxis_close(grad_b, "shared_softmax/fq_int8_symmetric/grad_b")


# Conv2D. -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, bits", [("conv", 8), ("conv", 4), ("conv_grouped", 8)])
def test_conv2d_inference(name, bits):
    """Per output channel over the kernel's (H, W, I); int4 packed along H (Praxis' too)."""
    w, x = e(f"{name}/w"), jnp.asarray(e(f"{name}/x"))
    kh, kw, cin, cout = w.shape
    groups = x.shape[-1] // cin
    qw = quantize_weight(w, (0, 1, 2), WeightQuantizationConfig(bits=bits))
    assert_quantized_equal(qw, f"{name}/int{bits}_symmetric")
    cfg = Conv2DConfig(
        input_channels=x.shape[-1], output_channels=cout, kernel_size=(kh, kw), feature_group_count=groups
    )
    conv = eqx.tree_at(lambda m: m.w, abstract(cfg), qw)
    praxis_close(conv(x), f"{name}/int{bits}_symmetric/out")
