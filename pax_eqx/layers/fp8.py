"""FP8 matmuls with delayed scaling (Transformer Engine's recipe; Praxis' `USE_FP8` injection).

    y = fp8_dense(x, w, scales)        # x: [..., in] (bf16), w: [in, out], y: [..., out]

Both operands of the forward matmul are rounded to float8_e4m3fn (3 mantissa bits, range
+-448) and the gradient of y to float8_e5m2 (2 mantissa bits, range +-57344: gradients need
range more than precision). An fp8 number has so little range that each tensor is divided by
a per-tensor *scale* before the cast and multiplied by it after:

    qdq(t) = cast(clip(t / s, -max, max), fp8) * s

Written this way (quantize, then dequantize around a plain dot) XLA:GPU recognises the pattern
and runs one cuBLASLt FP8 GEMM with the scales as its alpha on Hopper and later; elsewhere
(CPU, older GPUs) the same program computes the same rounded values in the activation dtype,
which is what the tests check against numpy.

*Delayed* scaling: a tensor's scale is not measured on the tensor itself (that would be a
reduction over it before every cast, another pass over the activations). Each matmul keeps, per
operand, the last `history` absolute maxima (amax) of that operand; the scale used at a step
is `max(history) / fp8_max` as of the previous step, and the step appends its own amax. Until
the first amax is recorded the scale is 1.

Where the state lives: the output gradient's amax is only known in the backward pass, so the
state cannot be a forward-threaded variable. As in Flax's `OVERWRITE_WITH_GRADIENT` collection,
the scales and histories are parameters (`Fp8Scales`) whose *gradient is defined to be their
new value* (custom VJPs below); the Task takes them out of the gradients before the optimizer
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


def _fp8_max(dtype: Any) -> float:
    return float(jnp.finfo(dtype).max)


def quantize_dequantize(t: Array, dtype: Any, scale: Array) -> Array:
    """t rounded to the fp8 `dtype` at `scale` (t / scale, clipped to the format's range), back in
    t's dtype. The dequantizing multiply stays next to the cast so XLA can fold both into a GEMM."""
    s = scale.astype(t.dtype)
    limit = _fp8_max(dtype)
    q = jnp.clip(t / s, -limit, limit).astype(dtype)
    return q.astype(t.dtype) * s


def _next_state(t: Array, dtype: Any, scale: Array, history: Array) -> tuple[Array, Array]:
    """(new scale, new history) after recording t's amax: the scale for the next step."""
    amax = jnp.max(jnp.abs(t)).astype(jnp.float32)
    history = jnp.roll(history, 1).at[0].set(amax)
    peak = jnp.max(history)
    return jnp.where(peak > 0, peak / _fp8_max(dtype), scale), history


@jax.custom_vjp
def _in_qdq(t: Array, scale: Array, history: Array) -> Array:
    """A forward operand in e4m3; its gradient passes straight through (the rounding is treated
    as identity), and (scale, history)'s "gradient" is their next value."""
    return quantize_dequantize(t, E4M3, scale)


def _in_qdq_fwd(t, scale, history):
    return quantize_dequantize(t, E4M3, scale), _next_state(t, E4M3, scale, history)


def _in_qdq_bwd(new_state, g):
    return (g, *new_state)


_in_qdq.defvjp(_in_qdq_fwd, _in_qdq_bwd)


@jax.custom_vjp
def _out_qdq(y: Array, scale: Array, history: Array) -> Array:
    """Identity forward; the backward rounds the incoming gradient of y to e5m2 and gives
    (scale, history) their next value."""
    return y


def _out_qdq_fwd(y, scale, history):
    return y, (scale, history)


def _out_qdq_bwd(state, g):
    scale, history = state
    return (quantize_dequantize(g, E5M2, scale), *_next_state(g, E5M2, scale, history))


_out_qdq.defvjp(_out_qdq_fwd, _out_qdq_bwd)


def fp8_dense(
    x: Float[Array, "*batch input_dims"], w: Float[Array, "input_dims output_dims"], scales: Fp8Scales
) -> Float[Array, "*batch output_dims"]:
    """x @ w in x's dtype, with x and w in e4m3 and the gradient of the result in e5m2; one 2-D
    matmul over the flattened leading dimensions (as `linears.dense`)."""
    s, h = scales.scale, scales.amax_history
    x2 = _in_qdq(x.reshape(-1, x.shape[-1]), s[_INPUT], h[_INPUT])
    w2 = _in_qdq(w.astype(x.dtype), s[_KERNEL], h[_KERNEL])
    y = _out_qdq(jnp.dot(x2, w2), s[_GRAD], h[_GRAD])
    return y.reshape(*x.shape[:-1], w.shape[-1])
