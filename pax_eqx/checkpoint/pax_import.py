"""Read a Paxml checkpoint and map its Praxis variables onto a pax_eqx model's parameters.

    pax = read_checkpoint("pax_job/checkpoints")            # newest checkpoint_<step>/
    params = to_model_params(pax.params, abstract_params)   # or PaxImportError listing every problem
    opt_state = import_adam_state(opt_state, abstract_params, pax, step=pax.step, b1=0.9, b2=0.99)

What Paxml 1.4 writes (its default, `tensorstore_use_ocdbt=False`): `checkpoint_<step:08d>/state/`
holds one zarr array per leaf of its TrainState, named by the leaf's path joined with dots
(`mdl_vars.params.lm.softmax.logits_ffn.linear.w`, `opt_states_0.no_prefix_2.m.params.lm...`,
`step`), and `metadata/metadata` describes the tree. With OCDBT the same names are keys of one
OCDBT store in `state/`. Both are read here with tensorstore alone: no praxis or paxml import, and
no dependence on the orbax version that wrote them.

Praxis layouts and where they go (a TransformerLm under the Paxml LanguageModel's `lm`):

    softmax.logits_ffn.linear.w  [D, V]   embedding.w [V, D] (shared; transposed) or softmax.w
    softmax.logits_ffn.bias.b    [V]      embedding.b / softmax.b (model.softmax_bias)
    embedding_lookup.emb_var     [V, D]   embedding.emb_var (a separate embedding)
    position_emb.emb_var         [T, D]   position.emb_var
    final_ln.{scale,bias}                 final_norm.{scale,bias}
    per layer (x_layers_i of a StackedTransformer, or repeat.sub.x_layers_j of a
    StackedTransformerRepeated, whose every variable has a leading [x_times] axis; layer
    t * len(block) + j):
      layer_norm, post_layer_norm         attention_norm, attention_post_norm
      self_attention.{query,key,value}.w  [D, N, H]     attention.w_{q,k,v}
      self_attention.{query,key,value}.b  [N, H]        attention.b_{q,k,v}
      self_attention.combined_qkv.w       [3, D, N, H]  attention.w_qkv
      self_attention.combined_qkv.b       [3, N, H]     attention.b_q, b_k, b_v
      self_attention.post.w               [D, N, H]     attention.w_o [N, H, D] (transposed)
      self_attention.post.b               [D]           attention.b_o
      self_attention.per_dim_scale.per_dim_scale [H]    attention.per_dim_scale
      ff_layer.{layer_norm,post_layer_norm}             ff_norm, ff_post_norm
      ff_layer.ffn_layer1.{linear.w,bias.b}             ff_in.{linear.w,bias.b}
      ff_layer.ffn_layer1_gate.{linear.w,bias.b}        ff_in.{gate.w,gate_bias.b} (gated)
      ff_layer.ffn_layer2.{linear.w,bias.b}             ff_out.w, ff_out_bias.b

A pax_eqx scanned stack (`model.repeat=True`) gets the layers stacked on a leading axis, a list
stack (`repeat=False`) one layer each, whichever form Pax used. The mapping is by names and
shapes only: what a variable *means* (LayerNorm's 1 + scale, the softmax's sqrt(D) scaling of the
embedding, PerDimScale, the activation) is the experiment config's business, and the import test
compares logits to hold it to Pax's.

Any variable without a counterpart, any model parameter left without a value, and any shape
that differs are all reported together in one PaxImportError, so one run shows everything to fix.

Optimizer state: Praxis' Adam (sharded_adam) keeps bias-corrected moments m, v (its decays are
bias-corrected, Adafactor-style); optax's scale_by_adam keeps raw ones and corrects them when it
uses them, so `mu = m * (1 - b1^t)`, `nu = v * (1 - b2^t)` for Praxis' update count t.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax

from pax_eqx.checkpoint.errors import CheckpointFallbackWarning
from pax_eqx.config import ConfigError, MissingFileError

_STEP_DIR = re.compile(r"^checkpoint_(\d+)$")
_PARAMS = "mdl_vars.params."
# opt_states_<learner>.<no_prefix|p#..>_<k>.<m|v>.params.<var>, or opt_states_<learner>_<k>.<m|v>...
# (Praxis vectorises the optimizer states of repeated layers under a `p#<n>#i-1` prefix); with
# OCDBT the separators are dots (opt_states.0.2.m.params...).
_OPT = r"^opt_states[._]0[._](?:(?:no_prefix|p#[^.]*)[._])?(\d+)\."
_MOMENT = re.compile(_OPT + r"(m|v)\.params\.(.+)$")
_COUNT = re.compile(_OPT + r"count$")
_MAX_LISTED = 40


class PaxImportError(ConfigError):
    """The Paxml checkpoint does not fit the experiment's model (a user error: exit 2)."""


