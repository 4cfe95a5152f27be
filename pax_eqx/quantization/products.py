"""The three products a layer takes of a QuantizedWeight: Praxis' INFERENCE mode (`quantized_einsum`,
the quantized embedding lookups, `quantized_conv`), one function each.

    quantized_matmul(x, w)      x [..., in] @ w [in, out]            (linears.dense)
    quantized_lookup(table, ids)  table [vocab, embed] rows at ids     (embedding_softmax)
    quantized_conv(x, w, ...)   NHWC x HWIO                          (convolutions.Conv2D)

Float activations (the weight's `activations` is None): the integers are widened to x's dtype (a
convert XLA may fuse into the matmul), the product accumulates in float32 and the output channels
are scaled *after* it: one multiply per output, not per weight. An asymmetric weight's zero point
comes off as sum(x) * zero_point per row (Praxis' compute_offset).

Quantized activations: x is quantized on the fly (symmetric; per token or per tensor), the
product is int8 x int8 accumulating in int32 (exact), then scaled by both scales (Praxis' einsum
with `preferred_element_type=jnp.int32`). Refused with it: an asymmetric weight (its zero point
would multiply the quantized activations; Praxis' aqt_einsum refuses it, its INFERENCE einsum
computes it without the activations' scale).

Outputs are in x's dtype; the scaling is float32.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from pax_eqx.config import ConfigError
from pax_eqx.quantization.operations import activation_axes, int_matmul, quantize, unpack_int4
from pax_eqx.quantization.quantized_weight import QuantizedWeight


def _require(w: QuantizedWeight, ndim: int, contract: tuple[int, ...], product: str, layout: str) -> None:
    if w.ndim != ndim or w.contract_axes != contract:
        raise ConfigError(
            f"{product} takes a weight {layout} quantized over its contraction axes {contract}; this one has shape "
            f"{w.shape} and contraction axes {w.contract_axes}. Quantize it over its input side "
            "(quantize_weight(w, contract_axes=...))."
        )


def _refuse_zero_point(w: QuantizedWeight, product: str) -> None:
    if w.zero_point is not None:
        raise ConfigError(
            f"{product}: an asymmetric weight (a zero point) with quantized activations has no integer product "
            "(Praxis refuses it too): quantize the weight symmetric, or leave the activations in float."
        )


def quantized_matmul(x: Float[Array, "*batch input"], w: QuantizedWeight) -> Float[Array, "*batch output"]:
    """x @ W for W = w's values * scale - zero_point, as one 2-D product over the flattened
    leading dimensions (module doc)."""
    _require(w, 2, (-2,), "linears.dense", "[input, output]")
    rows = x.reshape(-1, x.shape[-1])
    q = w.int_values()
    act = w.activations
    if act is None:
        y = jnp.dot(rows, q.astype(x.dtype), preferred_element_type=jnp.float32) * w.scale
        if w.zero_point is not None:
            y = y - jnp.sum(rows.astype(jnp.float32), axis=-1, keepdims=True) * w.zero_point
    else:
        _refuse_zero_point(w, "linears.dense")
        xq, x_scale, _ = quantize(rows, act.bits, activation_axes(act.per_token))
        y = int_matmul(xq, q)
        # Praxis' order: a per-token scale multiplies the product, a per-tensor one the weight's scale.
        y = (y * x_scale) * w.scale if act.per_token else y * (w.scale * x_scale)
    return y.astype(x.dtype).reshape(*x.shape[:-1], q.shape[-1])


def quantized_lookup(table: QuantizedWeight, ids: Int[Array, "*batch"]) -> Float[Array, "*batch embed"]:
    """The rows of a [vocab, embed] table quantized per row (one scale per token id: the tied
    softmax's per-output-channel scale), float32: rows of integers times their rows' scales
    (Praxis' quantized Embedding and SharedEmbeddingSoftmax lookups). A 4-bit table is packed
    along embed, so only the gathered rows are unpacked."""
    _require(table, 2, (-1,), "an embedding lookup", "[vocab, embed]")
    rows = jnp.take(table.values, ids, axis=0)
    if table.packed_axis is not None:
        rows = unpack_int4(rows, -1)
    embs = rows * jnp.take(table.scale, ids, axis=0)
    return embs if table.zero_point is None else embs - jnp.take(table.zero_point, ids, axis=0)


def quantized_conv(
    x: Float[Array, "batch height width in_channels"], w: QuantizedWeight, **conv: Any
) -> Float[Array, "batch out_height out_width out_channels"]:
    """`jax.lax.conv_general_dilated(x, W, **conv)` (NHWC, HWIO) for W quantized per output
    channel, symmetric (Praxis' Conv2D supports no other): the integers convolved, the output
    channels scaled after. Quantized activations are per tensor (Praxis'), convolved in int8
    accumulating in int32 (Praxis convolves them in int8 and wraps around; not copied)."""
    _require(w, 4, (-4, -3, -2), "Conv2D", "[kernel_h, kernel_w, in, out]")
    if w.zero_point is not None:
        raise ConfigError(
            "Conv2D: an asymmetric (zero point) quantized kernel is not supported (Praxis' quantized conv "
            "refuses it too); quantize the kernel symmetric."
        )
    q, scale, act = w.int_values(), w.scale.reshape(-1), w.activations
    if act is None:
        y = jax.lax.conv_general_dilated(x, q.astype(x.dtype), preferred_element_type=jnp.float32, **conv)
        return (y * scale).astype(x.dtype)
    if act.per_token:
        raise ConfigError(
            "Conv2D: activations quantized per token have no meaning for a convolution (Praxis quantizes a conv's "
            "input per tensor); set the activation quantization's per_token to False."
        )
    xq, x_scale, _ = quantize(x, act.bits, None)
    y = jax.lax.conv_general_dilated(xq, q, preferred_element_type=jnp.int32, **conv)
    return (y * (x_scale.reshape(()) * scale)).astype(x.dtype)
