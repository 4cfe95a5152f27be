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
  gradients                     float32, sharded as the parameters
  saved between layers          L x B_d x S x d x c_policy x bytes(fprop)
  live inside one layer         B_d x S x (6 d + 2 H_t) x bytes, plus, when attention runs in XLA,
                                the scores B_d x N_t x S x S x 4 (cuDNN flash attention keeps none)
  logits                        B_d x S x V_t x 4 (XLA writes their gradient over them); with
                                model.loss_chunk_size C, 2 x B_d x C x V_t x 4 + V_t x d x 4
with B_d the per-device batch, H_t / N_t / V_t the hidden size, heads and vocab over the tensor
axis, and c_policy the d-sized activations a remat policy keeps per layer and token: the layer
input (1) and, by policy, the QKV projection (3), the attention output (1), its projection (1),
the MLP input (H/d) and output (1), the GELU output (H/d), the norms' outputs and the residual
sum (3): full 1, save_context_and_out_proj 3, save_qkv_context_and_out_proj 6,
dots_with_no_batch_dims_saveable 6 + H/d, dots_with_no_batch_dims_and_context and dots_saveable
7 + H/d, everything_saveable and none 10 + 2 H/d.

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
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from pax_eqx.config import ConfigError
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.layers.moe_routing import capacity
from pax_eqx.models.language_model import LanguageModelConfig
from pax_eqx.programs.runtime import build_task
from pax_eqx.sharding.logical import LogicalAxes, logical_axes
from pax_eqx.sharding.mesh import AXES
from pax_eqx.sharding.rules import parse_rules, spec_for
from pax_eqx.tasks.task import Task

_POLICY_SAVED = {
    "full": lambda d, h: 1.0,
    "save_context_and_out_proj": lambda d, h: 3.0,
    "save_qkv_context_and_out_proj": lambda d, h: 6.0,
    "dots_with_no_batch_dims_saveable": lambda d, h: 6 + h / d,
    "dots_with_no_batch_dims_and_context": lambda d, h: 7 + h / d,
    "dots_saveable": lambda d, h: 7 + h / d,
    "everything_saveable": lambda d, h: 10 + 2 * h / d,
    "none": lambda d, h: 10 + 2 * h / d,
}


def _shard_bytes(shape: tuple[int, ...], dtype, spec, mesh_shape: dict[str, int]) -> int:
    n = 1
    for size, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
        n *= math.ceil(size / math.prod(mesh_shape[a] for a in axes))
    return n * jnp.dtype(dtype).itemsize


class Plan(NamedTuple):
    """The printed plan, the per-device total in bytes, and whether it fits the memory asked
    about (None when no --dry-run-device-memory-gb was given)."""

    text: str
    total_bytes: int
    fits: bool | None

    def __str__(self) -> str:
        return self.text


