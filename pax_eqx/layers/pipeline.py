"""Pipeline parallelism over a stack's layers: the GPipe and circular (interleaved) schedules.

A pipelined stack cuts its layers into `num_stages` stages, each held by one slice of the mesh's
`stage` axis, and the batch into `num_microbatches` microbatches that flow through the stages:

    iteration t:   stage 0    stage 1    stage 2    stage 3          (GPipe, S = 4, M = 4)
        0          mb 0       -          -          -
        1          mb 1       mb 0       -          -
        ...
        6          -          -          -          mb 3

Every iteration all stages run at once on their own microbatch, then the stage outputs move one
stage on (stage s's output becomes stage s + 1's input: a collective permute on `stage`). GPipe
needs M + S - 1 iterations for M microbatches, so a fraction (S - 1) / (M + S - 1) of every
stage's time is idle (the *bubble*).

The circular schedule (Praxis' CircularLayerwiseShardablePipelined, Megatron's interleaved
schedule) cuts the layers into S * R chunks, chunk c on stage c % S, and sends each microbatch
round the stages R times (`circular_repeat`): an iteration is then 1/R of a GPipe stage, the
run M * R + S - 1 such iterations, and the bubble (S - 1) / (M * R + S - 1), R times smaller,
paid for with R times the stage-to-stage transfers. A microbatch leaving the last stage waits
in a buffer until stage 0 is free for it again, so M >= S.

How it is written (docs/design.md, "Pipeline"): one pure function, vmapped over the stages with
the stage dimension of the weights and of the per-stage activations constrained to the `stage`
mesh axis; the shift between stages is `jnp.roll` of that stage-sharded array, which XLA's SPMD
partitioner lowers to a collective permute. FSDP and tensor parallelism inside a stage are the
unchanged logical-axis shardings of the weights (their other dimensions are left
unconstrained), propagated through the vmapped body as in an unpipelined step.

Weights stay the stack's [num_layers, ...] arrays in layer order -- checkpoints of pipelined and
unpipelined runs are the same arrays. GPipe's stage s then holds exactly its contiguous layers
(the `layers=stage` rule); the circular schedule regroups them to [stage, repeat, layers, ...]
inside the step (an all-to-all of the weights on `stage`, and of their gradients back, once a
step -- the planner counts it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from pax_eqx.config import Config, ConfigError, check_range, config
from pax_eqx.sharding.activations import axes_taken


@config
class PipelineConfig(Config):
    """How a stack's layers are pipelined over the mesh's `stage` axis (Pax's NUM_STAGES,
    NUM_MICROBATCHES, CIRCULAR_REPEAT).

    num_stages: pipeline stages; 1 = not pipelined. The mesh's stage axis must be this size (or
      1, which runs the same schedule with every stage on each device).
    num_microbatches: the batch is split into this many microbatches, which flow through the
      stages one after another; the bubble is (S - 1) / (M * R + S - 1).
    circular_repeat: 1 = GPipe (stage s holds layers [s * L / S, (s + 1) * L / S)); R > 1 = the
      circular schedule: S * R chunks of layers, chunk c on stage c % S, each microbatch goes
      round the stages R times (needs num_microbatches >= num_stages).
    remat_stage: apply the stack's remat_policy to each stage's iteration as a whole (Pax's
      pipeline: CHECKPOINT_POLICY remats the iteration body, keeping its input) instead of to
      each layer; with "full" only every iteration's stage input is kept for the backward pass.
    """

    num_stages: int = 1
    num_microbatches: int = 1
    circular_repeat: int = 1
    remat_stage: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, prefix: str = "PipelineConfig") -> None:
        check_range(self, ("num_stages", "num_microbatches", "circular_repeat"), ge=1, prefix=prefix)
        if self.num_stages == 1 and (self.num_microbatches, self.circular_repeat, self.remat_stage) != (1, 1, False):
            raise ConfigError(
                f"{prefix}.num_microbatches={self.num_microbatches} / circular_repeat={self.circular_repeat} / "
                f"remat_stage={self.remat_stage} have no effect with {prefix}.num_stages=1 (not pipelined); set "
                "num_stages > 1 or leave them at 1 / 1 / False."
            )
        if self.circular_repeat > 1 and self.num_microbatches < self.num_stages:
            raise ConfigError(
                f"{prefix}.circular_repeat={self.circular_repeat} needs {prefix}.num_microbatches >= num_stages="
                f"{self.num_stages}, got {self.num_microbatches}: a microbatch leaving the last stage re-enters "
                "stage 0 only after the other microbatches of its round; raise num_microbatches."
            )

    @property
    def enabled(self) -> bool:
        return self.num_stages > 1

    @property
    def num_chunks(self) -> int:
        """Contiguous groups of layers: num_stages * circular_repeat."""
        return self.num_stages * self.circular_repeat

    @property
    def num_iterations(self) -> int:
        """Pipeline iterations per step: M * R + S - 1."""
        return self.num_microbatches * self.circular_repeat + self.num_stages - 1

    @property
    def bubble_fraction(self) -> float:
        """The share of each stage's iterations spent idle: (S - 1) / (M * R + S - 1)."""
        return (self.num_stages - 1) / self.num_iterations

    def check(self, *, num_units: int, batch_size: int | None = None, prefix: str = "PipelineConfig") -> None:
        """ConfigError unless `num_units` (the stack's scanned layers or blocks) split into the
        chunks and `batch_size` (when known) into the microbatches."""
        if num_units % self.num_chunks:
            raise ConfigError(
                f"{prefix}: {num_units} layers (or MoE blocks) cannot be cut into num_stages x circular_repeat = "
                f"{self.num_stages} x {self.circular_repeat} equal chunks; choose sizes whose product divides it."
            )
        if batch_size is not None and batch_size % self.num_microbatches:
            raise ConfigError(
                f"{prefix}.num_microbatches={self.num_microbatches} does not divide the batch of {batch_size}; "
                "choose a divisor of the global batch size."
            )


