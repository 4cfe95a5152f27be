"""A start point: a step-0 checkpoint without data positions, that a run fine-tunes from.

`import_hf` and `import_pax` write one: the imported parameters, wrapped in a TrainState of the
importing experiment's learner (its optimizer state fresh), and no data iterator state: nothing
was trained on any data yet. A run that trains from it is a fine-tuning run, not a resumed one:
it may choose its own learner and data (`--learner.*`, `--data.*`), so only the parameters (and
the model's non-trainable state) are read from the checkpoint and the optimizer state is built
afresh for the run's learner.

Reading the parameters alone matters for memory: the saved optimizer state of an Adam learner is
twice the parameters, and the learner that wrote it may not even be the run's. Orbax restores a
subset of a saved tree when the other leaves are `ocp.PLACEHOLDER`; the manifest's shapes and
checksums are checked for the leaves read, as a full restore checks all of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from pax_eqx.checkpoint.errors import CheckpointCorruptError, CheckpointMismatchError, listed
from pax_eqx.checkpoint.integrity import (
    checksum_mismatches,
    leaf_path,
    manifest_problems,
    structure_mismatches,
)

_STATE, _MANIFEST = "state", "manifest"  # the step directory's items (checkpointer.py)
_READ = ("params", "nt_state")  # the TrainState fields a start point gives the run


def start_point_manifest(directory: Path, committed_steps: list[int]) -> dict[str, Any] | None:
    """The manifest of DIR's only checkpoint when it is a start point (step 0, no data state),
    else None: a run with later steps, or data positions, resumes as usual."""
    if committed_steps != [0]:
        return None
    manifest = _reader().restore(directory / "0", args=ocp.args.Composite(**{_MANIFEST: ocp.args.JsonRestore()}))[
        _MANIFEST
    ]
    if manifest_problems(manifest, 0) or manifest.get("has_data"):
        return None
    return manifest


def restore_start_point(directory: Path, manifest: dict[str, Any], abstract: Any, step: int = 0) -> dict[str, Any]:
    """{"params": ..., "nt_state": ...} of DIR's step-0 checkpoint (or `step`'s, whose `manifest`
    it is: a LoRA run's base), read into `abstract`'s fields of the same names (ShapeDtypeStructs
    with shardings: a TrainState of the run's own experiment, whose optimizer state is not read)."""
    wanted = {name: getattr(abstract, name) for name in _READ}
    saved = {leaf["path"]: leaf for leaf in manifest["leaves"]}
    ours = {"leaves": [leaf for path, leaf in saved.items() if path.split("/")[0] in _READ]}
    problems = structure_mismatches(ours, wanted)
    path = directory / str(step)
    if problems:
        raise CheckpointMismatchError(
            f"checkpoint {path} does not hold this model's parameters ({len(problems)} differences):"
            f"{listed(problems)}\nThe model's fields must be the imported ones (DIR/config.json's `model`)."
        )
    target = _saved_tree_with(path / _STATE, wanted)
    restore_args = jax.tree.map(
        lambda x: x if x is ocp.PLACEHOLDER else ocp.ArrayRestoreArgs(sharding=x.sharding, dtype=x.dtype),
        target,
        is_leaf=lambda x: x is ocp.PLACEHOLDER,
    )
    restored = _reader().restore(
        path, args=ocp.args.Composite(**{_STATE: ocp.args.PyTreeRestore(target, restore_args=restore_args)})
    )[_STATE]
    read = {path: leaf for path, leaf in _flat(restored) if path.split("/")[0] in _READ}
    flat, treedef = jax.tree_util.tree_flatten_with_path(wanted)
    result = jax.tree_util.tree_unflatten(treedef, [read[leaf_path(p)] for p, _ in flat])
    damaged = checksum_mismatches(manifest, result)
    if damaged:
        raise CheckpointCorruptError(
            f"checkpoint {path}: {len(damaged)} restored arrays differ from the checksums written at save time: "
            f"{damaged[:5]}"
        )
    return result


def _saved_tree_with(item_dir: Path, wanted: dict[str, Any]) -> Any:
    """The saved state's tree with `wanted`'s leaf at each of its paths and a placeholder (not
    read) at every other array."""
    metadata = ocp.StandardCheckpointer().metadata(item_dir).item_metadata
    ours = dict(_flat(wanted))
    flat, treedef = jax.tree_util.tree_flatten_with_path(metadata, is_leaf=lambda x: x is None)
    leaves = [None if leaf is None else ours.get(leaf_path(p), ocp.PLACEHOLDER) for p, leaf in flat]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _flat(tree: Any) -> list[tuple[str, Any]]:
    leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is ocp.PLACEHOLDER)[0]
    return [(leaf_path(p), leaf) for p, leaf in leaves]


def _reader() -> ocp.Checkpointer:
    return ocp.Checkpointer(ocp.CompositeCheckpointHandler())
