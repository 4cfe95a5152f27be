"""Sharding constraints on activations, by the same logical names and rules as the weights.

    with jax.set_mesh(mesh), activation_rules(rules):       # the programs' jitted steps do this
        h = constrain(h, ("batch", "seq", "mlp"))           # [B, T, hidden]: B over data+fsdp, hidden over tensor

Why: without them GSPMD chooses the activations' layout from the weights alone, and under FSDP
(weights sharded on `embed` over fsdp, the batch over fsdp too) it may all-reduce whole-batch
[tokens, hidden] partial products instead of gathering the weights: every device then holds every
row's activations (XLA:CPU's compiled step, 8-way fsdp, width 512: 103.7 MiB a device instead of
the ~40 MiB the layout implies). MaxText (`nn.with_logical_constraint` with its activation_* names)
and Praxis (`activation_split_dims_mapping`) pin the batch dimension at the layer boundaries for
the same reason. The layers call `constrain` at their block boundaries, on the feed-forward's
hidden activations and on attention's queries, keys, values and context.

`constrain` is a no-op (returns `x` itself, binds nothing) unless a mesh with an axis of more than
one device is current and rules were given (`activation_rules`): a one-device run traces the same
program as before, and a user calling a layer outside the programs pays nothing.

A dimension named None is replicated (the residual stream's model dimension, as Megatron keeps it
whole on every tensor shard); a name whose mesh axes do not divide the dimension leaves it
replicated, as for weights (`rules.spec_for`). Inside the pipeline's stage loop the `stage` axis
belongs to the vmapped stage dimension (`axes_taken("stage")`), so the batch there is split over
data and fsdp only.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import jax
from jax.sharding import PartitionSpec

from pax_eqx.sharding.rules import parse_rules, spec_for

_RULES: contextvars.ContextVar[dict[str, tuple[str, ...]] | None] = contextvars.ContextVar("rules", default=None)
_TAKEN: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("taken", default=frozenset())


@contextlib.contextmanager
def activation_rules(rules: tuple[str, ...] = ()) -> Iterator[None]:
    """While tracing inside this block, `constrain` maps logical names by DEFAULT_RULES + `rules`
    (the run's `mesh.rules`) onto the current mesh."""
    token = _RULES.set(parse_rules(rules))
    try:
        yield
    finally:
        _RULES.reset(token)


@contextlib.contextmanager
def axes_taken(*axes: str) -> Iterator[None]:
    """Mesh axes `constrain` must leave alone inside this block: a vmapped dimension already
    spans them (the pipeline's stages over `stage`)."""
    token = _TAKEN.set(_TAKEN.get() | frozenset(axes))
    try:
        yield
    finally:
        _TAKEN.reset(token)


def activation_spec(names: tuple[str | None, ...], shape: tuple[int, ...]) -> PartitionSpec | None:
    """The PartitionSpec `constrain` gives an array of `shape` whose dimensions are `names`; None
    when nothing is to be constrained (no rules, no current mesh, or no axis over one device left)."""
    table = _RULES.get()
    mesh = jax.sharding.get_abstract_mesh()
    if table is None or mesh.empty:
        return None
    taken = _TAKEN.get()
    sizes = {axis: size for axis, size in mesh.shape.items() if axis not in taken and size > 1}
    if not sizes:
        return None
    if len(names) != len(shape):
        raise ValueError(f"constrain: {len(names)} logical names {names} for an array of shape {shape}.")
    return spec_for(names, shape, sizes, table)


def constrain(x: jax.Array, names: tuple[str | None, ...]) -> jax.Array:
    """`x` with its dimensions (logical `names`, one per dimension) sharded by the active rules
    over the current mesh; `x` unchanged where `activation_spec` is None."""
    spec = activation_spec(names, x.shape)
    return x if spec is None else jax.lax.with_sharding_constraint(x, spec)


def is_split(name: str) -> bool:
    """Whether the logical axis `name` is split over a mesh axis of more than one device by the
    active rules (False outside `activation_rules` or without a mesh): attention asks it of `seq`,
    since cuDNN's kernel cannot take a sequence split over a context axis."""
    table = _RULES.get()
    mesh = jax.sharding.get_abstract_mesh()
    if table is None or mesh.empty:
        return False
    taken = _TAKEN.get()
    return any(mesh.shape.get(axis, 1) > 1 and axis not in taken for axis in table.get(name, ()))