def plan(exp: ExperimentConfig, device_memory_gb: float | None = None) -> Plan:
    exp.validate(data_files=False)
    mesh_shape = dict(zip(AXES, exp.mesh.shape))
    table = parse_rules(exp.mesh.rules)
    num_devices = exp.mesh.num_devices
    batch_ways = math.prod(mesh_shape[a] for a in table["batch"])
    global_batch = exp.data.train.batch_size
    if global_batch % batch_ways:
        raise ConfigError(
            f"--dry-run: data.train.batch_size={global_batch} is not divisible by the mesh's batch axes "
            f"({'x'.join(table['batch'])} = {batch_ways}); change the batch size or mesh.ici_mesh_shape."
        )
    task = build_task(exp)  # the run's own Task; only its state's shapes and optimizer are used
    state = jax.eval_shape(task.init_state, jax.random.PRNGKey(0))
    param_specs = jtu.tree_map(
        lambda leaf, ax: spec_for(tuple(ax), leaf.shape, mesh_shape, table),
        state.params, logical_axes(state.params),
    )  # fmt: skip
    lines = [
        f"Dry run of {exp.name or 'experiment'}: mesh {_mesh_text(exp)} "
        f"(ICI {exp.mesh.ici_mesh_shape} x DCN {exp.mesh.dcn_mesh_shape}), {num_devices} devices",
    ]
    groups: dict[str, list] = defaultdict(list)
    axes_tree = logical_axes(state.params)
    leaves = jtu.tree_leaves_with_path(state.params)
    specs = jtu.tree_leaves(param_specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    axes = jtu.tree_leaves(axes_tree, is_leaf=lambda x: isinstance(x, LogicalAxes))
    param_count = param_bytes = 0
    for (path, leaf), spec, ax in zip(leaves, specs, axes):
        name = _group_name(path)
        groups[name].append((leaf, spec, ax))
        param_count += leaf.size
        param_bytes += _shard_bytes(leaf.shape, leaf.dtype, spec, mesh_shape)
    lines.append(f"Parameters: {param_count:,} ({_short_count(param_count)})")
    lines += _expert_lines(specs, axes, [leaf for _, leaf in leaves], param_count, table)
    lines += _all_to_all_lines(exp, mesh_shape, table)
    lines += _pipeline_lines(exp, mesh_shape, global_batch)
    lines.append("Parameter groups (shape, logical axes -> PartitionSpec):")
    for name, items in groups.items():
        leaf, spec, ax = items[0]
        more = f"  (x{len(items)})" if len(items) > 1 else ""
        lines.append(f"  {name:40s} {str(tuple(leaf.shape)):28s} {str(tuple(ax)):38s} -> {spec}{more}")
    opt_bytes = _opt_state_bytes(task, state, param_specs, mesh_shape)
    grad_bytes = param_bytes  # float32 gradients, sharded as the parameters
    gib = 1024**3
    lines += [
        "Per-device memory:",
        f"  parameters (float32)      {param_bytes / gib:10.2f} GiB",
        f"  optimizer state           {opt_bytes / gib:10.2f} GiB",
        f"  gradients (float32)       {grad_bytes / gib:10.2f} GiB",
    ]
    if isinstance(exp.model, LanguageModelConfig):
        act_bytes = _activation_bytes(exp, mesh_shape, table, global_batch)
        attention = "cuDNN flash on GPU" if flash_attention(exp) else "XLA, with S x S scores"
        lines.append(
            f"  activations (estimate)    {act_bytes / gib:10.2f} GiB  (per-device batch {global_batch // batch_ways}, "
            f"seq {exp.data.seq_len}, remat {exp.model.remat_policy}, attention {attention})"
        )
    else:
        act_bytes = 0
        lines.append(
            f"  activations               not estimated: the estimate is for language models only "
            f"(model is a {type(exp.model).__name__}); leave headroom for them"
        )
    total = param_bytes + opt_bytes + grad_bytes + act_bytes
    lines.append(f"  total                     {total / gib:10.2f} GiB")
    fits = None if device_memory_gb is None else total <= device_memory_gb * gib
    if fits is not None:
        lines.append(f"Verdict: {'fits' if fits else 'does NOT fit'} in {device_memory_gb:g} GiB per device.")
    return Plan("\n".join(lines), total, fits)


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


def _all_to_all_lines(exp: ExperimentConfig, mesh_shape: dict[str, int], table: dict) -> list[str]:
    """The bytes an MoE language model's train step moves by all-to-all: every MoE layer sends its
    dispatch buffer [E, G, C, M] to the experts and the combine buffer back, forward and again in
    the backward (4 buffers a layer a step); a device keeps its own (n - 1) / n share of each."""
    m = exp.model
    if not isinstance(m, LanguageModelConfig) or not m.moe_layer_interval:
        return []
    ways = math.prod(mesh_shape[a] for a in table.get("expert", ()))
    if ways <= 1 or m.moe.num_experts % ways:
        return []
    if m.moe.dropless:
        return ["All-to-all: none (dropless routing computes every expert on its tokens in place)"]
    batch, time = exp.data.train.batch_size // exp.learner.num_microbatches, exp.data.seq_len
    groups = m.moe.num_groups or batch
    group_size = batch * time // groups
    slots = capacity(group_size, m.moe.num_experts, m.moe.capacity_factor, m.moe.min_capacity)
    nbytes = jnp.dtype(exp.train.fprop_dtype).itemsize
    layer = 4 * m.moe.num_experts * groups * slots * m.model_dims * nbytes
    moe_layers = m.num_layers // m.moe_layer_interval
    total = layer * moe_layers * exp.learner.num_microbatches
    per_device = total * (ways - 1) / ways / ways
    return [
        f"All-to-all per step: {_bytes(total)} over the expert axis ({moe_layers} MoE layers x 4 buffers of "
        f"[{m.moe.num_experts} experts, {groups} groups, capacity {slots}, {m.model_dims}] {exp.train.fprop_dtype}"
        f"{f' x {exp.learner.num_microbatches} microbatches' if exp.learner.num_microbatches > 1 else ''}); "
        f"each of the {ways} devices sends {_bytes(per_device)}"
    ]


def _mesh_text(exp: ExperimentConfig) -> str:
    """The mesh's axes and sizes; the stage axis only where there is one."""
    shape = exp.mesh.shape
    return f"(stage, data, fsdp, tensor) = {shape}" if shape[0] > 1 else f"(data, fsdp, tensor) = {shape[1:]}"


def _pipeline(exp: ExperimentConfig) -> Any:
    """The model's PipelineConfig when it pipelines its layers, else None."""
    pipeline = getattr(exp.model, "pipeline", None)
    return pipeline if pipeline is not None and pipeline.enabled else None


def _pipeline_lines(exp: ExperimentConfig, mesh_shape: dict[str, int], global_batch: int) -> list[str]:
    """Stages, microbatches, the bubble, and what moves between stages."""
    p = _pipeline(exp)
    if p is None:
        return []
    m = exp.model
    chunk = m.num_layers // p.num_chunks
    rows = global_batch // exp.learner.num_microbatches // p.num_microbatches
    rows_d = rows // (mesh_shape["data"] * mesh_shape["fsdp"])
    nbytes = jnp.dtype(exp.train.fprop_dtype).itemsize
    hop = rows_d * exp.data.seq_len * m.model_dims * nbytes
    schedule = (
        f"GPipe: stage s holds layers [{chunk}s, {chunk}s + {chunk})"
        if p.circular_repeat == 1
        else f"circular: {p.num_chunks} chunks of {chunk} layers, chunk c on stage c % {p.num_stages}, "
        f"{p.circular_repeat} rounds per microbatch"
    )
    lines = [
        f"Pipeline: {p.num_stages} stages x {m.num_layers // p.num_stages} layers ({schedule}); "
        f"{p.num_microbatches} microbatches of {rows} rows ({rows_d} per device), {p.num_iterations} iterations "
        f"a step; bubble (S - 1) / (M x R + S - 1) = {p.bubble_fraction:.1%}",
        f"  stage to stage: {_bytes(hop)} per device per iteration (collective permute on stage), "
        f"{_bytes(2 * hop * p.num_iterations * exp.learner.num_microbatches)} a step with the backward",
    ]
    if p.circular_repeat > 1:
        lines.append(
            "  circular: the stacked weights are regrouped from layer order to [stage, round, layer] each step "
            "(an all-to-all over stage, and their gradients back)"
        )
    return lines


def _bytes(n: int | float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


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
        task.split_frozen(param_specs)[0],
        transform_non_params=lambda _: jax.sharding.PartitionSpec(),
        is_leaf=lambda x: x is None or isinstance(x, (jax.sharding.PartitionSpec, optax.MaskedNode)),
    )  # fmt: skip
    leaves = jtu.tree_leaves(state.opt_state)
    spec_leaves = jtu.tree_leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    return sum(_shard_bytes(leaf.shape, leaf.dtype, s, mesh_shape) for leaf, s in zip(leaves, spec_leaves))


def flash_attention(exp: ExperimentConfig) -> bool:
    """Whether attention will run as cuDNN's fused kernel on a GPU (no S x S scores in memory):
    the conditions of `layers.attention_kernels.cudnn_qualifies`, read off the config (of a
    language model: `exp.model` is a LanguageModelConfig)."""
    a = exp.model.block.attention
    head_dim = exp.model.dim_per_head or exp.model.model_dims // exp.model.num_heads
    qualifies = (
        exp.train.fprop_dtype == "bfloat16" and head_dim % 8 == 0 and head_dim <= 256
        and a.logit_cap == 0.0 and a.dropout_prob == 0.0
    )  # fmt: skip
    return a.implementation == "cudnn" or (a.implementation == "auto" and qualifies)


def _activation_bytes(exp: ExperimentConfig, mesh_shape: dict[str, int], table: dict, global_batch: int) -> int:
    m = exp.model
    s, d = exp.data.seq_len, m.model_dims
    ways = lambda name: math.prod(mesh_shape[a] for a in table.get(name, ()))
    batch = global_batch // ways("batch")
    h_t = m.hidden_dims / ways("mlp")
    n_t = m.num_heads / ways("heads")
    v_t = m.vocab_size / ways("vocab")
    nbytes = 2 if exp.train.fprop_dtype == "bfloat16" else 4
    c = lambda policy: _POLICY_SAVED[policy](d, m.hidden_dims)
    p = _pipeline(exp)
    if p is None:
        saved = m.num_layers * batch * s * d * c(m.remat_policy) * nbytes
    else:
        batch = (
            global_batch // exp.learner.num_microbatches // p.num_microbatches // (ways("batch") // mesh_shape["stage"])
        )
        chunk = m.num_layers // p.num_chunks
        token = batch * s * d * nbytes  # one microbatch's [rows, s, d] on a device
        if p.remat_stage:  # each iteration keeps its stage input (+ what the policy names in its layers) ...
            saved = p.num_iterations * token * (1 + chunk * (c(m.remat_policy) - 1))
            saved += chunk * token * c("none")  # ... and the backward recomputes one stage whole
        else:
            saved = p.num_iterations * chunk * token * c(m.remat_policy)
        saved += 2 * p.num_microbatches * token  # the microbatch buffer, in and out
    layer = batch * s * (6 * d + 2 * h_t) * nbytes
    if not flash_attention(exp):
        layer += batch * n_t * s * s * 4
    outside = global_batch // ways("batch")  # logits: the whole per-device batch, outside any pipeline
    if m.loss_chunk_size:
        logits = 2 * outside * min(s, m.loss_chunk_size) * v_t * 4 + v_t * d * 4
    else:
        logits = outside * s * v_t * 4
    return int(saved + layer + logits)
