"""A LoRA run's base: read from its job dir, referenced (never copied) by the run's checkpoints.

    state = start(programs, fresh_state, exp, job_dir)           # a new run: the base put in place
    saved = adapters_only(state)                                  # what a checkpoint holds
    step, state, data = restore_state(ckpt, programs, exp, job_dir)   # any program reading a job dir
    check_base(exp, job_dir)                                      # before any of them: the base as found

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

`lora.base_job_dir` may be relative (docs/fine_tune.md's `--lora.base-job-dir runs/llama`): it
is read against the working directory, as every path flag is, and made absolute before orbax
sees it (which takes absolute paths only). `check_base` finds everything `start` and
`restore_state` would refuse about the base -- no such directory, no config.json, no committed
checkpoint (or not the `lora.base_step` asked for), a LoRA run as base, another model's
parameters (names and shapes compared abstractly: nothing is read but config.json) -- before a
program makes or reads its job dir (programs/preflight.py).
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


def base_dir_of(exp: ExperimentConfig) -> Path:
    """`lora.base_job_dir`, absolute (a relative one is read against the working directory)."""
    return Path(exp.lora.base_job_dir).expanduser().absolute()


def check_base(exp: ExperimentConfig, job_dir: Path) -> None:
    """ConfigError for a base `start` (a new run: `job_dir` holds no checkpoint) or `restore_state`
    would refuse, found from its config.json and its checkpoints' names alone (module doc)."""
    from pax_eqx.programs.runtime import build_task

    base_dir = base_dir_of(exp)
    checkpoints = Path(job_dir) / "checkpoints"
    try:  # a job dir path the OS refuses (a name too long) is refused by name when it is made
        new_run = not (checkpoints.is_dir() and Checkpointer(checkpoints, read_only=True).committed_steps())
    except OSError:
        new_run = True
    steps = _committed(base_dir, allow_none=not new_run)  # a resumed run names its base step in lora_base.json
    if new_run:
        _chosen_step(exp, base_dir, steps)
    base_exp = _base_experiment(base_dir)
    key = jax.random.PRNGKey(0)
    ours = jax.eval_shape(build_task(exp).init_state, key).params.base
    theirs = jax.eval_shape(build_task(base_exp).init_state, key).params
    problems = _misfits(ours, {path_name(p): a for p, a in jtu.tree_flatten_with_path(theirs)[0]})
    if problems:
        raise _another_model(base_dir, problems)


def _chosen_step(exp: ExperimentConfig, base_dir: Path, steps: list[int]) -> int:
    step = steps[-1] if exp.lora.base_step < 0 else exp.lora.base_step
    if step not in steps:
        raise ConfigError(
            f"lora.base_step={exp.lora.base_step}: {base_dir / 'checkpoints'} has no checkpoint of that step (it has "
            f"{steps}); pass one of those, or -1 for the newest."
        )
    return step


def start(programs: Programs, state: TrainState, exp: ExperimentConfig, job_dir: Path, log=print) -> TrainState:
    """The fresh state of a new LoRA run with the base checkpoint's parameters in place of the
    random ones; writes DIR/lora_base.json (the base's step and fingerprint)."""
    base_dir = base_dir_of(exp)
    step = _chosen_step(exp, base_dir, _committed(base_dir))
    fingerprint = params_fingerprint(base_dir / "checkpoints", step)
    base = _base_params(programs, base_dir, step, state.params.base)
    if jax.process_index() == 0:
        reference = {"base_job_dir": str(base_dir), "step": step, "fingerprint": fingerprint}
        (Path(job_dir) / REFERENCE).write_text(json.dumps(reference, indent=2, sort_keys=True) + "\n")
    log(f"LoRA on {len(programs.task.targets)} weight(s) of the base {exp.lora.base_job_dir} (step {step}), which "
        "stays frozen.")  # fmt: skip
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
    base_dir = base_dir_of(exp)
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
    try:
        found, other = base_dir.is_dir(), base_dir.exists()
    except OSError:  # a name too long
        found, other = False, False
    if not found:
        raise ConfigError(
            f"lora.base_job_dir={str(base_dir)!r} {'is not a directory' if other else 'does not exist'}; name the "
            "job dir of the model to adapt (one import_hf or train wrote; a relative path is read against the working "
            "directory)."
        )
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

    base_exp = _base_experiment(base_dir)
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
    problems = _misfits(ours, theirs)
    if problems:
        raise _another_model(base_dir, problems)
    leaves, treedef = jtu.tree_flatten_with_path(ours)
    values = [jax.device_put(theirs[path_name(p)].astype(mine.dtype), mine.sharding) for p, mine in leaves]
    return jtu.tree_unflatten(treedef, values)


def _base_experiment(base_dir: Path) -> ExperimentConfig:
    """The base job dir's experiment (its config.json), which must hold whole weights."""
    base_exp = ExperimentConfig.from_dict(json.loads((base_dir / "config.json").read_text()))
    if base_exp.lora.enabled:
        raise ConfigError(
            f"lora.base_job_dir={str(base_dir)!r} is itself a LoRA run; adapt a job dir that holds whole weights "
            "(export the LoRA run merged with export_hf and import that with import_hf)."
        )
    return base_exp


def _misfits(ours: Any, theirs: dict[str, Any]) -> list[str]:
    """'name: this model's shape, the base's shape' for each of our parameters (arrays or shapes)
    the base's `theirs` ({name: array or shape}) lacks or shapes otherwise."""
    problems = []
    for path, mine in jtu.tree_flatten_with_path(ours)[0]:
        name = path_name(path)
        if name not in theirs or tuple(theirs[name].shape) != tuple(mine.shape):
            found = tuple(theirs[name].shape) if name in theirs else "nothing"
            problems.append(f"{name}: this model's {tuple(mine.shape)}, the base's {found}")
    return problems


def _another_model(base_dir: Path, problems: list[str]) -> ConfigError:
    return ConfigError(
        f"lora.base_job_dir={str(base_dir)!r} holds another model than this run's ({len(problems)} parameters "
        "differ); run with the base's experiment (--exp BASE/config.json):\n  " + "\n  ".join(problems[:10])
    )
