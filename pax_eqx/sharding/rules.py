"""Logical axis names -> mesh axes -> NamedSharding, for parameters, optimizer state and batches.

The default rules give FSDP + Megatron-style tensor parallelism, and reduce to pure data
parallelism on a (N, 1, 1) mesh:

    batch    -> (data, fsdp, stage)   every data-like axis splits the batch; outside the pipeline
                               each stage group has its own rows (Pax's batch_dims = (stage,
                               replica, data)), inside it every stage sees every microbatch:
                               stage innermost makes that entry an all-gather over stage
    embed    -> fsdp           weights are sharded along the model dimension (ZeRO-3 style)
    mlp, heads, kv_heads, vocab -> tensor   column/row parallel attention and MLP
    kv       -> replicated
    seq      -> context        context parallelism: each context shard holds a slice of every row's
                               tokens (the residual stream, the feed-forward, the queries); the
                               `context` axis is 1 unless a 5-entry mesh shape sets it, and then
                               nothing maps to it (docs/long_context.md)
    kv_seq   -> replicated     attention's keys and values along the sequence: whole on every
                               context shard, so each query slice attends to every key (the K/V
                               are all-gathered over `context`, MaxText's default strategy)
    layers   -> stage          a stack's leading layer axis: each pipeline stage holds its own
                               contiguous layers (GPipe); on a mesh without a stage axis (size 1)
                               the layers are replicated, as before
    conv_out -> fsdp, conv_in -> replicated   a convolution's HWIO kernel, like embed x mlp
                                              (the spatial dims are never sharded)
    expert   -> fsdp           the experts of an MoE layer (expert parallelism over an existing
                               axis: Pax's v1 rules put w_emh on its "data" axis, which is our
                               fsdp; the tokens, sharded by batch over data+fsdp, reach their
                               experts by all-to-all over fsdp). An expert weight [expert, embed,
                               mlp] is then [fsdp, -, tensor]: fsdp is taken by the experts, so
                               embed stays whole, exactly Pax's [data, None, mdl].

A dimension whose size is not divisible by its mesh axes is left replicated rather than
failing (e.g. 4 kv heads on an 8-way tensor axis); the dry-run planner reports these.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

import equinox as eqx
import jax
import jax.tree_util as jtu
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pax_eqx.config import ConfigError
from pax_eqx.sharding.logical import LogicalAxes, logical_axes
from pax_eqx.sharding.mesh import AXES

DEFAULT_RULES: tuple[str, ...] = (
    "batch=data+fsdp+stage",
    "embed=fsdp",
    "mlp=tensor",
    "heads=tensor",
    "kv_heads=tensor",
    "vocab=tensor",
    "kv=",
    "layers=stage",
    "seq=context",
    "kv_seq=",
    "conv_in=",
    "conv_out=fsdp",
    "expert=fsdp",
)


# Logical names only activations have (no weight dimension is named so): the batch, the tokens
# of a row, and attention's keys and values along the sequence.
ACTIVATION_NAMES = ("batch", "seq", "kv_seq")


def parse_rules(rules: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """ "name=a+b" strings (DEFAULT_RULES first, then `rules`) -> {name: (a, b)}."""
    table: dict[str, tuple[str, ...]] = {}
    for rule in DEFAULT_RULES + tuple(rules):
        name, sep, axes = rule.partition("=")
        if not sep or not name:
            raise ConfigError(f"mesh.rules entry {rule!r} must look like 'embed=fsdp' or 'kv=' (replicated).")
        table[name.strip()] = tuple(a.strip() for a in axes.split("+") if a.strip())
    for name, axes in table.items():
        bad = [a for a in axes if a not in AXES]
        if bad:
            raise ConfigError(f"mesh.rules maps {name!r} to unknown mesh axes {bad}; use {', '.join(AXES)}.")
    return table


def check_rule_names(rules: tuple[str, ...], model_axes: Any) -> None:
    """A rule must name a logical axis that something has: a weight of this model (`model_axes`,
    the `logical_axes` tree) or an activation (`ACTIVATION_NAMES`). Otherwise it would be accepted
    and change nothing (`embd=tensor`): a ConfigError naming the rule and the known names."""
    used = {name for ax in jtu.tree_leaves(model_axes, is_leaf=lambda x: isinstance(x, LogicalAxes))
            if isinstance(ax, LogicalAxes) for name in ax if name}  # fmt: skip
    known = used | set(ACTIVATION_NAMES)
    for rule in rules:
        name = rule.partition("=")[0].strip()
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"mesh.rules entry {rule!r} names the logical axis {name!r}, which no weight of this model has (and no "
                f"activation), so it would change nothing.{hint} This model's axes: {', '.join(sorted(known))}."
            )


def spec_for(axes: tuple, shape: tuple[int, ...], mesh_shape: dict[str, int], table: dict) -> PartitionSpec:
    """PartitionSpec for one array; a mesh axis is used at most once, divisibility is checked."""
    used: set[str] = set()
    out = []
    for name, size in zip(axes, shape):
        mesh_axes = tuple(a for a in table.get(name, ()) if a not in used and mesh_shape.get(a, 1) > 1)
        if name is None or not mesh_axes or size % math.prod(mesh_shape[a] for a in mesh_axes):
            out.append(None)
            continue
        used.update(mesh_axes)
        out.append(mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
    return PartitionSpec(*out)


def param_shardings(model: Any, mesh: Mesh, rules: tuple[str, ...] = ()) -> Any:
    """A pytree like `model` (arrays or ShapeDtypeStructs) with a NamedSharding per array."""
    table = parse_rules(rules)
    mesh_shape = dict(mesh.shape)
    axes = logical_axes(model)
    check_rule_names(rules, axes)

    def one(leaf, ax):
        if not isinstance(ax, LogicalAxes):
            return None
        return NamedSharding(mesh, spec_for(tuple(ax), leaf.shape, mesh_shape, table))

    return jtu.tree_map(one, model, axes, is_leaf=lambda x: x is None)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh, rules: tuple[str, ...] = (), ndim: int = 2, seq_len: int = 0) -> NamedSharding:
    """Batch-leading arrays: the batch dimension over the rules' `batch` axes; a 2-D array's
    second dimension, when `seq_len` (its length) is given, over the rules' `seq` axes where they
    divide it.

    Why the second: the inputs of a sequence model are [batch, seq] (ids, labels, weights,
    segment ids and positions), and under context parallelism (`seq=context`) each device then
    receives only its slice of every row's tokens: the model's first constraint (the embedding
    lookup's [batch, seq, embed]) finds them where it wants them. Other ranks (an image
    [batch, h, w, c], a label [batch]) keep their dimensions after the first whole."""
    table, sizes = parse_rules(rules), dict(mesh.shape)
    lead = tuple(a for a in table["batch"] if sizes[a] > 1)  # its divisibility is checked before the run
    seq = tuple(a for a in table["seq"] if sizes[a] > 1 and a not in lead)
    split_seq = ndim == 2 and seq_len > 0 and seq and seq_len % math.prod(sizes[a] for a in seq) == 0
    entries = [_entry(lead), _entry(seq) if split_seq else None][:ndim]
    return NamedSharding(mesh, PartitionSpec(*entries, *([None] * (ndim - len(entries)))))


def _entry(axes: tuple[str, ...]) -> str | tuple[str, ...] | None:
    """A PartitionSpec entry: None for no axes, the name for one, the tuple for several."""
    return None if not axes else axes[0] if len(axes) == 1 else axes


def opt_state_shardings(
    optimizer: optax.GradientTransformation,
    abstract_opt_state: Any,
    abstract_params: Any,
    p_shardings: Any,
    mesh: Mesh,
) -> Any:
    """The optimizer state's shardings, from the parameters' (`p_shardings`, for
    `abstract_params`).

    A leaf in a parameter's place takes that parameter's sharding when it has the parameter's
    shape (Adam's moments), and the parameter's spec without the dropped dimension when its
    shape is the parameter's with one dimension left out (Adafactor's factored row and column
    statistics); any other shape (Adafactor's (1,) placeholders) replicates, as do leaves outside
    the parameters' places (step counts). A per-variable group's state
    (`learner.variable_groups`) holds optax's MaskedNode in the other groups' places, and the
    frozen parameters' places are None: both stay as they are."""
    rep = replicated(mesh)

    def in_param_place(value: Any, param: Any, sharding: Any) -> Any:
        if value is None or isinstance(value, optax.MaskedNode) or not hasattr(value, "shape"):
            return value
        return _statistic_sharding(tuple(value.shape), tuple(param.shape), sharding, rep)

    return optax.tree_map_params(
        optimizer,
        in_param_place,
        abstract_opt_state,
        abstract_params,
        p_shardings,
        transform_non_params=lambda leaf: rep if eqx.is_array_like(leaf) or hasattr(leaf, "shape") else leaf,
        is_leaf=lambda x: x is None or isinstance(x, optax.MaskedNode),
    )


def _statistic_sharding(
    shape: tuple[int, ...], param_shape: tuple[int, ...], param_sharding: Any, rep: NamedSharding
) -> Any:
    """The sharding of an optimizer statistic of `shape` kept for a parameter of `param_shape`."""
    if shape == param_shape:
        return param_sharding
    if isinstance(param_sharding, NamedSharding) and len(shape) == len(param_shape) - 1:
        spec = tuple(param_sharding.spec) + (None,) * (len(param_shape) - len(param_sharding.spec))
        for drop in range(len(param_shape)):
            if param_shape[:drop] + param_shape[drop + 1 :] == shape:
                return NamedSharding(param_sharding.mesh, PartitionSpec(*spec[:drop], *spec[drop + 1 :]))
    return rep


def with_sharding(abstract: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs carrying shardings (restore targets, jit out_shardings)."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
