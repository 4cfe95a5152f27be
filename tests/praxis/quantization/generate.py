"""Writes expected.npz here: Praxis 1.4's quantized layers (praxis/layers/quantization) on small
inputs, for tests/praxis/test_praxis_quantization.py.

For each layer -- Linear, AttentionProjection (a q projection [D, N, H] and an output projection
[N, H, D], use_nhd_shape), CombinedQKVProjectionLayer [3, D, N, H], Embedding, SharedEmbeddingSoftmax
and Conv2D -- it saves the inputs and float weights, and:

- INFERENCE: the weights Praxis materializes (PTQ's `quantize_weight`: int8 values, int4 values
  packed two a byte in Praxis' int8 container, scales, zero points) and the INFERENCE layer's
  outputs on them; int8 and int4, symmetric and (where Praxis supports it) asymmetric, and for
  Linear also with int8 activations (per token and per tensor: the int8 x int8 product).
- TRAINING with fake quantization (QuantizationType.FQ): the outputs and the gradients of
  <output, cotangent> to the inputs and the weights (Praxis has no QAT for Conv2D).
- ops/: Praxis' reduce_precision for 2, 3, 4 and 8 bits, symmetric and not, and with a clipping
  coefficient; pack_4bit; fakequant_einsum's gradient.

Weights are Gaussian, with three columns of a linear's weight set by hand: one whose values land
exactly halfway between two integers at 8 bits (0.5, 1.5, -2.5, ... of the scale 0.5), one doing
the same at 4 bits, and one all zero (Praxis' zero scale, replaced by 1). So the rounding rule
(half to even) and the zero-scale rule are pinned, not just the common case.

Runs only in Praxis' Python 3.10 environment (see tests/fixtures/paxml/generate_fixtures.py):

    cd /tmp && JAX_PLATFORMS=cpu /work/paxenv/bin/python /path/to/tests/praxis/quantization/generate.py
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from praxis import base_layer, pax_fiddle  # noqa: E402
from praxis.layers.quantization import attentions as qattentions  # noqa: E402
from praxis.layers.quantization import convolutions as qconvolutions  # noqa: E402
from praxis.layers.quantization import embedding_softmax as qembedding  # noqa: E402
from praxis.layers.quantization import linears as qlinears  # noqa: E402
from praxis.layers.quantization import operations, utils  # noqa: E402
from praxis.layers.quantization.quantization_hparams import (  # noqa: E402
    ActQuantizationParams,
    QuantizationMode,
    QuantizationParams,
    QuantizationType,
    WeightQuantizationParams,
)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT: dict[str, np.ndarray] = {}
RNG = np.random.default_rng(53)


def normal(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def params(bits, symmetric, mode, kind=QuantizationType.PTQ, act=None):
    return QuantizationParams(
        quantization_type=kind,
        mode=mode,
        act_params=act,
        weight_params=WeightQuantizationParams(
            precision=bits, use_symmetric=symmetric, int4_packed_weights_container_dtype=jnp.int8
        ),
    )


def save(prefix, **arrays):
    for name, value in arrays.items():
        OUT[f"{prefix}/{name}"] = np.asarray(value)


def init(layer, *args, method=None):
    with base_layer.JaxContext.new_context():
        return layer.init(jax.random.PRNGKey(0), *args, method=method)


def apply(layer, variables, *args, method=None):
    with base_layer.JaxContext.new_context():
        return layer.apply(variables, *args, method=method)


def set_params(variables, path, value):
    node = variables["params"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def materialize(cfg, variables):
    """Praxis' MATERIALIZE: the root layer's quantize_weight (recursing into its children)."""
    layer = base_layer.instantiate(cfg)
    return apply(layer, variables, method=layer.quantize_weight)["params"]


def inference(cfg, quantized, *args, method=None):
    """The INFERENCE layer's output on the materialized weights."""
    layer = base_layer.instantiate(cfg)
    return apply(layer, {"params": quantized}, *args, method=method)


def training_fq(cfg, float_params, inputs, cotangent, method=None):
    """FQ training: output and the gradients of <output, cotangent> to the inputs and the params."""
    layer = base_layer.instantiate(cfg)

    def f(p, x):
        return apply(layer, {"params": p}, x, method=method)

    out, vjp = jax.vjp(f, float_params, inputs)
    grad_params, grad_inputs = vjp(cotangent)
    return out, grad_params, grad_inputs


def linear_weight(d_in, d_out):
    """Gaussian, with a column of exact halves at 8 bits, one at 4 bits, and a zero column."""
    w = normal(d_in, d_out, scale=0.5)
    ties8 = np.array([63.5, 0.25, 0.75, -1.25, 2.25, -31.75, 10.25, -0.25], np.float32)  # scale 63.5 / 127 = 0.5
    ties4 = np.array([3.5, 0.25, 0.75, -1.25, 2.25, -0.75, 1.75, -0.25], np.float32)  # scale 3.5 / 7 = 0.5
    w[:, 0] = np.resize(ties8, d_in)
    w[:, 1] = np.resize(ties4, d_in)
    w[:, 2] = 0.0
    return w


