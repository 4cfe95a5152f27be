"""A step-0 TrainState around given parameters, without making the model's random ones.

`Programs.init_state` builds a whole fresh state, random parameters included: for an imported
or fine-tuned model that would be a second full copy of the weights. Here the parameters are
passed in (donated, so they are not copied) and only the rest is made: the optimizer state of
the optimised part (for the run's own learner), the EMA (a copy, when the learner keeps one), the
non-trainable state unless given, and the key. The jitted function still traces
`task.init_state` for those, but its random parameters are outputs of nothing, so XLA never
computes them. `import_hf` uses it to write a start point; `train` to fine-tune from one.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from pax_eqx.tasks.train_state import TrainState


def state_with_params(programs: Any, params: Any, seed: int, nt_state: Any = None) -> TrainState:
    task = programs.task

    def build(params, nt_state, seed):
        fresh = task.init_state(jax.random.PRNGKey(seed))
        optimized, _ = task.split_optimized(params)
        return TrainState(
            step=fresh.step,
            params=params,
            nt_state=fresh.nt_state if nt_state is None else nt_state,
            opt_state=task.optimizer.init(optimized),
            ema=None if fresh.ema is None else jax.tree.map(lambda a: a + 0, optimized),
            key=fresh.key,
        )

    fn = jax.jit(build, out_shardings=programs.state_shardings, donate_argnums=(0, 1))
    return fn(params, nt_state, np.uint32(seed))
