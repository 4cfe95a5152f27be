"""The layer mechanism: what Pax hides in Flax collections, passed in the open.

A pax_eqx layer is an `equinox.Module`: trainable parameters are its array fields (Pax's
`self.theta.w` is `self.w`), children are module fields, hyperparameters are static fields.
A stateless deterministic layer is a plain function of its input, `y = layer(x)`.

A layer that needs anything more -- randomness, non-trainable variables, summaries, aux
losses, or the train/eval mode -- takes and returns a `Context`:

    y, ctx = layer(x, ctx)

`Context` is an immutable pytree holding

- `key`: a PRNG key, split only when a layer asks for one (`ctx.next_key()`), so
  deterministic layers never pay for splitting (equinox#1132);
- `state`: an `equinox.nn.State` with the non-trainable variables (made by `variable(init,
  mean_sync=...)`, an equinox `StateIndex`; mean_sync is Pax's `REQUIRES_MEAN_SYNC`);
- `summaries` and `aux_losses`: dicts of side outputs, named by scope (`"layer_0/attn/..."`);
- `mode`: `Mode.TRAIN`, `Mode.EVAL` or `Mode.DECODE`, static, so each mode traces its own
  program and no global flag exists;
- `dtype`: the activation (compute) dtype a model casts its inputs to (None: as they come);
  parameters stay float32 and each layer casts them to its input's dtype where it uses them;
- `summary_verbosity`: Pax's summary verbosity. `add_summary(..., verbosity=v)` records only
  when `v <= summary_verbosity`; a layer whose summary costs compute (an activation RMS, the
  attention logits' max) asks `ctx.records(v)` first, so with the default nothing is traced.

`init(cfg, key)` and `apply(layer, ...)` are the `layer.init` / `layer.apply(mutable=True)`
entry points of the Layer Basics notebook.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, PRNGKeyArray


class Mode(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"
    DECODE = "decode"


Variable = eqx.nn.StateIndex
"""The type of a non-trainable variable field: equinox's own StateIndex."""

_MEAN_SYNC = "#mean_sync"

DEFAULT_SUMMARY_VERBOSITY = 3
"""Pax's default: summaries added with verbosity <= 3 are kept."""

LAYER_STATISTICS_VERBOSITY = DEFAULT_SUMMARY_VERBOSITY + 1
"""The layers' own statistics (activation RMS, attention logit max): off by default, on with
`train.layer_summaries`."""


class _MeanSyncMarker:
    """Marks a fresh StateIndex as mean-synced until `split_state` gives it a path marker."""


def variable(init: Array, *, mean_sync: bool = False) -> Variable:
    """A non-trainable variable (Pax: `create_variable(..., trainable=False)`).

    `mean_sync=True` is Pax's `WeightHParamsCollection.REQUIRES_MEAN_SYNC`: the value is a
    statistic of the batch, so wherever one logical step is computed in pieces (gradient
    accumulation over microbatches) the pieces' new values are averaged rather than the last
    one winning. Under SPMD `jit` a batch mean is already global, so nothing else is needed.
    The flag rides on equinox's marker (`"<path>#mean_sync"`), because `eqx.nn.State` only
    accepts plain StateIndex keys.
    """
    index = eqx.nn.StateIndex(init)
    if mean_sync:
        object.__setattr__(index, "marker", _MeanSyncMarker())
    return index


