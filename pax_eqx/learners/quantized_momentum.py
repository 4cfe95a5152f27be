"""Adafactor's momentum stored in int8 (int16, bfloat16): Praxis' `ShardedAdafactor` default.

Praxis' ShardedAdafactor keeps beta1's momentum as int8 unless told otherwise
(`quantized_dtype="int8"`): a quarter of float32's memory for the one optimizer slot shaped like
the parameters (the second moments are factored). The arithmetic stays float32; only what is
*kept between steps* is quantized:

    m = values * scales[None]                               dequantized, float32
    m = beta1 * m + (1 - beta1) * update                    the new momentum: this step's output
    scales = max(|m|, axis=0) / 127                         one scale per slice along axis 0
    values = round(m / scales[None])  (a zero scale divides by 1)       int8, -127..127

The scale is taken over the parameter's *first* axis, whatever the parameter is (Praxis'
choice): a [D, F] kernel has F scales (one per column), an [N, D, H] one [D, H] scales, a vector
one scale, and a 0-D parameter keeps a float32 momentum (there is no axis to take a maximum
over). Rounding is to the nearest integer, ties to even (`jnp.round`), so a value re-quantized
comes back unchanged. int16 is the same with 32767; bfloat16 rounds the float32 momentum to
bfloat16, with no scales.

Why its own transformation: `optax.ema` keeps its state in one dtype (optax.adafactor's
`dtype_momentum` is a cast, not a scaled integer), and Praxis' numbers are what Pax's
experiments trained with (after 8 steps at lr 0.1 a float32 momentum leaves the parameters
1.9e-3 from Praxis' int8 run, this one 2.4e-7: tests/praxis/test_praxis_optimizers.py; its
stored values: test_praxis_quantized_momentum.py). The state (`QuantizedMomentumState`) is two
trees shaped like the parameters' tree: `values` (each the parameter's shape, int8/int16/
bfloat16, or float32 for a 0-D parameter) and `scales` (float32, the parameter's shape less its
first dimension, or a (1,) placeholder where there are none), so `optax.tree_map_params` and
`sharding.rules.opt_state_shardings` see per-parameter leaves: the values take the parameter's
sharding, the scales its spec less the first dimension (Praxis' `remove_dim(0, ...)`).

One difference from Praxis, as for the float32 momentum (`optimizer_configs.AdafactorConfig`):
Praxis' momentum averages lr * update, ours the update, the learning rate multiplying later.
Under a constant rate the int8 values are the same (the scale is lr x ours; a ratio rounds the
same unless the rate's float32 rounding moves it across a half) and the updates equal Praxis'
to float32 rounding; bfloat16 rounds lr * m and m to different neighbours unless lr is a power
of two.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax

MomentumDtype = Literal["float32", "bfloat16", "int8", "int16"]

_BUCKETS = {"int8": 127.0, "int16": 32767.0}
"""The largest magnitude stored: -128 (-32768) is never used, so the range is symmetric."""


class QuantizedMomentumState(NamedTuple):
    """values: per parameter, the momentum in its stored dtype (the parameter's shape).
    scales: per parameter, float32 [*shape[1:]] for int8/int16, else a (1,) placeholder."""

    values: Any
    scales: Any


def quantize(x: jax.Array, dtype: Literal["int8", "int16"]) -> tuple[jax.Array, jax.Array]:
    """x [N, *rest] float -> (values [N, *rest] int, scales [*rest] float): the symmetric
    per-slice quantization above. x must have at least one dimension."""
    if x.ndim < 1:
        raise ValueError(f"quantize needs an array of at least one dimension, got shape {x.shape}.")
    scales = jnp.max(jnp.abs(x), axis=0) / jnp.asarray(_BUCKETS[dtype], x.dtype)
    divisor = jnp.where(scales > 0, scales, jnp.ones_like(scales))[None]
    return jnp.round(x / divisor).astype(dtype), scales


def dequantize(values: jax.Array, scales: jax.Array) -> jax.Array:
    """(values [N, *rest] int, scales [*rest] float) -> [N, *rest] in the scales' dtype."""
    return values.astype(scales.dtype) * scales[None]


def _is_quantized(dtype: MomentumDtype, param: jax.Array) -> bool:
    return dtype in _BUCKETS and param.ndim >= 1


def quantized_ema(decay: float, dtype: MomentumDtype) -> optax.GradientTransformation:
    """beta1's momentum, an exponential moving average of the updates without bias correction
    (optax.ema(decay, debias=False)'s arithmetic, in float32), kept between steps in `dtype`
    as Praxis keeps it (see the module docstring). Returns the float32 average, not the
    stored one, in the incoming updates' dtype."""
    if dtype not in ("float32", "bfloat16", *_BUCKETS):
        raise ValueError(f"momentum dtype {dtype!r} is not one of float32, bfloat16, int8, int16.")

    def init_one(p: jax.Array) -> tuple[jax.Array, jax.Array]:
        placeholder = jnp.zeros((1,), jnp.float32)
        if _is_quantized(dtype, p):
            return jnp.zeros(p.shape, dtype), jnp.zeros(p.shape[1:], jnp.float32)
        stored = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
        return jnp.zeros(p.shape, stored), placeholder

    def update_one(u: jax.Array, values: jax.Array, scales: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        quantized = _is_quantized(dtype, u)
        m = dequantize(values, scales) if quantized else values.astype(jnp.float32)
        m = decay * m + (1.0 - decay) * u.astype(jnp.float32)
        if quantized:
            new_values, new_scales = quantize(m, dtype)
        else:
            new_values, new_scales = m.astype(values.dtype), scales
        return m.astype(u.dtype), new_values, new_scales

    def init_fn(params: Any) -> QuantizedMomentumState:
        leaves, treedef = jax.tree.flatten(params)
        pairs = [init_one(p) for p in leaves]
        return QuantizedMomentumState(
            values=treedef.unflatten([v for v, _ in pairs]), scales=treedef.unflatten([s for _, s in pairs])
        )

    def update_fn(updates: Any, state: QuantizedMomentumState, params: Any = None) -> tuple[Any, Any]:
        del params
        leaves, treedef = jax.tree.flatten(updates)
        columns = [treedef.flatten_up_to(t) for t in (state.values, state.scales)]
        out = [update_one(u, v, s) for u, v, s in zip(leaves, *columns, strict=True)]
        new_state = QuantizedMomentumState(
            values=treedef.unflatten([o[1] for o in out]), scales=treedef.unflatten([o[2] for o in out])
        )
        return treedef.unflatten([o[0] for o in out]), new_state

    return optax.GradientTransformation(init_fn, update_fn)
