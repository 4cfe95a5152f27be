"""TrainState: everything that decides the future of a run, as one pytree.

Checkpointing this pytree (plus the data iterator's state, saved beside it) is what makes a
resumed run continue bitwise as if it had never stopped: parameters, non-trainable state,
optimizer state (including the skipped-step counters of the non-finite guard), the EMA of
the parameters, the step and the PRNG key that dropout draws from.

The key is a raw uint32 key (`jax.random.PRNGKey`), not a typed key array, so it checkpoints
like any other array.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx


class TrainState(eqx.Module):
    """Fields are `Any` because the same structure also carries shardings and ShapeDtypeStructs."""

    step: Any  # int32 scalar
    params: Any  # the model's arrays (eqx.filter(model, is_param)); statics live in the Task
    nt_state: Any  # equinox.nn.State of non-trainable variables
    opt_state: Any
    ema: Any  # params-shaped EMA, or None
    key: Any  # uint32[2]