@dataclass(frozen=True)
class PaxCheckpoint:
    """What a Paxml checkpoint holds, as numpy arrays keyed by Praxis variable paths
    (`lm.transformer.x_layers_0.self_attention.query.w`)."""

    directory: Path
    step: int
    params: dict[str, np.ndarray]
    moments: dict[str, dict[str, np.ndarray]]
    """{"m": {path: array}, "v": {path: array}}: Praxis Adam's moments; empty without them."""
    adam_count: int | None
    """The update count of the transformation that holds the moments (Praxis' `count`)."""


# ------------------------------------------------------------------------------------ reading


def find_checkpoint(path: str | os.PathLike) -> Path:
    """The newest committed `checkpoint_<step>` directory under `path`: a Paxml job dir, its
    `checkpoints/`, or one `checkpoint_<step>/` itself. Directories orbax is still writing
    (`*.orbax-checkpoint-tmp-*`) never count."""
    path = Path(path)
    if not path.is_dir():
        raise MissingFileError(f"--pax-checkpoint {str(path)!r} is not a directory; give a Paxml job dir, its "
                               "checkpoints/ directory or one checkpoints/checkpoint_<step>/ directory.")  # fmt: skip
    if _STEP_DIR.match(path.name) and (path / "state").is_dir():
        return path  # asked for by name: read as it is (an empty one is refused by the read)
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    steps = sorted(
        (int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and (p / "state").is_dir()
    )
    if not steps:
        shown = ", ".join(sorted(p.name for p in root.iterdir())[:8]) or "nothing"
        raise MissingFileError(
            f"--pax-checkpoint {str(path)!r} holds no Paxml checkpoint (a checkpoint_<step>/ directory with a "
            f"state/ directory in {str(root)!r}; found: {shown}); give a Paxml job dir or its checkpoints/."
        )
    complete = [(step, p) for step, p in steps if _holds_arrays(p / "state")]
    if not complete:
        names = ", ".join(p.name for _, p in steps)
        raise PaxImportError(
            f"--pax-checkpoint {str(path)!r}: every checkpoint in it has an empty state/ directory ({names}; an "
            "interrupted write or copy?); copy the checkpoints again."
        )
    newest_step, newest = complete[-1]
    newer = [p.name for step, p in steps if step > newest_step]
    if newer:
        warnings.warn(
            f"{', '.join(newer)} in {root} {'has' if len(newer) == 1 else 'have'} an empty state/ directory (an "
            f"interrupted write or copy?); importing {newest.name}, the newest complete checkpoint.",
            CheckpointFallbackWarning,
            stacklevel=2,
        )
    return newest


def _holds_arrays(state: Path) -> bool:
    """Whether a Paxml `state/` directory holds any array (zarr directories or an OCDBT store)."""
    return (state / "manifest.ocdbt").exists() or any((p / ".zarray").exists() for p in state.iterdir())


def read_checkpoint(path: str | os.PathLike) -> PaxCheckpoint:
    """Reads the newest Paxml checkpoint under `path` (see `find_checkpoint`) into host memory."""
    directory = find_checkpoint(path)
    arrays = _read_state(directory / "state")
    params = {name[len(_PARAMS) :]: a for name, a in arrays.items() if name.startswith(_PARAMS)}
    if not params:
        raise PaxImportError(
            f"{directory}/state holds no model variables (no '{_PARAMS}*' arrays); is it a Paxml training checkpoint?"
        )
    step = int(arrays["step"]) if "step" in arrays else int(_STEP_DIR.match(directory.name).group(1))
    moments: dict[str, dict[str, np.ndarray]] = {"m": {}, "v": {}}
    holder = None
    for name, a in arrays.items():
        if m := _MOMENT.match(name):
            moments[m.group(2)][m.group(3)] = a
            holder = m.group(1)
    adam_count = None
    for name, a in arrays.items():
        if (m := _COUNT.match(name)) and m.group(1) == holder:
            adam_count = int(np.max(a))  # a vectorised (repeated-layer) count holds one per layer, all equal
    if set(moments["m"]) != set(params) or set(moments["v"]) != set(params):
        moments = {}
    return PaxCheckpoint(directory, step, params, moments, adam_count)


def _read_state(state: Path) -> dict[str, np.ndarray]:
    import tensorstore as ts

    if (state / "manifest.ocdbt").exists():
        base = {"driver": "ocdbt", "base": f"file://{state.absolute()}"}
        keys = ts.KvStore.open(base).result().list().result()
        names = sorted({k.decode().rsplit("/", 1)[0] for k in keys if k.decode().endswith("/.zarray")})
        specs = {name: {"driver": "zarr", "kvstore": {**base, "path": name}} for name in names}
    else:
        names = sorted(p.name for p in state.iterdir() if (p / ".zarray").exists())
        specs = {name: {"driver": "zarr", "kvstore": {"driver": "file", "path": str(state / name)}} for name in names}
    if not specs:
        raise PaxImportError(f"{state} holds no tensorstore arrays; is it a Paxml checkpoint's state/ directory?")
    out = {}
    for name, spec in specs.items():
        try:
            out[name] = _read_array(ts, spec)
        except PaxImportError as e:
            raise PaxImportError(f"{name!r} in {state}: {e}") from None
        except Exception as e:  # noqa: BLE001 -- a damaged array: say which, in one line
            raise PaxImportError(f"cannot read {name!r} in {state}: {type(e).__name__}: {e}") from None
    return out


def _read_array(ts: Any, spec: dict) -> np.ndarray:
    """One variable, refusing a chunk that is missing beside chunks that are there.

    tensorstore may leave out a chunk that equals the fill value (zero) when it writes, so an
    absent chunk can be zeros; but an interrupted copy leaves some of a variable's chunks behind,
    which a plain read would turn into zeros without a word. A variable with no chunk at all is
    read as its fill value (all zeros, as tensorstore writes one); one with some chunks but not
    all is damaged."""
    strict = ts.open({**spec, "fill_missing_data_reads": False}, open=True).result()
    try:
        return np.asarray(strict.read().result())
    except ValueError as e:
        if "NOT_FOUND" not in str(e):
            raise
        kvstore = ts.KvStore.open(spec["kvstore"]).result()
        chunks = [k for k in kvstore.list().result() if not k.decode().rsplit("/", 1)[-1].startswith(".")]
        if chunks:
            missing = str(e).split("NOT_FOUND: ", 1)[-1]
            raise PaxImportError(
                f"{missing}, while {len(chunks)} other chunk(s) of it are there: the checkpoint is incomplete "
                "(an interrupted copy?); copy it again, or import an earlier step"
            ) from None
        return np.asarray(ts.open(spec, open=True).result().read().result())


# ---------------------------------------------------------------------------------- mapping

Transform = Callable[[np.ndarray], np.ndarray]
_ident: Transform = lambda a: a

# Praxis per-layer variable (below x_layers_i) -> [(pax_eqx per-layer path, transform)].
_LAYER_RULES: dict[str, list[tuple[str, Transform]]] = {
    "layer_norm.scale": [("attention_norm.scale", _ident)],
    "layer_norm.bias": [("attention_norm.bias", _ident)],
    "post_layer_norm.scale": [("attention_post_norm.scale", _ident)],
    "post_layer_norm.bias": [("attention_post_norm.bias", _ident)],
    "self_attention.query.w": [("attention.w_q", _ident)],
    "self_attention.key.w": [("attention.w_k", _ident)],
    "self_attention.value.w": [("attention.w_v", _ident)],
    "self_attention.query.b": [("attention.b_q", _ident)],
    "self_attention.key.b": [("attention.b_k", _ident)],
    "self_attention.value.b": [("attention.b_v", _ident)],
    "self_attention.combined_qkv.w": [("attention.w_qkv", _ident)],
    "self_attention.combined_qkv.b": [
        ("attention.b_q", lambda a: a[0]),
        ("attention.b_k", lambda a: a[1]),
        ("attention.b_v", lambda a: a[2]),
    ],
    "self_attention.post.w": [("attention.w_o", lambda a: np.transpose(a, (1, 2, 0)))],
    "self_attention.post.b": [("attention.b_o", _ident)],
    "self_attention.per_dim_scale.per_dim_scale": [("attention.per_dim_scale", _ident)],
    "ff_layer.layer_norm.scale": [("ff_norm.scale", _ident)],
    "ff_layer.layer_norm.bias": [("ff_norm.bias", _ident)],
    "ff_layer.post_layer_norm.scale": [("ff_post_norm.scale", _ident)],
    "ff_layer.post_layer_norm.bias": [("ff_post_norm.bias", _ident)],
    "ff_layer.ffn_layer1.linear.w": [("ff_in.linear.w", _ident)],
    "ff_layer.ffn_layer1.bias.b": [("ff_in.bias.b", _ident)],
    "ff_layer.ffn_layer1_gate.linear.w": [("ff_in.gate.w", _ident)],
    "ff_layer.ffn_layer1_gate.bias.b": [("ff_in.gate_bias.b", _ident)],
    "ff_layer.ffn_layer2.linear.w": [("ff_out.w", _ident)],
    "ff_layer.ffn_layer2.bias.b": [("ff_out_bias.b", _ident)],
}
_LIST_LAYER = re.compile(r"^transformer\.x_layers_(\d+)\.(.+)$")
_REPEATED_LAYER = re.compile(r"^transformer\.repeat\.sub\.x_layers_(\d+)\.(.+)$")


def _global_rules(shared: bool) -> dict[str, list[tuple[str, Transform]]]:
    softmax = "embedding" if shared else "softmax"
    return {
        "softmax.logits_ffn.linear.w": [(f"{softmax}.w", (lambda a: a.T) if shared else _ident)],
        "softmax.logits_ffn.bias.b": [(f"{softmax}.b", _ident)],
        "embedding_lookup.emb_var": [("embedding.emb_var", _ident)],
        "position_emb.emb_var": [("position.emb_var", _ident)],
        "final_ln.scale": [("final_norm.scale", _ident)],
        "final_ln.bias": [("final_norm.bias", _ident)],
    }


def _path(keys: tuple) -> str:
    return jax.tree_util.keystr(keys)[1:]  # ".stack.layers[0].attention.w_q" -> "stack.layers[0]..."


def _shape(a: Any) -> tuple[int, ...]:
    return tuple(np.shape(a))


def to_model_params(pax_params: dict[str, np.ndarray], target: Any, *, what: str = "variable") -> Any:
    """`target`'s pytree (arrays or ShapeDtypeStructs: the model's parameters) filled from the
    Praxis variables `pax_params`, as numpy arrays in the target's dtypes.

    Raises PaxImportError listing every Praxis variable with no counterpart in the model, every
    model parameter no Praxis variable gives, and every shape that differs.
    `what` names the arrays in the message ("variable", "Adam moment m", ...).
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(target)
    paths = [_path(keys) for keys, _ in leaves]
    wanted = dict(zip(paths, (leaf for _, leaf in leaves), strict=True))
    shared = "embedding.w" in wanted and not any(p.startswith("softmax.") for p in wanted)
    repeated = any(p.startswith("stack.layers.") for p in wanted)
    globals_ = _global_rules(shared)
    names = {name.removeprefix("lm."): name for name in pax_params}  # the Paxml LanguageModel's child `lm`

    # Praxis variables -> candidates by pax_eqx path, each with the Praxis name it came from.
    candidates: dict[str, tuple[np.ndarray, frozenset[str]]] = {}
    unmapped: list[str] = []
    per_layer: dict[str, dict[int, tuple[np.ndarray, str]]] = {}
    block = len({m.group(1) for n in names if (m := _REPEATED_LAYER.match(n))}) or 1
    for name, full in sorted(names.items()):
        value = pax_params[full]
        if name in globals_:
            for target_path, fn in globals_[name]:
                candidates[target_path] = (fn(value), frozenset([full]))
            continue
        if m := _LIST_LAYER.match(name):
            layers = [(int(m.group(1)), value)]
        elif m := _REPEATED_LAYER.match(name):
            j = int(m.group(1))
            layers = [(t * block + j, value[t]) for t in range(value.shape[0])]
        else:
            unmapped.append(full)
            continue
        rules = _LAYER_RULES.get(m.group(2))
        if rules is None:
            unmapped.append(full)
            continue
        for i, layer_value in layers:
            for rel, fn in rules:
                per_layer.setdefault(rel, {})[i] = (fn(layer_value), full)
    for rel, by_layer in per_layer.items():
        if repeated:
            order = sorted(by_layer)
            if order == list(range(len(order))):
                stacked = np.stack([by_layer[i][0] for i in order])
                candidates[f"stack.layers.{rel}"] = (stacked, frozenset(source for _, source in by_layer.values()))
            else:
                unmapped += sorted({source for _, source in by_layer.values()})
        else:
            for i, (value, source) in by_layer.items():
                candidates[f"stack.layers[{i}].{rel}"] = (value, frozenset([source]))

    problems, used = [], set()
    out = []
    for path, leaf in wanted.items():
        if path not in candidates:
            problems.append(f"model parameter {path} {_shape(leaf)}: no Praxis {what} gives it")
            out.append(None)
            continue
        value, sources = candidates[path]
        used |= sources
        if _shape(value) != _shape(leaf):
            source = " + ".join(sorted(sources))
            problems.append(
                f"model parameter {path} {_shape(leaf)}: Praxis {what} {source} gives shape {_shape(value)}"
            )
            out.append(None)
            continue
        out.append(np.asarray(value, dtype=leaf.dtype))
    leftovers = sorted(set().union(*(sources for _, sources in candidates.values())) - used)
    problems += [f"Praxis {what} {name} {_shape(pax_params[name])}: no counterpart in the model" for name in unmapped]
    problems += [
        f"Praxis {what} {name} {_shape(pax_params[name])}: no counterpart in the model"
        for name in leftovers
        if name in pax_params
    ]
    if problems:
        shown = problems[:_MAX_LISTED]
        more = f"\n  ... and {len(problems) - len(shown)} more" if len(problems) > len(shown) else ""
        layers = _count_layers(pax_params)
        raise PaxImportError(
            f"the Paxml checkpoint does not fit the experiment's model ({len(problems)} problems; the checkpoint "
            f"has {layers} transformer layers):\n  " + "\n  ".join(shown) + more + "\nSet the experiment's model "
            "fields to the Pax model's (e.g. --model.num-layers, --model.model-dims, --model.hidden-dims, "
            "--model.num-heads, --model.vocab-size, --model.max-seq-len, --model.block.attention.combine-qkv, "
            "--model.block.attention.use-bias, --model.block.attention.per-dim-scale, --model.softmax-bias, "
            "--model.separate-embedding); docs/pax_to_pax_eqx.md, 'Migrating a Paxml run', lists them."
        )
    return jax.tree_util.tree_unflatten(treedef, out)


def _count_layers(pax_params: dict[str, np.ndarray]) -> int:
    """Transformer layers in the checkpoint: x_layers_i, or x_times per repeated block layer."""
    listed, repeated = set(), {}
    for full, value in pax_params.items():
        name = full.removeprefix("lm.")
        if m := _LIST_LAYER.match(name):
            listed.add(m.group(1))
        elif m := _REPEATED_LAYER.match(name):
            repeated[m.group(1)] = value.shape[0]
    return len(listed) + sum(repeated.values())


# ----------------------------------------------------------------------------- optimizer


def adam_moments(pax: PaxCheckpoint, abstract_params: Any, *, b1: float, b2: float) -> tuple[Any, Any, int] | None:
    """(mu, nu, count) for optax's scale_by_adam from Praxis Adam's moments, shaped as
    `abstract_params`; None when the checkpoint has no Adam moments for every variable.
    Raises PaxImportError when they do not fit the model (as `to_model_params`)."""
    if not pax.moments or pax.adam_count is None:
        return None
    t = pax.adam_count
    m = to_model_params(pax.moments["m"], abstract_params, what="Adam moment m")
    v = to_model_params(pax.moments["v"], abstract_params, what="Adam moment v")
    scale_m, scale_v = 1.0 - b1**t, 1.0 - b2**t
    mu = jax.tree.map(lambda a: (a * scale_m).astype(a.dtype), m)
    nu = jax.tree.map(lambda a: (a * scale_v).astype(a.dtype), v)
    return mu, nu, t


def with_adam_moments(opt_state: Any, mu: Any, nu: Any, count: int) -> tuple[Any, int]:
    """`opt_state` with each optax ScaleByAdamState's moments and count replaced; and how many
    were replaced (0: the learner has no Adam state, nothing changed)."""
    replaced = 0

    def swap(node):
        nonlocal replaced
        if isinstance(node, optax.ScaleByAdamState):
            replaced += 1
            like = lambda new, old: jax.tree.map(lambda n, o: np.asarray(n, dtype=o.dtype), new, old)
            return optax.ScaleByAdamState(
                count=np.asarray(count, dtype=node.count.dtype), mu=like(mu, node.mu), nu=like(nu, node.nu)
            )
        return node

    is_adam = lambda node: isinstance(node, optax.ScaleByAdamState)
    return jax.tree.map(swap, opt_state, is_leaf=is_adam), replaced


def with_schedule_count(opt_state: Any, step: int) -> Any:
    """`opt_state` with every learning-rate schedule's step counter set to `step`, so the rate
    continues from the imported step rather than from the schedule's start."""

    def swap(node):
        if isinstance(node, optax.ScaleByScheduleState):
            return optax.ScaleByScheduleState(count=np.asarray(step, dtype=node.count.dtype))
        return node

    return jax.tree.map(swap, opt_state, is_leaf=lambda n: isinstance(n, optax.ScaleByScheduleState))


def describe(pax: PaxCheckpoint) -> str:
    """One line: where, which step, how many variables and parameters, and whether Adam moments."""
    count = sum(math.prod(a.shape) for a in pax.params.values())
    moments = f"Adam moments at update {pax.adam_count}" if pax.moments else "no Adam moments"
    return f"{pax.directory} (step {pax.step}): {len(pax.params)} variables, {count:,} parameters, {moments}"
