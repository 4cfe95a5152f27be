"""The Task's pure functions, jitted once with shardings over a mesh (even a 1-device one).

    programs = Programs(task, mesh, rules)
    state = programs.init_state(seed)             # created already sharded: never whole on a host
    state, metrics = programs.train_step(state, batch)   # state buffers donated
    state, metrics = programs.train_steps(state, programs.global_batches([b1, b2, b3, b4]))
    metrics = programs.eval_step(state, batch)

Shardings come from the logical-axis rules: params by `param_shardings`, optimizer state by
matching params-shaped leaves (`optax.tree_map_params`), everything else replicated, and
batches split along the batch axis. `global_batch` turns each host's numpy batch into one
global jax.Array (`make_array_from_process_local_data`), which is how per-host infeed becomes
a sharded input on many hosts and a plain device_put on one.

`train_steps` runs several training steps in one compiled call (`train.steps_per_loop`): a
`lax.scan` of `task.train_step` over batches stacked on a leading axis (`global_batches`), the
state carried, the last step's outputs returned. It is the same function applied step after
step, so a run trains the same; the host dispatches, feeds and syncs once per loop instead of
once per step.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pax_eqx.layers import fp8
from pax_eqx.sharding.activations import activation_rules
from pax_eqx.sharding.rules import (
    batch_sharding,
    opt_state_shardings,
    param_shardings,
    replicated,
)
from pax_eqx.tasks.task import Task
from pax_eqx.tasks.train_state import TrainState


class UnderMesh:
    """A jitted function traced, lowered and run with `mesh` as the current mesh (`jax.set_mesh`)
    and the run's logical-axis `rules` active (`sharding.activations`), so that layers may
    constrain activations by logical name or bare PartitionSpec (the batch over the data axes, the
    pipeline's stage buffer on `stage`); on a one-device mesh nothing changes."""

    def __init__(self, fn: Any, mesh: Mesh, rules: tuple[str, ...] = ()):
        self.fn, self.mesh, self.rules = fn, mesh, rules

    def __call__(self, *args: Any) -> Any:
        with jax.set_mesh(self.mesh), activation_rules(self.rules):
            return self.fn(*args)

    def lower(self, *args: Any) -> Any:
        with jax.set_mesh(self.mesh), activation_rules(self.rules):
            return self.fn.lower(*args)


class Programs:
    def __init__(self, task: Task, mesh: Mesh, rules: tuple[str, ...] = ()):
        self.task, self.mesh, self.rules = task, mesh, rules
        self.abstract_state = jax.eval_shape(task.init_state, jax.random.PRNGKey(0))
        self.state_shardings = self._state_shardings(self.abstract_state)
        rep = replicated(mesh)
        self.init_state_fn = jax.jit(
            lambda seed: task.init_state(jax.random.PRNGKey(seed)), out_shardings=self.state_shardings
        )
        self.compiler_options = fp8.compiler_options(self.abstract_state.params)
        stepping = dict(
            in_shardings=(self.state_shardings, None),
            out_shardings=(self.state_shardings, rep),
            compiler_options=self.compiler_options,
        )
        self.train_step = UnderMesh(jax.jit(task.train_step, **stepping, donate_argnums=(0,)), mesh, rules)
        self.train_steps = UnderMesh(jax.jit(self._train_steps, **stepping, donate_argnums=(0,)), mesh, rules)
        self.eval_step = UnderMesh(
            jax.jit(
                task.eval_step,
                in_shardings=(self.state_shardings, None),
                out_shardings=rep,
                compiler_options=self.compiler_options,
            ),
            mesh,
            rules,
        )

    def _train_steps(self, state: TrainState, batches: dict) -> tuple[TrainState, Any]:
        """`task.train_step` over each batch of `batches` (stacked on a leading axis) in turn;
        the state after the last, and the last step's outputs (metrics, summaries)."""
        first = jax.tree.map(lambda b: b[0], batches)
        shapes = jax.eval_shape(self.task.train_step, state, first)[1]
        outputs = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)

        def body(carry, batch):
            state, _ = carry
            return self.task.train_step(state, batch), None

        (state, outputs), _ = jax.lax.scan(body, (state, outputs), batches)
        return state, outputs

    def _state_shardings(self, abstract: TrainState) -> TrainState:
        rep = replicated(self.mesh)
        p_sh = param_shardings(abstract.params, self.mesh, self.rules)
        trainable_sh, _ = self.task.split_optimized(p_sh)  # the optimizer state and EMA cover these
        trainable, _ = self.task.split_optimized(abstract.params)
        return TrainState(
            step=rep,
            params=p_sh,
            nt_state=jax.tree.map(lambda _: rep, abstract.nt_state),
            opt_state=opt_state_shardings(self.task.optimizer, abstract.opt_state, trainable, trainable_sh, self.mesh),
            ema=None if abstract.ema is None else trainable_sh,
            key=rep,
        )

    def init_state(self, seed: int) -> TrainState:
        return self.init_state_fn(np.uint32(seed))

    def global_batch(self, local: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """Each host's per-host batch -> global arrays sharded along the batch axis (and a [batch,
        seq] array's tokens over the context axis: `rules.batch_sharding`). A host holds whole rows."""
        return {k: jax.make_array_from_process_local_data(self.input_sharding(v.shape), v) for k, v in local.items()}

    def input_sharding(self, shape: tuple[int, ...]) -> NamedSharding:
        """The sharding of one input array of `shape` (one host's, one step's): `rules.batch_sharding`."""
        return batch_sharding(self.mesh, self.rules, len(shape), shape[1] if len(shape) == 2 else 0)

    def global_batches(self, locals_: list[dict[str, np.ndarray]]) -> dict[str, jax.Array]:
        """Several per-host batches -> global arrays stacked on a new leading axis (the steps of
        `train_steps`), each batch sharded along its batch axis as `global_batch` shards it."""

        def sharding(shape: tuple[int, ...]) -> NamedSharding:
            return NamedSharding(self.mesh, PartitionSpec(None, *self.input_sharding(shape).spec))

        stacked = {k: np.stack([b[k] for b in locals_]) for k in locals_[0]}
        return {k: jax.make_array_from_process_local_data(sharding(v.shape[1:]), v) for k, v in stacked.items()}

    def check_batch(self, local: dict[str, np.ndarray]) -> None:
        """Traces (does not run or compile) the train step on this host batch's global shapes:
        the model's and the task's errors about the batch surface now, as ConfigErrors."""
        jax.eval_shape(self.task.train_step, self.abstract_state, self.abstract_batch(local))

    @staticmethod
    def abstract_batch(local: dict[str, np.ndarray]) -> dict[str, jax.ShapeDtypeStruct]:
        """The global batch's shapes and dtypes for this host's batch (every host's rows)."""
        hosts = jax.process_count()
        return {k: jax.ShapeDtypeStruct((v.shape[0] * hosts,) + v.shape[1:], v.dtype) for k, v in local.items()}

    def abstract_with_shardings(self) -> Any:
        """ShapeDtypeStructs with shardings: the target a checkpoint restores onto."""
        return jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            self.abstract_state,
            self.state_shardings,
        )