class Context(eqx.Module):
    """Everything a layer call may read or write besides its input; see the module docstring."""

    key: PRNGKeyArray | None
    state: eqx.nn.State | None
    summaries: dict[str, Array]
    aux_losses: dict[str, Array]
    mode: Mode = eqx.field(static=True)
    scope: tuple[str, ...] = eqx.field(static=True)
    dtype: Any = eqx.field(static=True)
    summary_verbosity: int = eqx.field(static=True)

    def __init__(
        self,
        *,
        key: PRNGKeyArray | None = None,
        state: eqx.nn.State | None = None,
        mode: Mode = Mode.TRAIN,
        summaries: dict[str, Array] | None = None,
        aux_losses: dict[str, Array] | None = None,
        scope: tuple[str, ...] = (),
        dtype: Any = None,
        summary_verbosity: int = DEFAULT_SUMMARY_VERBOSITY,
    ):
        self.key = key
        self.state = state
        self.mode = Mode(mode)
        self.summaries = {} if summaries is None else summaries
        self.aux_losses = {} if aux_losses is None else aux_losses
        self.scope = scope
        self.dtype = None if dtype is None else jnp.dtype(dtype)
        self.summary_verbosity = summary_verbosity

    @property
    def is_training(self) -> bool:
        return self.mode is Mode.TRAIN

    # Randomness ---------------------------------------------------------------------------
    def next_key(self) -> tuple[PRNGKeyArray, Context]:
        """A fresh key, and the context that must be used from now on (Pax: next_prng_key)."""
        if self.key is None:
            raise ValueError(
                f"layer {self._where()} needs randomness in mode {self.mode.value!r}, but the "
                "Context has no key: pass `key=` to Context(...)/apply(...), or use mode=EVAL."
            )
        key, sub = jax.random.split(self.key)
        return sub, self._replace(key=key)

    # Non-trainable variables --------------------------------------------------------------
    def get_var(self, var: Variable) -> Array:
        return self._state(var).get(var)

    def update_var(self, var: Variable, value: Array) -> Context:
        # `State.set` invalidates the State it is called on (equinox's guard against a dropped
        # result), but that object may still be held by the caller -- e.g. the `state` passed to
        # `apply`, used again for a second call. Setting on a copy keeps every Context immutable.
        return self._replace(state=copy_state(self._state(var)).set(var, value))

    def _state(self, var: Variable) -> eqx.nn.State:
        if self.state is None:
            raise ValueError(
                f"layer {self._where()} has a non-trainable variable but the Context has no "
                "state: build the model with `pax_eqx.layers.init(cfg, key)` and pass its "
                "state to Context(state=...)."
            )
        return self.state

    # Side outputs -------------------------------------------------------------------------
    def records(self, verbosity: int) -> bool:
        """Whether a summary of this verbosity is kept (check before computing a costly one)."""
        return verbosity <= self.summary_verbosity

    def add_summary(self, name: str, value: Array, verbosity: int = DEFAULT_SUMMARY_VERBOSITY) -> Context:
        """Records `value` (a scalar, or one per layer in a scanned stack) under this scope
        (Pax: add_summary). Dropped when `verbosity` is above the context's summary_verbosity."""
        if not self.records(verbosity):
            return self
        return self._replace(summaries=_add_unique(self.summaries, self._name(name), value))

    def add_aux_loss(self, name: str, value: Array, weight: float = 1.0) -> Context:
        """Adds `weight * value` to the losses the task adds to its training loss."""
        value = jnp.asarray(value, jnp.float32) * weight
        full = self._name(name)
        aux = dict(self.aux_losses)
        aux[full] = aux[full] + value if full in aux else value
        return self._replace(aux_losses=aux)

    # Scopes name side outputs the way Pax's layer paths do ----------------------------------
    def push(self, name: str) -> Context:
        return self._replace(scope=self.scope + (name,))

    def pop(self) -> Context:
        return self._replace(scope=self.scope[:-1])

    def _name(self, name: str) -> str:
        return "/".join(self.scope + (name,))

    def _where(self) -> str:
        return "/".join(self.scope) or "<top>"

    def _replace(self, **changes: Any) -> Context:
        fields = dict(
            key=self.key,
            state=self.state,
            mode=self.mode,
            summaries=self.summaries,
            aux_losses=self.aux_losses,
            scope=self.scope,
            dtype=self.dtype,
            summary_verbosity=self.summary_verbosity,
        )
        fields.update(changes)
        return Context(**fields)


def copy_state(state: eqx.nn.State) -> eqx.nn.State:
    """A new State object holding the same arrays (no data is copied), so that equinox's
    `set`/`update`, which invalidate the object they are called on, leave `state` usable."""
    return jtu.tree_map(lambda a: a, state)


def _add_unique(d: dict[str, Array], name: str, value: Array) -> dict[str, Array]:
    if name in d:
        raise ValueError(f"summary {name!r} was added twice; give the second one another name.")
    return {**d, name: value}


def call(layer: Callable, x: Any, ctx: Context, scope: str, **kwargs: Any) -> tuple[Any, Context]:
    """Calls a context-taking child under the name `scope` (Pax's child layer name)."""
    y, ctx = layer(x, ctx.push(scope), **kwargs)
    return y, ctx.pop()


def init(cfg: Any, key: PRNGKeyArray) -> tuple[Any, eqx.nn.State]:
    """Builds `cfg` (a config with `.build(key)`) and its non-trainable state.

    Pax: `layer.init(rngs, inputs)`. Variable markers are replaced by their path in the
    model, so two builds of the same config give identical tree structures and states that
    can be swapped (e.g. a restored checkpoint's state into a freshly built model).
    """
    model = cfg.build(key)
    return split_state(model)


def split_state(model: Any) -> tuple[Any, eqx.nn.State]:
    """Gives every Variable a deterministic marker, then separates the initial state."""

    def is_var(x: Any) -> bool:
        return isinstance(x, eqx.nn.StateIndex)

    leaves, treedef = jtu.tree_flatten_with_path(model, is_leaf=is_var)
    renamed = []
    for path, leaf in leaves:
        if is_var(leaf) and not isinstance(leaf.marker, str):
            suffix = _MEAN_SYNC if isinstance(leaf.marker, _MeanSyncMarker) else ""
            object.__setattr__(leaf, "marker", type(model).__name__ + jtu.keystr(path) + suffix)
        renamed.append(leaf)
    model = jtu.tree_unflatten(treedef, renamed)
    state = eqx.nn.State(model)
    return eqx.nn.delete_init_state(model), state


def mean_sync_markers(model: Any) -> frozenset[str]:
    """Markers of the model's Variables that carry `mean_sync=True`."""
    leaves = jtu.tree_leaves(model, is_leaf=lambda x: isinstance(x, eqx.nn.StateIndex))
    return frozenset(
        v.marker for v in leaves if isinstance(v, eqx.nn.StateIndex) and str(v.marker).endswith(_MEAN_SYNC)
    )


def apply(
    layer: Callable,
    *args: Any,
    state: eqx.nn.State | None = None,
    key: PRNGKeyArray | None = None,
    mode: Mode = Mode.TRAIN,
    mutable: bool = False,
    **kwargs: Any,
) -> Any:
    """Runs a context-taking layer once (Pax: `layer.apply(vars, x, rngs=..., mutable=...)`).

    Returns the output, or with `mutable=True` the pair (output, context) whose `state`,
    `summaries` and `aux_losses` are the updated collections.
    """
    ctx = Context(key=key, state=state, mode=mode)
    out, ctx = layer(*args, ctx, **kwargs)
    return (out, ctx) if mutable else out