StageFn = Callable[[Any, "int | jax.Array", jax.Array, dict, Any], tuple[jax.Array, dict, dict]]


def run_pipeline(
    stage_fn: StageFn,
    units: Any,
    x: jax.Array,
    inputs: dict[str, jax.Array],
    key: jax.Array | None,
    cfg: PipelineConfig,
) -> tuple[jax.Array, dict[str, jax.Array], dict[str, jax.Array]]:
    """Applies the stack's layers to `x` [batch, ...] with the schedule of `cfg`.

    stage_fn(stage_units, round, h, stage_inputs, key) -> (h, summaries, aux_losses): one stage's
      work on one microbatch (rematerialised as the caller chose): `stage_units` are all the
      stage's chunks (leading [R, n] axes), `round` which chunk this iteration runs (the Python
      int 0 under GPipe, a traced int32 under the circular schedule), h [microbatch, ...],
      `stage_inputs` the microbatch's rows of `inputs`; summaries have a leading [n] axis, aux
      losses are scalars summed over the stage's layers. A traced `round` should be sliced by
      inside what the stage rematerialises (each layer's remat): a slice taken outside is a value
      that varies with the iteration, and the backward would keep one per iteration (M R + S - 1
      copies of a chunk's weights), where the stage's weights themselves are kept once.
    units: the stack's weights, every leaf with a leading [num_units] axis in layer order.
    inputs: per-example arrays [batch, ...] every layer reads (segment ids, positions, paddings).
    key: split into one key per (iteration, stage); None when the layers draw no randomness.

    Returns the output [batch, ...], the summaries [num_units, ...] in layer order (averaged
    over the microbatches) and the aux losses (summed over the layers, averaged over the
    microbatches) -- what the stack would record running the whole batch at once.
    """
    s, m, r = cfg.num_stages, cfg.num_microbatches, cfg.circular_repeat
    batch = x.shape[0]
    cfg.check(num_units=jax.tree.leaves(units)[0].shape[0], batch_size=batch)
    n = jax.tree.leaves(units)[0].shape[0] // cfg.num_chunks
    # [num_units] in layer order = [repeat, stage, n]; stage-major for the stage axis.
    weights = _shard(jax.tree.map(lambda a: a.reshape(r, s, n, *a.shape[1:]).swapaxes(0, 1), units), "stage")
    # Microbatch j is rows j, j + M, j + 2M, ... (Praxis' layout): the batch's sharding over the
    # data axes stays on the microbatch's rows, and every data shard holds part of every microbatch.
    micro = lambda a: a.reshape(batch // m, m, *a.shape[1:]).swapaxes(0, 1)
    # Outside the pipeline the batch is split over stage too (each stage group its own rows, as
    # in Pax); inside, every stage sees every microbatch, its rows split over data and fsdp.
    buffer = _shard(micro(x), None, "batch")  # stage 0's inputs; the last stage's outputs go back in
    inputs = _shard(jax.tree.map(micro, inputs), None, "batch")
    stages = jnp.arange(s)
    state = _shard(jnp.zeros((s, *buffer.shape[1:]), x.dtype).at[0].set(buffer[0]), "stage", "batch")
    iterations = cfg.num_iterations
    keys = None if key is None else jax.random.split(key, (iterations, s))

    def one_stage(stage_weights, repeat, h, stage_inputs, stage_key):
        # GPipe runs the stage's one chunk every iteration: round 0, a Python int the stage fn
        # slices by outside any loop. The circular schedule's round varies with the iteration.
        return stage_fn(stage_weights, 0 if r == 1 else repeat, h, stage_inputs, stage_key)

    def iteration(carry, xs):
        state, buffer = carry
        t, it_keys = xs
        work = jnp.clip(t - stages, 0, m * r - 1)  # stage s works on microbatch (t - s) % M, round (t - s) // M
        stage_inputs = jax.tree.map(lambda a: a[work % m], inputs)
        out, summaries, aux = jax.vmap(one_stage, in_axes=(0, 0, 0, 0, None if it_keys is None else 0))(
            weights, work // m, state, stage_inputs, it_keys
        )
        out = _shard(out, "stage", "batch")
        # The last stage finished microbatch (t - S + 1) % M: into the buffer, where stage 0
        # finds it for its next round (or the caller, after the last).
        done = t - (s - 1)
        slot = jnp.maximum(done, 0) % m
        kept = jax.lax.dynamic_index_in_dim(buffer, slot, 0, keepdims=False)
        buffer = jax.lax.dynamic_update_index_in_dim(buffer, jnp.where(done >= 0, out[s - 1], kept), slot, 0)
        following = jax.lax.dynamic_index_in_dim(buffer, (t + 1) % m, 0, keepdims=False)
        shifted = jnp.roll(out, 1, axis=0)  # stage s's output -> stage s + 1: a collective permute
        first = (stages == 0).reshape(s, *([1] * (out.ndim - 1)))
        state = _shard(jnp.where(first, following[None], shifted), "stage", "batch")
        return (state, buffer), (summaries, aux)

    with axes_taken("stage"):  # the vmapped stage dimension holds `stage`: the layers' batch is data x fsdp's
        (_, buffer), (summaries, aux) = jax.lax.scan(iteration, (state, buffer), (jnp.arange(iterations), keys))
    # Which (iteration, stage) ran round q of microbatch j on stage p: t = q * M + j + p. Static.
    t_index = (np.arange(r)[:, None, None] * m + np.arange(m)[None, None, :] + np.arange(s)[None, :, None]).astype(
        np.int32
    )  # [R, S, M]
    s_index = np.broadcast_to(np.arange(s)[None, :, None], t_index.shape)
    per_layer = lambda a: a[t_index, s_index].mean(axis=2).reshape(r * s * n, *a.shape[3:])  # [R, S, n] -> order
    summaries = {name: per_layer(value) for name, value in summaries.items()}
    aux = {name: value[t_index, s_index].sum(axis=(0, 1)).mean() for name, value in aux.items()}
    return buffer.swapaxes(0, 1).reshape(batch, *buffer.shape[2:]), summaries, aux


def _shard(tree: Any, *leading: str | None) -> Any:
    """Constrains the leading dimensions of every leaf: "stage" to the stage axis, "batch" to the
    mesh's other batch axes (data, fsdp), None replicated; the rest keep whatever propagation
    gives them. Nothing without a current mesh of more than one stage."""
    mesh = jax.sharding.get_abstract_mesh()
    sizes = {} if mesh.empty else dict(mesh.shape)
    if sizes.get("stage", 1) == 1:
        return tree
    batch = tuple(a for a in ("data", "fsdp") if sizes.get(a, 1) > 1) or None
    dims = [batch if d == "batch" else d for d in leading]
    spec = lambda a: PartitionSpec(*dims, *([PartitionSpec.UNCONSTRAINED] * (a.ndim - len(dims))))
    return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, spec(a)), tree)
