"""Exponential moving average of the parameters (Pax's `ema_decay`), as pure functions.

optax keeps EMAs of gradients and updates (`optax.ema`) but not of parameters, so this is a
small pure function the train state carries beside the params; eval and decode can use the
average in place of the raw weights.

    ema_0     = params_0                      (no bias correction needed: it starts at params)
    ema_{t+1} = decay * ema_t + (1 - decay) * params_{t+1}

Floating arrays keep the EMA's dtype; any other leaf (an integer counter, say) is copied from
the params, since averaging it means nothing.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


def ema_init(params: Any) -> Any:
    """A copy of `params` (its own buffers, so donating params never donates the EMA)."""
    return jax.tree.map(jnp.copy, params)


def ema_update(ema: Any, params: Any, decay: float | Float[Array, ""]) -> Any:
    """decay * ema + (1 - decay) * params, leaf by leaf (same pytree structure as `params`)."""

    def update(e: Any, p: Any) -> Any:
        if not eqx.is_inexact_array(e):
            return p
        return (decay * e + (1.0 - decay) * p.astype(e.dtype)).astype(e.dtype)

    return jax.tree.map(update, ema, params)
