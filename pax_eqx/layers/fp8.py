"""FP8 matmuls with delayed scaling (Transformer Engine's recipe; Praxis' `USE_FP8` injection).

    y = fp8_dense(x, w, scales)        # x: [..., in] (bf16), w: [in, out], y: [..., out]

Both operands of the forward matmul are rounded to float8_e4m3fn (3 mantissa bits, range
+-448) and the gradient of y to float8_e5m2 (2 mantissa bits, range +-57344: gradients need
range more than precision). An fp8 number has so little range that each tensor is divided by
a per-tensor *scale* before the cast, and the GEMM's float32 result multiplied by the product of
its operands' scales:

    y = (cast(clip(x / s_x), e4m3) @ cast(clip(w / s_w), e4m3)) * (s_x * s_w)

The GEMM is a `dot_general` of the fp8 arrays themselves (accumulating in float32, writing the
activation dtype), which XLA:GPU runs as a cuBLASLt FP8 GEMM on Hopper and later; the backward
does the same for dx = g w^T (e5m2 x e4m3) and dw = x^T g, from the forward's fp8 operands,
which are also all it keeps (half the bytes of bf16 residuals). Measured on an H200: 1.49x bf16
for one projection's forward and backward, 1.39x for a 5B GPT's step (docs/performance.md).
Programs with fp8 GEMMs compile at a lower GEMM autotuning level (`compiler_options`).
A quantize-dequantize pattern around a bf16 dot, which XLA is meant to rewrite into an FP8
GEMM, was measured first and was not rewritten (jax 0.11.2, H200: a bf16 GEMM, 2% slower than
bf16). Elsewhere (CPU) XLA widens the fp8 operands, so the same program computes the same
rounded values, which is what the tests check against numpy.

*Delayed* scaling: a tensor's scale is not measured on the tensor itself (that would be a
reduction over it before every cast, another pass over the activations). Each matmul keeps, per
operand, the last `history` absolute maxima (amax) of that operand; the scale used at a step
is `max(history) / fp8_max` as of the previous step, and the step appends its own amax. Until
the first amax is recorded the scale is 1.

Where the state lives: the output gradient's amax is only known in the backward pass, so the
state cannot be a forward-threaded variable. As in Flax's `OVERWRITE_WITH_GRADIENT` collection,
the scales and histories are parameters (`Fp8Scales`) whose *gradient is defined to be their
new value* (the custom VJP below); the Task takes them out of the gradients before the optimizer
and writes them back as they come (`is_fp8_scales`, `tasks.task`). So nothing else changes:
they are checkpointed, sharded (replicated) and stacked per layer in a scanned stack like any
weight, and clipping, weight decay and the gradient norm never see them. With gradient
accumulation the microbatches' new states are averaged (a mean of amaxes, slightly below the
max: harmless for a scale).

The very first step runs with scale 1, so gradients smaller than e5m2's smallest subnormal
(1.5e-5) flush to zero in that step; from the second step the scales fit the tensors (as in
Transformer Engine).
"""

from __future__ import annotations

import os
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

E4M3 = jnp.float8_e4m3fn
"""Forward operands: more precision (3 mantissa bits), max 448."""
E5M2 = jnp.float8_e5m2
"""Gradients: more range (5 exponent bits), max 57344."""

DEFAULT_HISTORY = 16
"""Amax history length (Praxis' and Transformer Engine's default for GPT-style training)."""

_INPUT, _KERNEL, _GRAD = 0, 1, 2


class Fp8Scales(eqx.Module):
    """The delayed-scaling state of one matmul y = x @ w: rows [input x, kernel w, gradient of y].

    scale: the divisor each operand is cast with at the next step.
    amax_history: each operand's absolute maxima of the last `history` steps, newest first.
    """

    scale: Float[Array, "3"]
    amax_history: Float[Array, "3 history"]

    def __init__(self, history: int = DEFAULT_HISTORY):
        self.scale = jnp.ones((3,), jnp.float32)
        self.amax_history = jnp.zeros((3, history), jnp.float32)

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {"scale": (None,), "amax_history": (None, None)}


def is_fp8_scales(x: Any) -> bool:
    return isinstance(x, Fp8Scales)


def overwritten_mask(params: Any) -> Any:
    """A pytree like `params`: True on the leaves of every Fp8Scales (which the train step
    overwrites with their gradient instead of optimising), False elsewhere; None when the
    model has no fp8 matmul."""
    mask = jax.tree.map(
        lambda n: jax.tree.map(lambda _: True, n) if is_fp8_scales(n) else False, params, is_leaf=is_fp8_scales
    )
    return mask if any(jax.tree.leaves(mask)) else None


AUTOTUNE_LEVEL = 2
"""XLA:GPU's GEMM autotuning level for a program with fp8 GEMMs: time every candidate algorithm
but skip checking each one's result against a reference (the default, level 4). Measured on an
H200 (jax 0.11.2, docs/performance.md): one [8192, 4096] x [4096, 8192] fp8 GEMM compiles in
25.8 s at level 4 and 0.8 s at level 2, which picks an algorithm as fast (791 TF/s; level 0,
no timing, picks one at 213 TF/s); a 5B GPT step with 12 fp8 GEMMs never finished compiling
within 240 s at level 4."""


