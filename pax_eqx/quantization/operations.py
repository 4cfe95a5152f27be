"""Praxis' quantization numerics (praxis/layers/quantization/operations.py), as functions of arrays.

A tensor is quantized over its *contraction axes*, the axes its matmul sums over (a weight's input
side, an activation's features): every slice along the other axes (an output channel, a token)
gets a scale of its own, so one channel's large values do not cost the others their resolution.
With lo, hi = -2^(b-1), 2^(b-1) - 1 (b bits; Praxis' get_min_max):

    symmetric    scale = max|t| / hi                    q = clip(round(t / scale), lo, hi)
                 t ~ q * scale
    asymmetric   scale = (max t - min t) / (hi - lo)    z = lo - min t / scale
                 q = clip(round(t / scale + z), lo, hi)
                 t ~ q * scale - zero_point,  zero_point = z * scale   (Praxis stores z * scale)

Praxis' choices, kept to the bit (tests/praxis/quantization compares the integers exactly):
- the arithmetic is float32 (Praxis' calculation_dtype), in the order written above, and every
  division is a division (`exact_divide`), not XLA's multiplication by a reciprocal;
- round half to even (`jnp.round`); a symmetric grid never reaches lo (-128 is unused);
- a scale of 0 (an all-zero channel) becomes 1 (Praxis' PTQ and fake quantization, add_scale_eps=False);
- `clipping` < 1 shrinks the bound before the scale (Praxis' clipping_coeff); the rest saturates.

`fake_quant` is quantize-then-dequantize with Praxis' straight-through gradient: the rounding
passes its input's gradient through unchanged (`pass_through`), while the clip and the scale
(a max over the channel) keep their own gradients, so the elements at a channel's bound also
carry the scale's. That is what Praxis trains with (QuantizationType.FQ), not the textbook
"identity inside the range".

int4 values are packed two a byte along one axis, the first of each pair in the low nibble
(Praxis' pack_4bit into an int8 container): `pack_int4` / `unpack_int4`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int8, Int32

from pax_eqx.config import ConfigError

Axes = Sequence[int] | None
"""Contraction axes; None: every axis (one scale for the whole tensor)."""


def int_bounds(bits: int) -> tuple[int, int]:
    """(lo, hi) = (-2^(bits-1), 2^(bits-1) - 1): a signed `bits`-bit integer's range."""
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def exact_divide(a: Float[Array, "..."], b: Float[Array, "..."]) -> Float[Array, "..."]:
    """a / b correctly rounded. XLA rewrites a division by a broadcast (a per-channel scale, a
    constant) into a multiplication by its reciprocal, 1 ulp off for most divisors: enough to move
    an integer across a .5 boundary, or a scale off Praxis'. So b is broadcast to a's shape behind
    an optimization barrier, which XLA cannot see through (one a-sized temporary)."""
    return a / jax.lax.optimization_barrier(jnp.broadcast_to(b, a.shape).astype(a.dtype))


def _axes(axes: Axes) -> tuple[int, ...] | None:
    return None if axes is None else tuple(axes)


def quantization_scale(
    t: Float[Array, "..."], bits: int, axes: Axes, symmetric: bool, clipping: float = 1.0
) -> tuple[Float[Array, "..."], Float[Array, "..."] | None]:
    """(scale, min t) per slice, both with t's rank and size 1 on `axes` (min t: None when
    symmetric). float32 in, float32 out (see the module doc for the formula)."""
    scale, t_min = _range_over_levels(t, bits, axes, symmetric, clipping)
    return jnp.where(scale == 0.0, 1.0, scale), t_min


def _range_over_levels(
    t: Float[Array, "..."], bits: int, axes: Axes, symmetric: bool, clipping: float
) -> tuple[Float[Array, "..."], Float[Array, "..."] | None]:
    """(the clipped range / the integer levels it spans, min t or None when symmetric) per slice:
    the scale before Praxis' zero guard or AQT's eps, which is all the two quantizers differ by."""
    lo, hi = int_bounds(bits)
    axes = _axes(axes)
    if symmetric:
        bound, t_min, levels = jnp.max(jnp.abs(t), axis=axes, keepdims=True), None, hi
    else:
        t_min = jnp.min(t, axis=axes, keepdims=True)
        bound, levels = jnp.max(t, axis=axes, keepdims=True) - t_min, hi - lo
    if clipping < 1.0:
        bound = bound * clipping
    return exact_divide(bound, jnp.asarray(levels, jnp.float32)), t_min


def _on_grid(
    t: Float[Array, "..."], scale: Float[Array, "..."], t_min: Float[Array, "..."] | None, lo: int
) -> tuple[Float[Array, "..."], Float[Array, "..."] | None]:
    """(t in units of the scale, shifted by the zero point z when asymmetric; z or None)."""
    if t_min is None:
        return exact_divide(t, scale), None
    z = lo - exact_divide(t_min, scale)
    return exact_divide(t, scale) + z, z


