"""Adafactor's factored second moments over a parameter's *last two* dimensions (Praxis' form).

`optax.scale_by_factored_rms` factors a parameter's second moment over its two largest
dimensions, and only when both are >= `min_dim_size_to_factor` (128 by default). Praxis'
`ShardedAdafactor` (with its default `sort_factored_second_moment_dims=False`) factors every
parameter of two or more dimensions over its last two, whatever their size: a [D, N, H] attention
kernel over (N, H), a [4, 6] matrix too. `scale_by_last_dims_factored_rms` is optax's
transformation with that choice of dimensions; its arithmetic, its state (`optax.FactoredState`:
row and column statistics shaped like the parameter less one dimension, (1,) placeholders) and
its decay schedule argument are optax's.

    v_row = decay * v_row + (1 - decay) * mean(g^2 + eps, axis=-1)      Praxis' vr
    v_col = decay * v_col + (1 - decay) * mean(g^2 + eps, axis=-2)      Praxis' vc
    update = g / sqrt(v_row / mean(v_row, axis=-1)) / sqrt(v_col)      (expanded back)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax


def decay_rate_adam(step: Any, beta2: Any) -> jax.Array:
    """Adam's second-moment decay with its bias correction folded in, at 0-based `step`:
    beta2 (1 - beta2^step) / (1 - beta2^(step + 1)) (Praxis' adafactor_decay_rate_adam; 0 at step 0)."""
    t = jnp.asarray(step, jnp.float32)
    beta2 = jnp.asarray(beta2, jnp.float32)
    return beta2 * (1.0 - beta2**t) / (1.0 - beta2 ** (t + 1.0))


def decay_rate_pow(step: Any, exponent: Any) -> jax.Array:
    """1 - (step + 1)^-exponent at 0-based `step` (optax's and Praxis' pow decay)."""
    return 1.0 - jnp.asarray(step + 1, jnp.float32) ** (-exponent)


def scale_by_last_dims_factored_rms(
    decay_rate: float = 0.8,
    epsilon: float = 1e-30,
    decay_rate_fn: Callable[[Any, Any], jax.Array] = decay_rate_pow,
) -> optax.GradientTransformation:
    """optax.scale_by_factored_rms factoring every >= 2-D parameter over its last two dimensions
    (see the module docstring); 0-D and 1-D parameters keep a full second moment.
    decay_rate_fn(step, decay_rate): the decay at 0-based `step` (`decay_rate_pow`, `decay_rate_adam`)."""

    def init_one(p: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        placeholder = jnp.zeros((1,), p.dtype)
        if p.ndim >= 2:
            return jnp.zeros(p.shape[:-1], p.dtype), jnp.zeros(p.shape[:-2] + p.shape[-1:], p.dtype), placeholder
        return placeholder, placeholder, jnp.zeros_like(p)

    def init_fn(params: Any) -> optax.FactoredState:
        leaves, treedef = jax.tree.flatten(params)
        return _to_state(jnp.zeros([], jnp.int32), treedef, [init_one(p) for p in leaves])

    def update_fn(grads: Any, state: optax.FactoredState, params: Any = None) -> tuple[Any, optax.FactoredState]:
        if params is None:
            raise ValueError("scale_by_last_dims_factored_rms needs the parameters: pass params to update.")
        decay = decay_rate_fn(state.count, decay_rate)

        def update_one(g: jax.Array, v_row: jax.Array, v_col: jax.Array, v: jax.Array, p: jax.Array) -> tuple:
            g_sq = jnp.square(g) + epsilon
            placeholder = jnp.zeros((1,), p.dtype)
            if p.ndim >= 2:
                v_row = (decay * v_row + (1.0 - decay) * jnp.mean(g_sq, axis=-1)).astype(p.dtype)
                v_col = (decay * v_col + (1.0 - decay) * jnp.mean(g_sq, axis=-2)).astype(p.dtype)
                row_factor = (v_row / jnp.mean(v_row, axis=-1, keepdims=True)) ** -0.5
                update = g * row_factor[..., None] * jnp.expand_dims(v_col**-0.5, -2)
                return update, (v_row, v_col, placeholder)
            v = (decay * v + (1.0 - decay) * g_sq).astype(p.dtype)
            return g * v**-0.5, (placeholder, placeholder, v)

        leaves, treedef = jax.tree.flatten(params)
        columns = [treedef.flatten_up_to(t) for t in (grads, state.v_row, state.v_col, state.v)]
        out = [update_one(*args, p) for *args, p in zip(*columns, leaves, strict=True)]
        updates = treedef.unflatten([u for u, _ in out])
        return updates, _to_state(optax.safe_increment(state.count), treedef, [stats for _, stats in out])

    return optax.GradientTransformation(init_fn, update_fn)


def _to_state(count: jax.Array, treedef: Any, stats: list[tuple]) -> optax.FactoredState:
    """Per-parameter (v_row, v_col, v) triples -> optax's FactoredState of three trees."""
    return optax.FactoredState(
        count=count,
        v_row=treedef.unflatten([t[0] for t in stats]),
        v_col=treedef.unflatten([t[1] for t in stats]),
        v=treedef.unflatten([t[2] for t in stats]),
    )
