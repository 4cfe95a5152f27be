"""TrainState: everything that decides the future of a run, as one pytree.

Checkpointing this pytree (plus the data iterator's state, saved beside it) is what makes a
resumed run continue bitwise as if it had never stopped: parameters, non-trainable state,
optimizer state (including the skipped-step counters of the non-finite guard), the EMA of
the parameters, the step and the PRNG key that dropout and variational noise draw from.

The key is a raw uint32 key (`jax.random.PRNGKey`), not a typed key array, so it checkpoints
like any other array.

The same structure also carries, leaf for leaf, the state's abstract shapes
(`jax.ShapeDtypeStruct`, from `eval_shape`) and its shardings: hence `Leaf`.
"""

from __future__ import annotations

import equinox as eqx
import jax
import optax
from jaxtyping import PyTree

Leaf = jax.Array | jax.ShapeDtypeStruct | jax.sharding.Sharding
"""An array, its abstract shape, or its sharding."""


class TrainState(eqx.Module):
    step: Leaf
    """int32 scalar: updates applied so far."""
    params: PyTree[Leaf]
    """The model's arrays (`eqx.filter(model, eqx.is_array)`); its static part lives in the Task."""
    nt_state: eqx.nn.State | PyTree[Leaf] | None
    """Non-trainable variables (moving statistics), or None when the model has none."""
    opt_state: optax.OptState | PyTree[Leaf]
    ema: PyTree[Leaf] | None
    """A params-shaped exponential moving average, or None (learner.ema_decay = 0)."""
    key: Leaf
    """uint32[2]: the key this step's randomness is split from."""