def quantize(
    t: Float[Array, "..."], bits: int, axes: Axes, symmetric: bool = True, clipping: float = 1.0
) -> tuple[Int8[Array, "..."], Float[Array, "..."], Float[Array, "..."] | None]:
    """(q int8, scale, zero_point) with t ~ q * scale - zero_point (zero_point None when
    symmetric); scale and zero_point have t's rank, size 1 on `axes`. Praxis' reduce_precision
    without a gradient (PTQ, the materialized weights, the activations of an integer product).
    One compiled program per shape and setting (inlined when called under jit)."""
    return _quantize(t, bits, _axes(axes), symmetric, clipping)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _quantize(t, bits, axes, symmetric, clipping):
    t = t.astype(jnp.float32)
    lo, hi = int_bounds(bits)
    scale, t_min = quantization_scale(t, bits, axes, symmetric, clipping)
    u, z = _on_grid(t, scale, t_min, lo)
    q = jnp.clip(jnp.round(u), lo, hi).astype(jnp.int8)
    return q, scale, None if z is None else jnp.multiply(scale, z)


def pass_through(x: Float[Array, "..."], fn: Callable[[Array], Array]) -> Float[Array, "..."]:
    """fn(x) in the forward, the identity's gradient in the backward (a straight-through
    estimator). x - x is exactly 0 in float (Sterbenz), so the forward is fn(x) to the bit."""
    return x - jax.lax.stop_gradient(x) + jax.lax.stop_gradient(fn(x))


def fake_quant(
    t: Float[Array, "..."], bits: int, axes: Axes, symmetric: bool = True, clipping: float = 1.0
) -> Float[Array, "..."]:
    """t quantized and dequantized, in t's dtype, differentiable with Praxis' straight-through
    gradient (module doc): Praxis' fakequant_einsum for a weight (axes: its input side) and
    fakequant_activation for an activation (axes: (-1,) per token, None per tensor)."""
    return _fake_quant(t, bits, _axes(axes), symmetric, clipping)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _fake_quant(t, bits, axes, symmetric, clipping):
    dtype = t.dtype
    t = t.astype(jnp.float32)
    lo, hi = int_bounds(bits)
    scale, t_min = quantization_scale(t, bits, axes, symmetric, clipping)
    u, z = _on_grid(t, scale, t_min, lo)
    q = jnp.clip(pass_through(u, jnp.round), lo, hi)
    out = jnp.multiply(q, scale)
    if z is not None:
        out = jnp.subtract(out, jnp.multiply(scale, z))
    return out.astype(dtype)


def aqt_fake_quant(
    t: Float[Array, "..."], bits: int, axes: Axes, symmetric: bool = True, clipping: float = 1.0
) -> Float[Array, "..."]:
    """`fake_quant` with Praxis' AQT quantizer (QuantizationType.AQT's TensorQuantizer): the scale
    is bound / levels + float32's eps (its add_scale_eps, on by default: no 1 for an all-zero
    channel, and no NaN gradient near zero), and rounding is floor(x + 0.5) (ties up, not to
    even), straight through as fake_quant's."""
    return _aqt_fake_quant(t, bits, _axes(axes), symmetric, clipping)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _aqt_fake_quant(t, bits, axes, symmetric, clipping):
    dtype = t.dtype
    t = t.astype(jnp.float32)
    lo, hi = int_bounds(bits)
    scale, t_min = _range_over_levels(t, bits, axes, symmetric, clipping)
    scale = scale + jnp.finfo(jnp.float32).eps
    u, z = _on_grid(t, scale, t_min, lo)
    q = jnp.clip(pass_through(u + 0.5, jnp.floor), lo, hi)
    out = jnp.multiply(q, scale)
    if z is not None:
        out = jnp.subtract(out, jnp.multiply(scale, z))
    return out.astype(dtype)


def activation_axes(per_token: bool) -> tuple[int, ...] | None:
    """An activation's contraction axes: its features (one scale per token), or all of it."""
    return (-1,) if per_token else None


@functools.partial(jax.jit, static_argnums=1)
def pack_int4(q: Int8[Array, "..."], axis: int) -> Int8[Array, "..."]:
    """Values in [-8, 7] packed two a byte along `axis` (its size halves): element 2i in the low
    nibble, 2i + 1 in the high one. Praxis' pack_4bit into an int8 container, to the bit."""
    axis = axis % q.ndim
    n = q.shape[axis]
    if n % 2:
        raise ConfigError(
            f"4-bit values pack two a byte along axis {axis} of a weight of shape {q.shape}, whose size there "
            f"({n}) is odd; quantize it to 8 bits, or give the weight an even size on its first input axis."
        )
    pairs = q.reshape(*q.shape[:axis], n // 2, 2, *q.shape[axis + 1 :]).astype(jnp.uint8)
    low, high = jnp.take(pairs, 0, axis=axis + 1), jnp.take(pairs, 1, axis=axis + 1)
    return jax.lax.bitcast_convert_type((low & 0x0F) | (high << 4), jnp.int8)


@functools.partial(jax.jit, static_argnums=1)
def unpack_int4(packed: Int8[Array, "..."], axis: int) -> Int8[Array, "..."]:
    """`pack_int4`'s inverse: int8 values in [-8, 7], `axis` twice as long (sign-extended by
    arithmetic shifts)."""
    axis = axis % packed.ndim
    low = jnp.right_shift(jnp.left_shift(packed, 4), 4)
    high = jnp.right_shift(packed, 4)
    both = jnp.stack([low, high], axis=axis + 1)
    return both.reshape(*packed.shape[:axis], 2 * packed.shape[axis], *packed.shape[axis + 1 :])


def int_matmul(x: Int8[Array, "rows contract"], w: Int8[Array, "contract out"]) -> Int32[Array, "rows out"]:
    """x @ w of int8 operands accumulated in int32 (Praxis' dot_general_int): exact for any
    contraction up to 2^31 / 128^2 = 131072 terms."""
    return jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)