def linear_cases():
    d_in, d_out = 16, 12
    x, w = normal(2, 5, d_in, scale=2.0), linear_weight(d_in, d_out)
    cot = normal(2, 5, d_out)
    save("linear", x=x, w=w, cotangent=cot)

    def cfg(q):
        return pax_fiddle.Config(qlinears.Linear, name="linear", input_dims=d_in, output_dims=d_out, quantization=q)

    for bits in (8, 4):
        for symmetric in (True, False):
            name = f"linear/int{bits}_{'symmetric' if symmetric else 'asymmetric'}"
            variables = init(base_layer.instantiate(cfg(params(bits, symmetric, QuantizationMode.MATERIALIZE))), x)
            set_params(variables, ["w"], w)
            quantized = materialize(cfg(params(bits, symmetric, QuantizationMode.MATERIALIZE)), variables)
            out = inference(cfg(params(bits, symmetric, QuantizationMode.INFERENCE)), quantized, x)
            save(name, values=quantized["w"], scale=quantized["w_quantized_scale"], out=out)
            if not symmetric:
                save(name, zero_point=quantized["w_quantized_zp"])
    # int8 activations too: Praxis' int8 x int8 product (per token: its default per_channel=True).
    variables = init(base_layer.instantiate(cfg(params(8, True, QuantizationMode.MATERIALIZE))), x)
    set_params(variables, ["w"], w)
    quantized = materialize(cfg(params(8, True, QuantizationMode.MATERIALIZE)), variables)
    for per_token in (True, False):
        act = ActQuantizationParams(precision=8, per_channel=per_token)
        out = inference(cfg(params(8, True, QuantizationMode.INFERENCE, act=act)), quantized, x)
        save(f"linear/int8_act8_{'per_token' if per_token else 'per_tensor'}", out=out)
    # Fake quantization in training.
    for bits, symmetric, act in ((8, True, None), (4, True, None), (8, False, None), (8, True, 8), (4, True, 4)):
        act_params = None if act is None else ActQuantizationParams(precision=act)
        q = params(bits, symmetric, QuantizationMode.TRAINING, QuantizationType.FQ, act_params)
        out, grad_p, grad_x = training_fq(cfg(q), {"w": jnp.asarray(w)}, jnp.asarray(x), jnp.asarray(cot))
        name = f"linear/fq_int{bits}_{'symmetric' if symmetric else 'asymmetric'}" + (f"_act{act}" if act else "")
        save(name, out=out, grad_x=grad_x, grad_w=grad_p["w"])


def attention_cases():
    d, n, h = 8, 2, 4
    x, xo = normal(2, 5, d, scale=2.0), normal(2, 5, n, h, scale=2.0)
    w_q, w_o = normal(d, n, h, scale=0.5), normal(n, h, d, scale=0.5)
    w_q[:, 0, 0] = np.resize(np.array([63.5, 0.25, 0.75, -1.25], np.float32), d)  # halves at 8 bits
    cot_q, cot_o = normal(2, 5, n, h), normal(2, 5, d)
    save("attention", x=x, x_o=xo, w_q=w_q, w_o=w_o, cotangent_q=cot_q, cotangent_o=cot_o)

    def cfg(q, output):
        return pax_fiddle.Config(
            qattentions.AttentionProjection, name="proj", input_dim=d, num_heads=n, dim_per_head=h,
            is_output_projection=output, use_nhd_shape=True, use_bias=False, quantization=q,
        )  # fmt: skip

    for proj, inputs, w, cot, output in (("q", x, w_q, cot_q, False), ("o", xo, w_o, cot_o, True)):
        for bits, symmetric in ((8, True), (4, True), (8, False)):
            if output and not symmetric:
                continue
            name = f"attention/{proj}_int{bits}_{'symmetric' if symmetric else 'asymmetric'}"
            mat = cfg(params(bits, symmetric, QuantizationMode.MATERIALIZE), output)
            variables = init(base_layer.instantiate(mat), inputs)
            set_params(variables, ["w"], w)
            quantized = materialize(mat, variables)
            out = inference(cfg(params(bits, symmetric, QuantizationMode.INFERENCE), output), quantized, inputs)
            save(name, values=quantized["w"], scale=quantized["w_quantized_scale"], out=out)
            if not symmetric:
                save(name, zero_point=quantized["w_quantized_zp"])
        q = params(8, True, QuantizationMode.TRAINING, QuantizationType.FQ)
        out, grad_p, grad_x = training_fq(cfg(q, output), {"w": jnp.asarray(w)}, jnp.asarray(inputs), jnp.asarray(cot))
        save(f"attention/{proj}_fq_int8_symmetric", out=out, grad_x=grad_x, grad_w=grad_p["w"])


