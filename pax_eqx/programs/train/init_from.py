"""Partial initialisation from other checkpoints (Pax's `init_from_checkpoint_rules`).

A run that starts from scratch with `checkpoint.init_from_checkpoint_rules` copies some of its
parameters from other job dirs' checkpoints, by name (`pax_eqx.learners.variables`):

    InitFromCheckpointConfig(job_dir="runs/pretrained", rules=(
        (r"stack\\.layers\\.(\\d+)\\.(.*)", "stack.layers.{0}.{1}"),   # our regex -> source name
        (r"embedding\\.w", "embedding.w"),
    ))

Each of our parameters takes the first rule whose regex matches its name whole; the source
name is the rule's format string filled with the regex's groups (Pax's load_rules). Everything
else keeps its fresh initialisation, and so does the optimizer state (moments start at zero, the
step at 0), as in Pax.

The source is a pax_eqx job dir: its config.json says what its model (and learner) are, so its
newest checkpoint is restored read-only onto that abstract state, on this run's mesh, and the
named arrays are taken from it. An imported Paxml checkpoint is such a job dir
(`python -m pax_eqx.import_pax`). A rule that names none of our parameters, a source name the
source does not have, or a shape that differs is a ConfigError naming the rule, before any
step is trained.

The whole source state is read (its optimizer state too): orbax restores the pytree it was given.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.tree_util as jtu

from pax_eqx.checkpoint import Checkpointer
from pax_eqx.checkpoint.config import InitFromCheckpointConfig
from pax_eqx.config import ConfigError, field_names
from pax_eqx.learners.variables import path_name
from pax_eqx.programs.compiled import Programs

_WHERE = "checkpoint.init_from_checkpoint_rules"


def plan(source: InitFromCheckpointConfig, our_names: list[str]) -> dict[str, str]:
    """{our parameter name: source parameter name} for the names the rules choose; a rule that
    chooses none of ours is a ConfigError naming it."""
    chosen: dict[str, str] = {}
    used = [False] * len(source.rules)
    for name in our_names:
        for i, (pattern, fmt) in enumerate(source.rules):
            m = re.fullmatch(pattern, name)
            if m:
                try:
                    chosen[name] = fmt.format(*m.groups(), **m.groupdict())
                except (IndexError, KeyError) as e:
                    raise ConfigError(
                        f"{_WHERE}: rule {(pattern, fmt)!r}: the source name format refers to a group {e} the regex "
                        "does not have; use {0}, {1}, ... for the regex's groups."
                    ) from None
                used[i] = True
                break
    for rule, hit in zip(source.rules, used, strict=True):
        if not hit:
            shown = ", ".join(our_names[:6]) + (", ..." if len(our_names) > 6 else "")
            raise ConfigError(
                f"{_WHERE}: the rule {tuple(rule)!r} for {source.job_dir!r} matches none of this model's parameters "
                f"(the regex must match a whole name; they are named like {shown}). Fix or remove the rule."
            )
    return chosen


def _source_params(
    source: InitFromCheckpointConfig, mesh: Any, model_type: type | None = None
) -> tuple[dict[str, jax.Array], int]:
    """The source job dir's newest (or `source.step`) checkpoint's parameters by name, and its step.
    `model_type`: our model's config class, used for the source's model when its fields are the
    same (config.json does not name the class; several imported subclasses may fit it)."""
    from pax_eqx.experiment import ExperimentConfig
    from pax_eqx.programs.runtime import build_task

    job_dir = Path(source.job_dir)
    config_file = job_dir / "config.json"
    if not config_file.is_file():
        raise ConfigError(
            f"{_WHERE}: job_dir={source.job_dir!r} holds no config.json; give a pax_eqx job dir (one that "
            "`python -m pax_eqx.train` or `python -m pax_eqx.import_pax` wrote)."
        )
    data = json.loads(config_file.read_text())
    if model_type is not None and set(data.get("model", {})) == set(field_names(model_type)):
        model = model_type.from_dict(data.pop("model"))
        src_exp = ExperimentConfig.from_dict(data).replace(model=model)
    else:
        src_exp = ExperimentConfig.from_dict(data)
    programs = Programs(build_task(src_exp), mesh, src_exp.mesh.rules)
    ckpt = Checkpointer(job_dir / "checkpoints", src_exp.checkpoint, read_only=True)
    try:
        if ckpt.latest_step() is None:
            raise ConfigError(f"{_WHERE}: job_dir={source.job_dir!r} has no committed checkpoint to initialise from.")
        step = None if source.step < 0 else source.step
        step, state, _ = ckpt.restore(programs.abstract_with_shardings(), step, restore_data=False)
    finally:
        ckpt.close()
    leaves, _ = jtu.tree_flatten_with_path(state.params)
    return {path_name(p): leaf for p, leaf in leaves if eqx.is_array(leaf)}, step


def init_from_checkpoints(
    params: Any, sources: tuple[InitFromCheckpointConfig, ...], mesh: Any, log=print, model_type: type | None = None
) -> tuple[Any, list[str]]:
    """`params` with the arrays the rules name replaced by the sources' (each placed with our
    parameter's sharding); and the names replaced. `model_type`: see `_source_params`."""
    leaves, treedef = jtu.tree_flatten_with_path(params)
    names = [path_name(p) for p, _ in leaves]
    values = [leaf for _, leaf in leaves]
    index = {n: i for i, n in enumerate(names)}
    copied: list[str] = []
    for source in sources:
        chosen = plan(source, names)
        src, step = _source_params(source, mesh, model_type)
        problems = []
        for ours, theirs in chosen.items():
            if theirs not in src:
                problems.append(f"{ours} <- {theirs}: the source has no parameter {theirs!r}")
                continue
            mine = values[index[ours]]
            if tuple(src[theirs].shape) != tuple(mine.shape):
                problems.append(f"{ours} {tuple(mine.shape)} <- {theirs} {tuple(src[theirs].shape)}: shapes differ")
                continue
            values[index[ours]] = jax.device_put(src[theirs].astype(mine.dtype), mine.sharding)
            copied.append(ours)
        if problems:
            shown = ", ".join(list(src)[:6]) + (", ..." if len(src) > 6 else "")
            raise ConfigError(
                f"{_WHERE} for {source.job_dir!r} (step {step}) do not fit ({len(problems)} problems; the source's "
                f"parameters are named like {shown}):\n  " + "\n  ".join(problems)
            )
        log(f"Initialised {len(chosen)} parameter(s) from {source.job_dir} (step {step}).")
    return jtu.tree_unflatten(treedef, values), copied
