"""Logical axis names of a model's weights: the vocabulary the sharding rules map to the mesh.

Every layer with weights says, in `param_axes()`, the logical name of each dimension of each
array field (`Linear.w: ("embed", "mlp")`). A stack built by `filter_vmap` declares
`stacked_field`, and everything below that field gains a leading "layers" axis. This walker
turns a model (or its `eval_shape`) into a pytree of the same structure whose leaves are
`LogicalAxes` tuples, and refuses arrays that nobody named -- an unnamed weight would
silently be replicated, which at scale is an out-of-memory error much later.

The vocabulary (see docs/sharding.md): batch, seq, kv_seq (attention's keys along the sequence),
embed, mlp, heads, kv_heads, kv (per-head dims), vocab, layers; `None` for a dimension never sharded.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.tree_util as jtu


class LogicalAxes(tuple):
    """A tuple of logical axis names; a tuple subclass so pytree functions treat it as a leaf."""


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, jax.ShapeDtypeStruct))


def logical_axes(model: Any) -> Any:
    """Same structure as `model`; each array leaf replaced by its LogicalAxes."""
    leaves, treedef = jtu.tree_flatten_with_path(model)
    return jtu.tree_unflatten(treedef, [_axes_of(model, path, leaf) for path, leaf in leaves])


def _axes_of(model: Any, path: tuple, leaf: Any) -> Any:
    if not _is_array(leaf):
        return leaf
    node, stacked, owner, name = model, 0, None, None
    for entry in path:
        if isinstance(entry, jtu.GetAttrKey):
            if isinstance(node, eqx.Module):
                owner, name = node, entry.name
                if getattr(node, "stacked_field", None) == entry.name:
                    stacked += 1
            node = getattr(node, entry.name)
        elif isinstance(entry, jtu.SequenceKey):
            node = node[entry.idx]
        elif isinstance(entry, jtu.DictKey):
            node = node[entry.key]
        else:
            node = None
    table = owner.param_axes() if hasattr(owner, "param_axes") else {}
    if name not in table:
        raise ValueError(
            f"weight {jtu.keystr(path)} ({type(owner).__name__}.{name}) has no logical axis names: "
            f"add it to {type(owner).__name__}.param_axes()."
        )
    axes = ("layers",) * stacked + tuple(table[name])
    if len(axes) != leaf.ndim:
        raise ValueError(f"weight {jtu.keystr(path)} has shape {leaf.shape} but logical axes {axes}.")
    return LogicalAxes(axes)
