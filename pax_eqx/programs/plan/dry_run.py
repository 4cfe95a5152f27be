"""The dry-run planner: `python -m pax_eqx.train --exp NAME --dry-run [--mesh...] [--dry-run-device-memory-gb 80]`.

It lives with the programs, not in `sharding`, because it builds the experiment's Task to get
the shapes of its train state: sharding stays a service that takes arrays, shapes and rules
(`spec_for`, `logical_axes`) and never imports a task or the experiment config.

Everything is abstract: the train state comes from `jax.eval_shape` (no arrays are made), the
mesh is just its shape, so a 175B model on a 1024-way mesh plans on a laptop CPU in seconds.
For every parameter group it prints the logical axes and the PartitionSpec the rules give,
then the per-device bytes of parameters, optimizer state and an activation estimate, and
whether that fits the given device memory. The activation estimate below is a language
model's (it reads layers, heads, vocab and remat policy off a `LanguageModelConfig`); for any
other model the plan counts parameters, optimizer state and gradients, and says so.

Per device, for one step, documented so it can be checked (and checked in
tests/sharding/test_planner.py against the peak memory measured on an H100 for gpt3_xl at three
batch sizes and two remat policies: within 6%):
  parameters, optimizer state   as sharded by the rules
  gradients                     float32, sharded as the parameters; with gradient accumulation
                                (learner.num_microbatches k > 1) a second copy, the running sum,
                                and the activations below are one microbatch's (batch / k rows)
  the larger of                 the activations below (the backward's peak) and the optimizer's
                                update, a float32 copy of the parameters' shard that lives after
                                the activations are freed (XLA:CPU's buffer assignment shows it:
                                tests/sharding/test_planner_vs_xla.py)
  saved between layers          L x B_d x S_d x d x c_policy x bytes(fprop)
  live inside one layer         B_d x S_d x (6 d + 2 H_t) x bytes, plus, when attention runs in XLA,
                                4 score-sized arrays B_d x N_t x S_d x S x 4 (the backward's logits,
                                probabilities and their gradients; cuDNN flash attention keeps
                                none), plus, under context parallelism, the gathered keys and
                                values 2 x B_d x S x K_t x head_dim x bytes
  logits                        B_d x S_d x V_t x 4 (XLA writes their gradient over them); with
                                model.loss_chunk_size C, 2 x B_d x C x V_t x 4 + V_t x d x 4
with B_d the per-device batch, S_d = S / N the tokens of a row on a device (N the devices of the
`seq` rule's axes, `context`: 1 unless the mesh has a context axis), H_t / N_t / K_t / V_t the
hidden size, heads, key/value heads and vocab over the tensor
axis, and c_policy the d-sized activations a remat policy keeps per layer and token: the layer
input (1) and, by policy, the QKV projection (3), the attention output (1), its projection (1),
the MLP input (H/d) and output (1), the GELU output (H/d), the norms' outputs and the residual
sum (3): full 1, save_context_and_out_proj 3, save_qkv_context_and_out_proj 6,
dots_with_no_batch_dims_saveable 6 + H/d, dots_with_no_batch_dims_and_context and dots_saveable
7 + H/d, everything_saveable 10 + 2 H/d; none 12 + 4 H/d and, with XLA attention, 2.5 score-sized
arrays a head (fitted to XLA:CPU's compiled steps, models/lm_plan.py). Under context parallelism
attention is XLA's (cuDNN's kernel takes no sharded sequence). Beside the activations, the
backward holds working copies of a stack's weights (`MemoryModel.working_weight_bytes`): under FSDP
one layer gathered over fsdp (fprop dtype) and its float32 gradient before the reduce-scatter; in a
pipeline two float32 copies of the stage's weights (their gradient's running sum and one iteration's).

A pipelined model (model.pipeline, S stages, M microbatches, R rounds, N = M R + S - 1
iterations, chunks of k = L / (S R) layers) keeps, per device, with b_d = B / (M x data x fsdp)
a microbatch's rows and t = b_d x S x d x bytes one microbatch's activations on it:
  saved                         N x k x t x c_policy (the policy per layer), or with remat_stage
                                N x t x (1 + k (c_policy - 1)) (every iteration's stage input and
                                what the policy names) + k x t x c_none (one stage recomputed)
  microbatch buffer             2 x M x t
  live inside one layer         as above with b_d; logits as above (outside the pipeline).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax.sharding import PartitionSpec

from pax_eqx.config import ConfigError
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.models.model import StepShape
from pax_eqx.programs.plan.text_width import UNBROKEN, unbroken, wrap
from pax_eqx.programs.runtime import build_task
from pax_eqx.sharding.device_kinds import DEVICE_KINDS, DeviceKind
from pax_eqx.sharding.logical import LogicalAxes, logical_axes
from pax_eqx.sharding.mesh import AXES, in_form, shortest_form
from pax_eqx.sharding.rules import check_rule_names, parse_rules, spec_for
from pax_eqx.tasks.task import Task


def _shard_bytes(shape: tuple[int, ...], dtype, spec, mesh_shape: dict[str, int]) -> int:
    n = 1
    for size, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
        n *= math.ceil(size / math.prod(mesh_shape[a] for a in axes))
    return n * jnp.dtype(dtype).itemsize


class Plan(NamedTuple):
    """The plan's text (each line whole), the per-device total in bytes, and whether it fits the
    memory asked about (None when no --dry-run-device-memory-gb was given); `lines` holds its
    lines, a parameter group as the tuple of its columns, for `laid_out`."""

    text: str
    total_bytes: int
    fits: bool | None
    lines: tuple[str | tuple[str, ...], ...] = ()

    def __str__(self) -> str:
        return self.text

    def laid_out(self, width: int | None) -> str:
        """The text in `width` columns (`layout`; None: `text`): what `--dry-run` prints."""
        return layout(self.lines, width) if self.lines and width is not None else self.text


def layout(lines: Sequence[str | tuple[str, ...]], width: int | None) -> str:
    """The plan's lines in `width` columns (None: each line whole): a longer line broken at spaces,
    continued 4 spaces further in; the parameter groups (name, shape, logical axes, spec) in
    columns as wide as their widest cell, or, where those do not fit, each group in two lines:
    its name and shape, then its axes and spec."""
    out: list[str] = []
    rows = [line for line in lines if isinstance(line, tuple)]
    if width is None:
        sizes = (40, 28, 38)
    else:
        sizes = tuple(max(len(row[i]) for row in rows) if rows else 0 for i in range(3))
    one_line = width is None or all(len(_group_line(row, sizes)) <= width for row in rows)
    for line in lines:
        if isinstance(line, tuple):
            if one_line:
                out.append(_group_line(line, sizes))
            else:
                name, shape, axes, spec, more = line
                out += wrap(f"  {name} {unbroken(shape)}{more}", width, "      ")
                out += wrap(f"      {axes} -> {spec}", width, "        ")
        elif width is None:
            out.append(line.replace(UNBROKEN, " "))
        else:
            indent = " " * (len(line) - len(line.lstrip()) + 4)
            out += wrap(line, width, indent)
    return "\n".join(out)


def _group_line(row: tuple[str, ...], sizes: tuple[int, ...]) -> str:
    name, shape, axes, spec, more = row
    return f"  {name:{sizes[0]}s} {shape:{sizes[1]}s} {axes:{sizes[2]}s} -> {spec}{more}"


class Memory(NamedTuple):
    """One layout's per-device bytes, by kind (see the module docstring), and the model's plan
    (its activation note and layout lines)."""

    params: int
    opt_state: int
    grads: int
    grad_accumulator: int
    activations: int
    update: int
    model_plan: Any
    working_weights: int = 0

    @property
    def total(self) -> int:
        """The peak: the state and gradients, plus the larger of what the backward holds (the
        activations and the working copies of weights) and what the optimizer's update holds once
        they are freed."""
        backward = self.activations + self.working_weights
        return self.params + self.opt_state + self.grads + self.grad_accumulator + max(backward, self.update)


class MemoryModel:
    """The memory of one experiment's train step on any layout, from one `jax.eval_shape` of its
    state: `bytes_for(exp)` takes the experiment with another mesh, remat policy, loss chunk,
    gradient-accumulation or pipeline microbatches (anything that leaves the parameters' shapes
    as they are) and costs a few milliseconds, so `--recommend` can price thousands of layouts."""

    def __init__(self, exp: ExperimentConfig):
        self.exp = exp
        self.task = build_task(exp)  # the run's own Task; only its state's shapes and optimizer are used
        self.state = jax.eval_shape(self.task.init_state, jax.random.PRNGKey(0))
        self.axes_tree = logical_axes(self.state.params)
        self.leaves = jtu.tree_leaves_with_path(self.state.params)
        self.axes = jtu.tree_leaves(self.axes_tree, is_leaf=lambda x: isinstance(x, LogicalAxes))
        self.param_count = sum(leaf.size for _, leaf in self.leaves)

    def param_specs(self, mesh_shape: dict[str, int], table: dict) -> Any:
        return jtu.tree_map(
            lambda leaf, ax: spec_for(tuple(ax), leaf.shape, mesh_shape, table), self.state.params, self.axes_tree
        )

    def bytes_for(self, exp: ExperimentConfig) -> Memory:
        mesh_shape = dict(zip(AXES, exp.mesh.shape))
        table = parse_rules(exp.mesh.rules)
        specs = self.param_specs(mesh_shape, table)
        spec_leaves = jtu.tree_leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
        params = sum(
            _shard_bytes(leaf.shape, leaf.dtype, s, mesh_shape) for (_, leaf), s in zip(self.leaves, spec_leaves)
        )
        opt = _opt_state_bytes(self.task, self.state, specs, mesh_shape)
        micro = exp.learner.num_microbatches
        batch, seq, dtype = exp.data.train.batch_size, exp.data.seq_len, exp.train.fprop_dtype
        model_plan = exp.model.step_plan(StepShape(batch, seq, dtype, micro, mesh_shape, table))
        if micro > 1:  # the step runs on one microbatch at a time: its activations are one microbatch's
            acts = exp.model.step_plan(StepShape(batch // micro, seq, dtype, 1, mesh_shape, table)).activation_bytes
        else:
            acts = model_plan.activation_bytes
        grads = params  # float32 gradients, sharded as the parameters
        accumulator = grads if micro > 1 else 0  # the scan's running sum beside each microbatch's gradients
        update = params  # the optimizer's float32 update (clipped, scaled gradients), sharded as the parameters
        working = self.working_weight_bytes(spec_leaves, mesh_shape, dtype)
        return Memory(params, opt, grads, accumulator, acts or 0, update, model_plan, working)

    def working_weight_bytes(self, spec_leaves: list, mesh_shape: dict[str, int], fprop_dtype: str) -> int:
        """What the backward holds of a stack's weights beyond their shards (leaves with a leading
        `layers` axis; checked against XLA:CPU, tests/sharding/test_planner_vs_xla.py):

        - FSDP (a layer's weights sharded over fsdp): the layer being worked on gathered whole over
          fsdp, in the fprop dtype, and its gradient before the reduce-scatter, float32.
        - a pipeline (`layers` on a stage axis of more than one device): every iteration runs the
          stage's weights again, so the backward's scan carries the float32 sum of their gradient
          and holds one iteration's gradient of them beside it: two float32 copies of the stage's
          weights (the final gradient is counted with the gradients).
        """
        gathered, stage_weights = 0, 0
        itemsize = jnp.dtype(fprop_dtype).itemsize
        for (_, leaf), spec, ax in zip(self.leaves, spec_leaves, self.axes):
            if not tuple(ax) or tuple(ax)[0] != "layers":
                continue
            entries = tuple(spec) + (None,) * (leaf.ndim - len(spec))
            axes_of = lambda e: () if e is None else (e,) if isinstance(e, str) else tuple(e)
            if any("fsdp" in axes_of(e) for e in entries[1:]) and mesh_shape.get("fsdp", 1) > 1:
                whole = PartitionSpec(*(tuple(a for a in axes_of(e) if a != "fsdp") or None for e in entries[1:]))
                one_layer = _shard_bytes(leaf.shape[1:], jnp.float32, whole, mesh_shape)
                gathered += one_layer // 4 * (itemsize + 4)
            if "stage" in axes_of(entries[0]) and mesh_shape.get("stage", 1) > 1:
                stage_weights += _shard_bytes(leaf.shape, jnp.float32, spec, mesh_shape)
        return gathered + 2 * stage_weights


def planned_bytes(exp: ExperimentConfig) -> int:
    """The plan's total per device: what an out-of-memory error quotes (entry.run(memory_planner=...))."""
    return plan(exp).total_bytes


def check_batch(exp: ExperimentConfig) -> None:
    """ConfigError unless the global batch splits over the mesh's batch axes."""
    table = parse_rules(exp.mesh.rules)
    batch_ways = math.prod(dict(zip(AXES, exp.mesh.shape))[a] for a in table["batch"])
    global_batch = exp.data.train.batch_size
    if global_batch % batch_ways:
        raise ConfigError(
            f"--dry-run: data.train.batch_size={global_batch} is not divisible by the mesh's batch axes "
            f"({'x'.join(table['batch'])} = {batch_ways}); change the batch size or mesh.ici_mesh_shape."
        )


def as_run_on(exp: ExperimentConfig, kind: DeviceKind) -> ExperimentConfig:
    """`exp` as it runs on `kind`: attention "auto" is XLA's on an accelerator without cuDNN's
    fused kernel (a TPU), so its S x S scores are planned; otherwise `exp` itself."""
    attention = getattr(getattr(exp.model, "block", None), "attention", None)
    if kind.fused_attention or attention is None or attention.implementation != "auto":
        return exp
    block = exp.model.block.replace(attention=attention.replace(implementation="xla"))
    return exp.replace(model=exp.model.replace(block=block))


def plan(exp: ExperimentConfig, device_memory_gb: float | None = None, model: MemoryModel | None = None) -> Plan:
    """The printed plan of `exp`'s layout; `model`: a MemoryModel of the same experiment, reused.
    device_memory_gb: GiB a device, for the verdict; by default that of `mesh.device_kind`, the
    accelerator the layout was written for (none: no verdict)."""
    kind = DEVICE_KINDS.get(exp.mesh.device_kind)
    if kind is not None:
        exp = as_run_on(exp, kind)
        if device_memory_gb is None:
            device_memory_gb = kind.memory_gib
    exp.validate(data_files=False)
    check_batch(exp)
    model = MemoryModel(exp) if model is None else model
    mesh_shape = dict(zip(AXES, exp.mesh.shape))
    table = parse_rules(exp.mesh.rules)
    check_rule_names(exp.mesh.rules, model.axes_tree)
    written_for = f" of {kind.name} (mesh.device_kind)" if kind is not None else ""
    ici, dcn = unbroken(str(exp.mesh.ici_mesh_shape)), unbroken(str(exp.mesh.dcn_mesh_shape))
    lines: list[str | tuple[str, ...]] = [
        f"Dry run of {exp.name or 'experiment'}: mesh {_mesh_text(exp)} "
        f"({unbroken('ICI ' + ici)} x {unbroken('DCN ' + dcn)}), {exp.mesh.num_devices} devices{written_for}",
    ]
    memory = model.bytes_for(exp)
    specs = jtu.tree_leaves(
        model.param_specs(mesh_shape, table), is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)
    )
    groups: dict[str, list] = defaultdict(list)
    for (path, leaf), spec, ax in zip(model.leaves, specs, model.axes):
        groups[_group_name(path)].append((leaf, spec, ax))
    lines.append(f"Parameters: {model.param_count:,} ({_short_count(model.param_count)})")
    lines += _expert_lines(specs, model.axes, [leaf for _, leaf in model.leaves], model.param_count, table)
    model_plan = memory.model_plan  # the model's own share: activations, pipeline, all-to-all
    lines += model_plan.lines
    lines.append("Parameter groups (shape, logical axes -> PartitionSpec):")
    for name, items in groups.items():
        leaf, spec, ax = items[0]
        more = f"  (x{len(items)})" if len(items) > 1 else ""
        lines.append((name, str(tuple(leaf.shape)), str(tuple(ax)), str(spec), more))
    gib = 1024**3
    lines += [
        "Per-device memory:",
        f"  parameters (float32)      {memory.params / gib:10.2f} GiB",
        f"  optimizer state           {memory.opt_state / gib:10.2f} GiB",
        f"  gradients (float32)       {memory.grads / gib:10.2f} GiB",
    ]
    if memory.grad_accumulator:
        lines.append(
            f"  gradient accumulator      {memory.grad_accumulator / gib:10.2f} GiB  "
            f"({exp.learner.num_microbatches} microbatches)"
        )
    if model_plan.activation_bytes is None:
        lines.append(f"  activations               {model_plan.activation_note}")
    else:
        note = model_plan.activation_note
        if exp.learner.num_microbatches > 1:
            note += f"; one of {exp.learner.num_microbatches} microbatches at a time"
        lines.append(f"  activations (estimate)    {memory.activations / gib:10.2f} GiB  ({note})")
    if memory.working_weights:
        lines.append(
            f"  working weights           {memory.working_weights / gib:10.2f} GiB  (a layer gathered over fsdp with "
            "its gradient, and a pipeline's gradient sum of the stage's weights: MemoryModel.working_weight_bytes)"
        )
    if memory.update > memory.activations + memory.working_weights:
        lines.append(
            f"  optimizer update          {memory.update / gib:10.2f} GiB  (a float32 update the size of the "
            "parameters, live after the activations are freed: counted instead of them, the larger)"
        )
    total = memory.total
    lines.append(f"  total                     {total / gib:10.2f} GiB")
    fits = None if device_memory_gb is None else total <= device_memory_gb * gib
    if fits is not None:
        lines.append(f"Verdict: {'fits' if fits else 'does NOT fit'} in {device_memory_gb:g} GiB per device.")
    return Plan(layout(lines, None), total, fits, tuple(lines))


