"""Low-rank adapters as a pytree beside the model's own parameters (`LoraConfig`).

    targets = plan_targets(lora_cfg, abstract_params)          # {name: Target}, or a ConfigError
    params = LoraParams(base=model_params, adapters=init_adapters(targets, key))
    merged = params.merged(scale)                               # the model's params, W + s A @ B

A weight is a matrix when its dimensions, after the leading stack axes (`layers`: one adapter per
layer), split into an input side and an output side: a linear's `[in, out]`, an embedding's
`[vocab, embed]`, an attention projection's `w_q [embed, heads, head_dim]` (in: embed; out: heads x
head_dim) and `w_o [heads, head_dim, embed]` (in: heads x head_dim; out: embed). Its adapter keeps
those dimensions, so the sharding rules place it by the same logical names:

    A [*stack, *in, r]     axes (*stack, *in_axes, None)       initialised U(-1/sqrt(in), 1/sqrt(in))
    B [*stack, r, *out]    axes (*stack, None, *out_axes)      initialised to zero

(PEFT's initialisation: kaiming-uniform A, zero B), so W + s A @ B is W at step 0, bit for bit.

The forward merges: every chosen weight becomes W + s A @ B (in float32, the master dtype) and the
unchanged model computes with it. Any layer of any model family takes adapters this way, with no
change to the layer code, under every sharding and scan the model already has; autodiff gives A's
and B's gradients through the merge. The cost is a temporary of each chosen weight's size (the
merged weight, and its gradient in the backward): the benchmark `benchmarks/lora.py` measures it
against full fine-tuning.

A merged weight cannot drop out the adapter's input (PEFT's lora_dropout: x @ W + s dropout(x) @
A @ B). So a training forward with `lora.dropout` > 0 uses `with_dropout` instead: each chosen
weight becomes a `LowRankAdapted` (`layers/low_rank.py`: W, A, B and a key per stack index),
which `linears.dense` applies to its input; every other forward (eval, decode, export), and
training with dropout 0, merges as above, bit for bit what it did before dropout existed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, PRNGKeyArray

from pax_eqx.config import ConfigError
from pax_eqx.layers.low_rank import LowRankAdapted
from pax_eqx.learners.lora_config import LoraConfig
from pax_eqx.learners.variables import matches, param_names, path_name
from pax_eqx.sharding.logical import logical_axes

_STACK_AXES = ("layers", "stage")


@dataclass(frozen=True)
class Target:
    """One chosen weight: its shape, how many leading stack axes it has, and the input and output
    dimensions (counted after the stack axes) with their logical names."""

    name: str
    shape: tuple[int, ...]
    stack: int
    num_in: int
    axes: tuple[str | None, ...]

    @property
    def stack_shape(self) -> tuple[int, ...]:
        return self.shape[: self.stack]

    @property
    def in_shape(self) -> tuple[int, ...]:
        return self.shape[self.stack : self.stack + self.num_in]

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.shape[self.stack + self.num_in :]

    def a_shape(self, rank: int) -> tuple[int, ...]:
        return (*self.stack_shape, *self.in_shape, rank)

    def b_shape(self, rank: int) -> tuple[int, ...]:
        return (*self.stack_shape, rank, *self.out_shape)

    def a_axes(self) -> tuple[str | None, ...]:
        return (*self.axes[: self.stack + self.num_in], None)

    def b_axes(self) -> tuple[str | None, ...]:
        return (*self.axes[: self.stack], None, *self.axes[self.stack + self.num_in :])


class Adapter(eqx.Module):
    """A [*stack, *in, r] and B [*stack, r, *out] of one weight (see the module doc)."""

    a: Array
    b: Array
    a_axes: tuple[str | None, ...] = eqx.field(static=True)
    b_axes: tuple[str | None, ...] = eqx.field(static=True)

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {"a": self.a_axes, "b": self.b_axes}

    def delta(self, target: Target) -> Array:
        """A @ B contracted over the rank, in the weight's shape [*stack, *in, *out]."""
        stack, rank = target.stack_shape, self.a.shape[-1]
        a = self.a.reshape(*stack, math.prod(target.in_shape), rank)
        b = self.b.reshape(*stack, rank, math.prod(target.out_shape))
        return jnp.matmul(a, b).reshape(target.shape)

    def merged(self, w: Array, target: Target, scale: float) -> Array:
        """W + scale * A @ B, in W's dtype."""
        return w + (scale * self.delta(target)).astype(w.dtype)


class LoraParams(eqx.Module):
    """A LoRA run's parameters: the frozen base (the model's own params pytree) and the adapters,
    keyed by the name of the weight each adapts."""

    base: Any
    adapters: dict[str, Adapter]


def _matrix_split(axes: tuple[str | None, ...]) -> tuple[int, int] | None:
    """(leading stack axes, input dimensions) of a weight with these logical axes; None when it is
    no matrix (a vector, or more dimensions than one input and one output side)."""
    stack = 0
    while stack < len(axes) and axes[stack] in _STACK_AXES:
        stack += 1
    rest = axes[stack:]
    if len(rest) == 2:
        return stack, 1
    if len(rest) == 3 and rest[0] == "embed":
        return stack, 1  # a projection into heads: [embed, heads, head_dim]
    if len(rest) == 3 and rest[-1] == "embed":
        return stack, 2  # a projection out of heads: [heads, head_dim, embed]
    return None