def combined_qkv_cases():
    d, n, h = 8, 2, 4
    x, w = normal(2, 5, d, scale=2.0), normal(3, d, n, h, scale=0.5)
    save("combined_qkv", x=x, w=w)

    def cfg(q):
        return pax_fiddle.Config(
            qattentions.CombinedQKVProjectionLayer, name="qkv", input_dim=d, num_heads=n, dim_per_head=h,
            quantization=q,
        )  # fmt: skip

    for bits in (8, 4):
        mat = cfg(params(bits, True, QuantizationMode.MATERIALIZE))
        variables = init(base_layer.instantiate(mat), x)
        set_params(variables, ["w"], w)
        quantized = materialize(mat, variables)
        q, k, v = inference(cfg(params(bits, True, QuantizationMode.INFERENCE)), quantized, x)
        save(f"combined_qkv/int{bits}_symmetric", values=quantized["w"], scale=quantized["w_quantized_scale"],
             out=np.stack([q, k, v]))  # fmt: skip


def embedding_cases():
    vocab, dims = 10, 8
    ids = RNG.integers(0, vocab, (2, 3)).astype(np.int32)
    table = normal(vocab, dims)
    table[3] = np.resize(np.array([63.5, 0.25, 0.75, -1.25], np.float32), dims)  # a row of halves at 8 bits
    cot = normal(2, 3, dims)
    save("embedding", ids=ids, table=table, cotangent=cot)

    def cfg(q):
        return pax_fiddle.Config(qembedding.Embedding, name="emb", num_classes=vocab, input_dims=dims, quantization=q)

    for bits in (8, 4):
        for symmetric in (True, False):
            name = f"embedding/int{bits}_{'symmetric' if symmetric else 'asymmetric'}"
            mat = cfg(params(bits, symmetric, QuantizationMode.MATERIALIZE))
            layer = base_layer.instantiate(mat)
            variables = init(layer, ids, method=layer.emb_lookup)
            set_params(variables, ["emb_var"], table)
            quantized = materialize(mat, variables)
            inf = base_layer.instantiate(cfg(params(bits, symmetric, QuantizationMode.INFERENCE)))
            out = apply(inf, {"params": quantized}, ids, method=inf.emb_lookup)
            save(name, values=quantized["emb_var"], scale=quantized["emb_var_quantized_scale"], out=out)
            if not symmetric:
                save(name, zero_point=quantized["emb_var_quantized_zp"])
    fq = base_layer.instantiate(cfg(params(8, True, QuantizationMode.TRAINING, QuantizationType.FQ)))

    def lookup(t):
        return apply(fq, {"params": {"emb_var": t}}, jnp.asarray(ids), method=fq.emb_lookup)

    out, vjp = jax.vjp(lookup, jnp.asarray(table))
    save("embedding/fq_int8_symmetric", out=out, grad_table=vjp(jnp.asarray(cot))[0])


def shared_softmax_cases():
    dims, vocab = 8, 10
    x, ids = normal(2, 5, dims, scale=2.0), RNG.integers(0, vocab, (2, 3)).astype(np.int32)
    w, b = normal(dims, vocab), normal(vocab)  # Praxis' [input_dims, num_classes]: pax_eqx's table transposed
    w[:, 4] = np.resize(np.array([63.5, 0.25, 0.75, -1.25], np.float32), dims)
    cot_logits, cot_lookup = normal(2, 5, vocab), normal(2, 3, dims)
    save("shared_softmax", x=x, ids=ids, w=w, b=b, cotangent_logits=cot_logits, cotangent_lookup=cot_lookup)

    def cfg(q):
        return pax_fiddle.Config(
            qembedding.SharedEmbeddingSoftmax, name="softmax", input_dims=dims, num_classes=vocab, quantization=q
        )

    def variables_of(layer):
        variables = init(layer, x, method=layer.get_logits)
        set_params(variables, ["logits_ffn", "linear", "w"], w)
        set_params(variables, ["logits_ffn", "bias", "b"], b)
        return variables

    for bits in (8, 4):
        for symmetric in (True, False):
            name = f"shared_softmax/int{bits}_{'symmetric' if symmetric else 'asymmetric'}"
            mat = cfg(params(bits, symmetric, QuantizationMode.MATERIALIZE))
            quantized = materialize(mat, variables_of(base_layer.instantiate(mat)))
            inf = base_layer.instantiate(cfg(params(bits, symmetric, QuantizationMode.INFERENCE)))
            logits = apply(inf, {"params": quantized}, x, method=inf.get_logits)
            lookup = apply(inf, {"params": quantized}, ids, method=inf.emb_lookup)
            linear = quantized["logits_ffn"]["linear"]
            save(name, values=linear["w"], scale=linear["w_quantized_scale"], logits=logits, lookup=lookup)
            if not symmetric:
                save(name, zero_point=linear["w_quantized_zp"])
    fq = base_layer.instantiate(cfg(params(8, True, QuantizationMode.TRAINING, QuantizationType.FQ)))

    def both(p):
        variables = {"params": {"logits_ffn": {"linear": {"w": p["w"]}, "bias": {"b": p["b"]}}}}
        logits = apply(fq, variables, jnp.asarray(x), method=fq.get_logits)
        lookup = apply(fq, variables, jnp.asarray(ids), method=fq.emb_lookup)
        return logits, lookup

    (logits, lookup), vjp = jax.vjp(both, {"w": jnp.asarray(w), "b": jnp.asarray(b)})
    (grad,) = vjp((jnp.asarray(cot_logits), jnp.asarray(cot_lookup)))
    save("shared_softmax/fq_int8_symmetric", logits=logits, lookup=lookup, grad_w=grad["w"], grad_b=grad["b"])