def compiler_options(params: Any) -> dict[str, int]:
    """The XLA options a program over `params` compiles with (`jax.jit(compiler_options=)`):
    `AUTOTUNE_LEVEL` when params hold an fp8 matmul's scales, unless XLA_FLAGS sets the level
    itself (the user's choice wins); nothing otherwise. Other backends ignore GPU options."""
    has_fp8 = any(is_fp8_scales(n) for n in jax.tree.leaves(params, is_leaf=is_fp8_scales))
    if not has_fp8 or "xla_gpu_autotune_level" in os.environ.get("XLA_FLAGS", ""):
        return {}
    return {"xla_gpu_autotune_level": AUTOTUNE_LEVEL}


def _fp8_max(dtype: Any) -> float:
    return float(jnp.finfo(dtype).max)


def quantize_dequantize(t: Array, dtype: Any, scale: Array) -> Array:
    """t rounded to the fp8 `dtype` at `scale` (t / scale, clipped to the format's range), back in
    t's dtype: the values an fp8 matmul multiplies."""
    return quantize(t, dtype, scale).astype(t.dtype) * scale.astype(t.dtype)


def _next_state(t: Array, dtype: Any, scale: Array, history: Array) -> tuple[Array, Array]:
    """(new scale, new history) after recording t's amax: the scale for the next step."""
    amax = jnp.max(jnp.abs(t)).astype(jnp.float32)
    history = jnp.roll(history, 1).at[0].set(amax)
    peak = jnp.max(history)
    return jnp.where(peak > 0, peak / _fp8_max(dtype), scale), history


def quantize(t: Array, dtype: Any, scale: Array) -> Array:
    """t / scale clipped to the format's range, cast to the fp8 `dtype`."""
    limit = _fp8_max(dtype)
    return jnp.clip(t / scale.astype(t.dtype), -limit, limit).astype(dtype)


def _scaled_gemm(a: Array, b: Array, scale: Array, dtype: Any) -> Array:
    """a [m, k] times b [n, k] transposed (both contract their last dimension: the one layout
    cuBLASLt's FP8 GEMMs take, so XLA has nothing to rearrange), times `scale` (the product of
    the operands' scales), in `dtype`: [m, n]. The GEMM accumulates in float32 and writes `dtype`
    itself, with the scale folded in by XLA (cuBLASLt's alpha): a float32 result would be twice
    the bytes to write, and what a remat policy that saves matmul outputs keeps per layer."""
    out = jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=dtype)
    return out * scale.astype(dtype)


def _forward(x: Array, w: Array, scale: Array) -> tuple[Array, Array, Array]:
    """(y, x in e4m3, w in e4m3) at the stored scales."""
    xq, wq = quantize(x, E4M3, scale[_INPUT]), quantize(w, E4M3, scale[_KERNEL])
    return _scaled_gemm(xq, wq.T, scale[_INPUT] * scale[_KERNEL], x.dtype), xq, wq


@jax.custom_vjp
def _fp8_matmul(x: Array, w: Array, scale: Array, history: Array) -> Array:
    """[m, k] x [k, n] with both operands in e4m3 at the stored scales; see `_fp8_matmul_bwd`.
    Without a gradient (eval, decode) no amax is measured: the state only moves in training."""
    return _forward(x, w, scale)[0]


def _fp8_matmul_fwd(x, w, scale, history):
    y, xq, wq = _forward(x, w, scale)
    s_x, h_x = _next_state(x, E4M3, scale[_INPUT], history[_INPUT])
    s_w, h_w = _next_state(w, E4M3, scale[_KERNEL], history[_KERNEL])
    # The fp8 operands are what the backward needs: half the bytes of bf16 residuals.
    return y, (xq, wq, scale, history, jnp.stack([s_x, s_w]), jnp.stack([h_x, h_w]))


def _fp8_matmul_bwd(residuals, g):
    """dx = g w^T and dw = x^T g, with g in e5m2 (its own scale) and x, w the forward's e4m3
    operands; the straight-through estimator (rounding treated as identity). The "gradient" of
    (scale, history) is their next value: the forward's amaxes of x and w, the backward's of g."""
    xq, wq, scale, history, s_xw, h_xw = residuals
    gq = quantize(g, E5M2, scale[_GRAD])
    dx = _scaled_gemm(gq, wq, scale[_GRAD] * scale[_KERNEL], g.dtype)  # [m, n] x [k, n]
    dw = _scaled_gemm(xq.T, gq.T, scale[_INPUT] * scale[_GRAD], g.dtype)  # [k, m] x [n, m]
    s_g, h_g = _next_state(g, E5M2, scale[_GRAD], history[_GRAD])
    return dx, dw, jnp.concatenate([s_xw, s_g[None]]), jnp.concatenate([h_xw, h_g[None]])


_fp8_matmul.defvjp(_fp8_matmul_fwd, _fp8_matmul_bwd)


def fp8_dense(
    x: Float[Array, "*batch input_dims"], w: Float[Array, "input_dims output_dims"], scales: Fp8Scales
) -> Float[Array, "*batch output_dims"]:
    """x @ w in x's dtype, with x and w in e4m3 and the gradient of the result in e5m2; one 2-D
    matmul over the flattened leading dimensions (as `linears.dense`)."""
    y = _fp8_matmul(x.reshape(-1, x.shape[-1]), w.astype(x.dtype), scales.scale, scales.amax_history)
    return y.reshape(*x.shape[:-1], w.shape[-1])
