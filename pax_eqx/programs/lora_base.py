"""A LoRA run's base: read from its job dir, referenced (never copied) by the run's checkpoints.

    state = start(programs, fresh_state, exp, job_dir)           # a new run: the base put in place
    saved = adapters_only(state)                                  # what a checkpoint holds
    step, state, data = restore_state(ckpt, programs, exp, job_dir)   # any program reading a job dir

A LoRA run's checkpoints hold the adapters, their optimizer state (and EMA), the step and the key:
the base is `LoraParams.base = None` in them. The base is named by `lora.base_job_dir`, and
`DIR/lora_base.json` records which of its checkpoints the run started from and that checkpoint's
parameter fingerprint (`checkpoint/fingerprint.py`). Every later read (a resumed run, eval,
decode, export) loads the base again from there and refuses it, naming both fingerprints, if its
parameters are no longer those: adapters trained on other weights would silently compute
something else.

The base is read with its own experiment (its config.json), restored read-only onto this run's
mesh, and its parameters (its EMA where its learner keeps one: what its eval and export use)
placed in this run's shardings; their names and shapes must be this model's. Only the parameters
are read (orbax placeholders for the rest, `checkpoint/start_point.py`), so a base trained with
Adam does not bring twice its size in moments along; a base whose learner keeps an EMA is read
whole once, its EMA being what it evaluates and exports with.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.tree_util as jtu

from pax_eqx.checkpoint import Checkpointer
from pax_eqx.checkpoint.fingerprint import params_fingerprint, read_manifest
from pax_eqx.checkpoint.start_point import restore_start_point
from pax_eqx.config import ConfigError, MissingFileError
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.learners.variables import path_name
from pax_eqx.programs.compiled import Programs
from pax_eqx.tasks.lora_adapters import LoraParams
from pax_eqx.tasks.train_state import TrainState

REFERENCE = "lora_base.json"


def adapters_only(state: TrainState) -> TrainState:
    """The state a LoRA checkpoint holds: everything but the base (arrays, shapes or shardings)."""
    return eqx.tree_at(lambda s: s.params, state, LoraParams(None, state.params.adapters))


def with_base(state: TrainState, base: Any) -> TrainState:
    return eqx.tree_at(lambda s: s.params, state, LoraParams(base, state.params.adapters))


def start(programs: Programs, state: TrainState, exp: ExperimentConfig, job_dir: Path, log=print) -> TrainState:
    """The fresh state of a new LoRA run with the base checkpoint's parameters in place of the
    random ones; writes DIR/lora_base.json (the base's step and fingerprint)."""
    base_dir = Path(exp.lora.base_job_dir)
    steps = _committed(base_dir)
    step = steps[-1] if exp.lora.base_step < 0 else exp.lora.base_step
    if step not in steps:
        raise ConfigError(
            f"lora.base_step={exp.lora.base_step}: {base_dir / 'checkpoints'} has no checkpoint of that step (it has "
            f"{steps}); pass one of those, or -1 for the newest."
        )
    fingerprint = params_fingerprint(base_dir / "checkpoints", step)
    base = _base_params(programs, base_dir, step, state.params.base)
    if jax.process_index() == 0:
        reference = {"base_job_dir": str(base_dir.absolute()), "step": step, "fingerprint": fingerprint}
        (Path(job_dir) / REFERENCE).write_text(json.dumps(reference, indent=2, sort_keys=True) + "\n")
    log(f"LoRA on {len(programs.task.targets)} weight(s) of the base {base_dir} (step {step}), which stays frozen.")
    return with_base(state, base)


def restore_state(
    ckpt: Checkpointer,
    programs: Programs,
    exp: ExperimentConfig,
    job_dir: Path,
    step: int | None = None,
    restore_data: bool = True,
) -> tuple[int, TrainState, dict[str, Any] | None]:
    """`ckpt.restore` of the state `programs` run (step, state, data state); for a LoRA run the
    checkpoint's adapters with the base read from its job dir and checked against the fingerprint."""
    target = programs.abstract_with_shardings()
    if not exp.lora.enabled:
        return ckpt.restore(target, step, restore_data=restore_data)
    restored, saved, data_state = ckpt.restore(adapters_only(target), step, restore_data=restore_data)
    reference = _reference(Path(job_dir))
    base_dir = Path(exp.lora.base_job_dir)
    if reference["step"] not in _committed(base_dir, allow_none=True):
        raise ConfigError(
            f"lora.base_job_dir={str(base_dir)!r} no longer holds checkpoint {reference['step']}, the base this LoRA "
            f"run's adapters were trained on ({Path(job_dir) / REFERENCE}); restore it there (its keep-N may have "
            "deleted it)."
        )
    fingerprint = params_fingerprint(base_dir / "checkpoints", reference["step"])
    if fingerprint != reference["fingerprint"]:
        raise ConfigError(
            f"lora.base_job_dir={str(base_dir)!r}: its checkpoint {reference['step']} holds other parameters than "
            f"the base this LoRA run's adapters were trained on (fingerprint {fingerprint[:12]}, recorded "
            f"{reference['fingerprint'][:12]} in {Path(job_dir) / REFERENCE}); point --lora.base-job-dir at that "
            "base."
        )
    base = _base_params(programs, base_dir, reference["step"], target.params.base)
    return restored, with_base(saved, base), data_state


def _reference(job_dir: Path) -> dict[str, Any]:
    file = job_dir / REFERENCE
    if not file.is_file():
        raise MissingFileError(
            f"{str(file)!r} does not exist: this job dir's checkpoints hold LoRA adapters, and the file naming their "
            "base (job dir, step, fingerprint) is gone; restore it from a backup, or train the adapters again."
        )
    return json.loads(file.read_text())


def _committed(base_dir: Path, allow_none: bool = False) -> list[int]:
    if not (base_dir / "config.json").is_file():
        raise ConfigError(
            f"lora.base_job_dir={str(base_dir)!r} holds no config.json; name a pax_eqx job dir (one import_hf or "
            "train wrote)."
        )
    steps = Checkpointer(base_dir / "checkpoints", read_only=True).committed_steps()
    if not steps and not allow_none:
        raise ConfigError(f"lora.base_job_dir={str(base_dir)!r} has no committed checkpoint to adapt.")
    return steps


def _base_params(programs: Programs, base_dir: Path, step: int, ours: Any) -> Any:
    """The base job dir's parameters at `step` (its inference parameters), in `ours`' shardings
    (`ours`: arrays or ShapeDtypeStructs with shardings, shaped as this model's params)."""
    from pax_eqx.programs.runtime import build_task

    base_exp = ExperimentConfig.from_dict(json.loads((base_dir / "config.json").read_text()))
    if base_exp.lora.enabled:
        raise ConfigError(
            f"lora.base_job_dir={str(base_dir)!r} is itself a LoRA run; adapt a job dir that holds whole weights "
            "(export the LoRA run merged with export_hf and import that with import_hf)."
        )
    base_programs = Programs(build_task(base_exp), programs.mesh, base_exp.mesh.rules)
    abstract = base_programs.abstract_with_shardings()
    if abstract.ema is None:  # the parameters alone: the optimizer state stays on disk
        manifest = read_manifest(base_dir / "checkpoints", step)
        params = restore_start_point(base_dir / "checkpoints", manifest, abstract, step)["params"]
    else:  # eval and export use the EMA: the whole state, once
        ckpt = Checkpointer(base_dir / "checkpoints", base_exp.checkpoint, read_only=True)
        try:
            _, state, _ = ckpt.restore(abstract, step, restore_data=False)
        finally:
            ckpt.close()
        params = base_programs.task.inference_params(state)
    theirs = {path_name(p): a for p, a in jtu.tree_flatten_with_path(params)[0]}
    leaves, treedef = jtu.tree_flatten_with_path(ours)
    problems, values = [], []
    for path, mine in leaves:
        name = path_name(path)
        if name not in theirs or tuple(theirs[name].shape) != tuple(mine.shape):
            found = tuple(theirs[name].shape) if name in theirs else "nothing"
            problems.append(f"{name}: this model's {tuple(mine.shape)}, the base's {found}")
            continue
        values.append(jax.device_put(theirs[name].astype(mine.dtype), mine.sharding))
    if problems:
        raise ConfigError(
            f"lora.base_job_dir={str(base_dir)!r} holds another model than this run's ({len(problems)} parameters "
            "differ); run with the base's experiment (--exp BASE/config.json):\n  " + "\n  ".join(problems[:10])
        )
    return jtu.tree_unflatten(treedef, values)