def plan_targets(cfg: LoraConfig, abstract_params: Any) -> dict[str, Target]:
    """{name: Target} for the weights `cfg.targets` choose. A pattern that matches no parameter, or
    one that chooses a weight that is no matrix, is a ConfigError naming the pattern and the fix."""
    names = param_names(abstract_params)
    leaves = {path_name(p): leaf for p, leaf in jtu.tree_flatten_with_path(abstract_params)[0]}
    axes = {path_name(p): tuple(ax) for p, ax in jtu.tree_flatten_with_path(logical_axes(abstract_params))[0]}
    targets: dict[str, Target] = {}
    for pattern in cfg.targets:
        chosen = [n for n in names if matches(pattern, n)]
        if not chosen:
            shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            raise ConfigError(
                f"lora.targets: the pattern {pattern!r} matches no parameter (fully, with re.fullmatch); the model's "
                f"parameters are named like {shown}. Fix the pattern."
            )
        for name in chosen:
            split = _matrix_split(axes[name])
            if split is None:
                raise ConfigError(
                    f"lora.targets: the pattern {pattern!r} chooses {name}, shape {tuple(leaves[name].shape)} (axes "
                    f"{axes[name]}), which is not a matrix; LoRA adapts weight matrices. Narrow the pattern (e.g. "
                    "'stack\\.layers\\.attention\\.w_[qkvo]')."
                )
            stack, num_in = split
            targets[name] = Target(name, tuple(leaves[name].shape), stack, num_in, axes[name])
    _check_rank(cfg.rank, targets)
    return targets


def _check_rank(rank: int, targets: dict[str, Target]) -> None:
    """A @ B has rank at most min(fan in, fan out): a larger rank only adds parameters (and with
    alpha / rank, shrinks the update). Refused, naming the narrowest weight."""
    if not targets:
        return
    sides = {n: min(math.prod(t.in_shape), math.prod(t.out_shape)) for n, t in targets.items()}
    name = min(sides, key=sides.get)
    if rank > sides[name]:
        t = targets[name]
        raise ConfigError(
            f"lora.rank={rank} is larger than the smaller side of {name} (in {math.prod(t.in_shape)}, out "
            f"{math.prod(t.out_shape)}): A @ B cannot have a rank above {sides[name]}, so the extra width only adds "
            f"parameters. Pass --lora.rank {min(8, sides[name])} (at most {sides[name]})."
        )


def init_adapters(targets: dict[str, Target], rank: int, key: PRNGKeyArray) -> dict[str, Adapter]:
    """A uniform in +-1/sqrt(fan in) (PEFT's kaiming-uniform with a = sqrt(5)), B zero."""
    adapters = {}
    for i, (name, t) in enumerate(sorted(targets.items())):
        bound = 1.0 / math.sqrt(math.prod(t.in_shape))
        a = jax.random.uniform(jax.random.fold_in(key, i), t.a_shape(rank), jnp.float32, -bound, bound)
        b = jnp.zeros(t.b_shape(rank), jnp.float32)
        adapters[name] = Adapter(a, b, t.a_axes(), t.b_axes())
    return adapters


def merge(params: LoraParams, targets: dict[str, Target], scale: float) -> Any:
    """The base params with each adapted weight W replaced by W + scale * A @ B (W's dtype)."""

    def one(path: tuple, w: Any) -> Any:
        name = path_name(path)
        if name not in params.adapters:
            return w
        return params.adapters[name].merged(w, targets[name], scale)

    return jtu.tree_map_with_path(one, params.base)


def with_dropout(
    params: LoraParams, targets: dict[str, Target], scale: float, rate: float, key: PRNGKeyArray, merged: frozenset[str]
) -> Any:
    """The base params with each adapted weight W replaced by a LowRankAdapted(W, A, B, keys) that
    drops out its input with probability `rate` (those named in `merged`: W + scale * A @ B, as
    `merge`). Each weight's key is folded from `key` by its name's place in sorted order and split
    over its stack axes: keys [*stack, *key], one mask per layer of a scanned stack."""
    order = {name: i for i, name in enumerate(sorted(targets))}

    def one(path: tuple, w: Any) -> Any:
        name = path_name(path)
        if name not in params.adapters:
            return w
        adapter, target = params.adapters[name], targets[name]
        if name in merged:
            return adapter.merged(w, target, scale)
        weight_key = jax.random.fold_in(key, order[name])
        keys = jax.random.split(weight_key, math.prod(target.stack_shape))
        keys = keys.reshape(*target.stack_shape, *weight_key.shape)
        return LowRankAdapted(w, adapter.a, adapter.b, keys, scale, rate, target.num_in, name)

    return jtu.tree_map_with_path(one, params.base)
