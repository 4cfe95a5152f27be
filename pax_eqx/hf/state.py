"""A step-0 TrainState around given parameters, without making the model's random ones.

`Programs.init_state` builds a whole fresh state, random parameters included: for an imported
model that would be a second full copy of the weights. Here the parameters are passed in (donated,
so they are not copied) and only the rest is made: the optimizer state of the optimised part,
the EMA (a copy, when the learner keeps one), the non-trainable state and the key. The jitted
function still traces `task.init_state` for those, but its random parameters are outputs of
nothing, so XLA never computes them.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from pax_eqx.tasks.train_state import TrainState


def state_with_params(programs: Any, params: Any, seed: int) -> TrainState:
    task = programs.task

    def build(params, seed):
        fresh = task.init_state(jax.random.PRNGKey(seed))
        optimized, _ = task.split_optimized(params)
        return TrainState(
            step=fresh.step,
            params=params,
            nt_state=fresh.nt_state,
            opt_state=task.optimizer.init(optimized),
            ema=None if fresh.ema is None else jax.tree.map(lambda a: a + 0, optimized),
            key=fresh.key,
        )

    fn = jax.jit(build, out_shardings=programs.state_shardings, donate_argnums=(0,))
    return fn(params, np.uint32(seed))