def _expert_lines(specs, axes, leaves, param_count: int, table: dict) -> list[str]:
    """MoE: how many parameters are experts' (an "expert" logical axis), where that axis lives,
    and that tokens reach their experts by all-to-all over it (none when it is replicated)."""
    expert = [(leaf, spec, ax) for leaf, spec, ax in zip(leaves, specs, axes) if "expert" in tuple(ax)]
    if not expert:
        return []
    count = sum(leaf.size for leaf, _, _ in expert)
    placed = {spec[tuple(ax).index("expert")] for _, spec, ax in expert}
    where = ", ".join(str(p) for p in sorted(placed, key=str))
    moving = (
        f"dispatch/combine are all-to-alls over {where}"
        if placed != {None}
        else f"the expert axis is not sharded (rule expert={'+'.join(table.get('expert', ())) or '-'}: that mesh axis "
        "is 1 or its size does not divide the experts), so no all-to-all; the experts are split by their other axes"
    )
    return [f"Expert weights: {count:,} ({_short_count(count)}, {count / param_count:.0%}); expert axis -> {where}; "
            f"{moving}"]  # fmt: skip


def _mesh_text(exp: ExperimentConfig) -> str:
    """The mesh's axes and sizes; the stage and context axes only where there are."""
    names = shortest_form(exp.mesh.shape)
    return f"{unbroken('(' + ', '.join(names) + ')')} = {unbroken(str(in_form(exp.mesh.shape, names)))}"


def _short_count(n: int) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f} {suffix}"
    return str(n)


def _group_name(path) -> str:
    parts = []
    for entry in path:
        if isinstance(entry, jtu.GetAttrKey):
            parts.append(entry.name)
        elif isinstance(entry, jtu.SequenceKey):
            parts.append("*")
    return ".".join(parts)


def _opt_state_bytes(task: Task, state: Any, param_specs: Any, mesh_shape: dict[str, int]) -> int:
    import optax

    specs = optax.tree_map_params(
        task.optimizer, lambda v, s: v if isinstance(v, optax.MaskedNode) else s, state.opt_state,
        task.split_optimized(param_specs)[0],
        transform_non_params=lambda _: jax.sharding.PartitionSpec(),
        is_leaf=lambda x: x is None or isinstance(x, (jax.sharding.PartitionSpec, optax.MaskedNode)),
    )  # fmt: skip
    leaves = jtu.tree_leaves(state.opt_state)
    spec_leaves = jtu.tree_leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    return sum(_shard_bytes(leaf.shape, leaf.dtype, s, mesh_shape) for leaf, s in zip(leaves, spec_leaves))