def conv_cases():
    """Praxis' Conv2D has no quantize_weight; its own test quantizes with reduce_precision over
    the kernel's (H, W, I) axes, as here, and packs int4 along H (its _PACK_4BIT_DIM)."""
    for name, filter_shape, in_channels in (("conv", (2, 3, 4, 6), 4), ("conv_grouped", (3, 3, 2, 6), 4)):
        x, w = normal(2, 5, 5, in_channels), normal(*filter_shape, scale=0.5)
        save(name, x=x, w=w)
        for bits in (8, 4) if filter_shape[0] % 2 == 0 else (8,):
            cfg = pax_fiddle.Config(
                qconvolutions.Conv2D, name="conv", filter_shape=filter_shape, filter_stride=(1, 1), padding="SAME",
                quantization=params(bits, True, QuantizationMode.INFERENCE),
            )  # fmt: skip
            q, s, _ = operations.reduce_precision(jnp.asarray(w), [0, 1, 2], bits=bits)
            stored = utils.pack_4bit(q, 0, jnp.int8) if bits == 4 else q
            out = inference(cfg, {"w": stored, "w_quantized_scale": jnp.squeeze(s)}, x)
            save(f"{name}/int{bits}_symmetric", values=stored, scale=jnp.squeeze(s), out=out)


def op_cases():
    t = normal(6, 10, scale=3.0)
    t[:, 0] = 0.0
    save("ops", t=t)
    for bits in (2, 3, 4, 8):
        for symmetric in (True, False):
            q, s, zp = operations.reduce_precision(jnp.asarray(t), [0], bits=bits, use_symmetric=symmetric)
            name = f"ops/reduce_precision_int{bits}_{'symmetric' if symmetric else 'asymmetric'}"
            save(name, q=q, scale=s)
            if zp is not None:
                save(name, zero_point=zp)
    q, s, _ = operations.reduce_precision(jnp.asarray(t), [0], bits=8, percentile=0.9)
    save("ops/reduce_precision_int8_symmetric_clip0.9", q=q, scale=s)
    q, s, _ = operations.reduce_precision(jnp.asarray(t), None, bits=8)
    save("ops/reduce_precision_int8_symmetric_per_tensor", q=q, scale=s)
    ints = RNG.integers(-8, 8, (6, 4, 3)).astype(np.int8)
    save("ops/pack", ints=ints, packed_axis0=utils.pack_4bit(jnp.asarray(ints), 0, jnp.int8),
         packed_axis1=utils.pack_4bit(jnp.asarray(ints), 1, jnp.int8))  # fmt: skip
    cot = normal(6, 10)
    for bits, symmetric in ((8, True), (4, False)):
        fq, vjp = jax.vjp(
            lambda a, b=bits, s=symmetric: operations.fakequant_einsum("xy,yz->xz", a, bits=b, use_symmetric=s),
            jnp.asarray(t),
        )
        name = f"ops/fakequant_int{bits}_{'symmetric' if symmetric else 'asymmetric'}"
        save(name, out=fq, cotangent=cot, grad=vjp(jnp.asarray(cot))[0])


def main() -> None:
    for cases in (op_cases, linear_cases, attention_cases, combined_qkv_cases, embedding_cases, shared_softmax_cases,
                  conv_cases):  # fmt: skip
        cases()
        print(cases.__name__, "done")
    np.savez_compressed(os.path.join(HERE, "expected.npz"), **OUT)
    print(len(OUT), "arrays")


if __name__ == "__main__":
    jax.config.update("jax_default_matmul_precision", "float32")
    main()
