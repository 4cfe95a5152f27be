"""`python -m pax_eqx.import_pax --pax-checkpoint DIR --exp NAME --job-log-dir OUT [--section.field VALUE ...]`

Turns a Paxml checkpoint into the first checkpoint of a pax_eqx job dir. DIR is a Paxml job dir,
its `checkpoints/` or one `checkpoint_<step>/` (the newest committed step is taken). The
experiment, with its overrides, must describe the same model as the Pax run (its sizes, combined
QKV, attention biases, PerDimScale, softmax bias, ...): every Praxis variable is mapped onto the
model's parameters (pax_eqx.checkpoint.pax_import) or the import stops with the list of
variables and parameters that do not fit, before anything is written.

OUT then holds `config.json` and `checkpoints/<step>/` at the Pax step, so that

    python -m pax_eqx.train --exp NAME --job-log-dir OUT [the same overrides] --train.num-steps M

fine-tunes from it (M > the Pax step), and `eval` and `decode` read it like any job dir.

Optimizer state: when the experiment's learner is Adam/AdamW (Praxis' Adam is
`learners.pax_adam(...)`) and the checkpoint holds Praxis Adam's moments for every variable,
the moments are imported (converted to optax's uncorrected ones with the learner's b1/b2);
otherwise the optimizer state starts afresh, with a warning saying why. Either way the
learning-rate schedule continues from the Pax step. The input pipeline starts from its first
batch (a Pax input's position means nothing to pax_eqx's inputs).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from pax_eqx.command_line import entry

DESCRIPTION = (
    "Import a Paxml checkpoint into a new pax_eqx job dir, for `train` (fine-tuning), `eval` and `decode`. Pass "
    "the --exp and model flags that describe the Pax model; pass the same flags to train, eval and decode."
)


class PaxImportWarning(UserWarning):
    """Part of the Paxml checkpoint was not imported (the optimizer state starts afresh)."""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not {"-h", "--help", "--help-all"} & set(argv):
        print(f"Loading experiment {entry.experiment_named(argv)} ...", flush=True)
    from pax_eqx.command_line import cli

    exp, job_dir, ns = cli.parse(
        argv,
        "python -m pax_eqx.import_pax",
        DESCRIPTION,
        extra=[
            (
                "--pax-checkpoint",
                dict(
                    default=None,
                    metavar="DIR",
                    help="a Paxml job dir, its checkpoints/ or one checkpoint_<step>/ (the newest step is imported)",
                ),
            )
        ],
        sections=("model",),
    )
    if not ns.pax_checkpoint:
        raise cli.fail(
            "--pax-checkpoint is required: python -m pax_eqx.import_pax --pax-checkpoint DIR --exp NAME "
            "--job-log-dir OUT"
        )
    import jax

    from pax_eqx.checkpoint import Checkpointer
    from pax_eqx.checkpoint.pax_import import describe, read_checkpoint
    from pax_eqx.job.job_dir import exclusive, prepare, write_config
    from pax_eqx.programs.compiled import Programs
    from pax_eqx.programs.runtime import build_task
    from pax_eqx.sharding.distributed import initialize
    from pax_eqx.sharding.mesh import build_mesh

    initialize()
    exp.validate(num_devices=jax.device_count())
    _refuse_used_job_dir(Checkpointer(Path(job_dir) / "checkpoints", read_only=True), Path(job_dir))
    pax = read_checkpoint(ns.pax_checkpoint)  # a missing or unreadable checkpoint: before OUT is touched
    print(f"Read the Paxml checkpoint {describe(pax)}.", flush=True)
    programs = Programs(build_task(exp), build_mesh(exp.mesh), exp.mesh.rules)
    state = _imported_state(exp, programs, pax)  # a model that does not fit: before OUT is touched
    path = prepare(job_dir)
    with exclusive(path, lock=jax.process_index() == 0):
        ckpt = Checkpointer(path / "checkpoints", exp.checkpoint)
        try:
            _refuse_used_job_dir(ckpt, path)  # again, under the lock: a trainer may have started meanwhile
            ckpt.save(pax.step, state, None, force=True)
            ckpt.wait_until_finished()
        finally:
            ckpt.close()
        if jax.process_index() == 0:
            write_config(path, exp.to_dict())
    name = entry.experiment_named(argv)  # as given: a dotted path's short name is not registered
    print(
        f"Imported step {pax.step} into {path}. Fine-tune with: python -m pax_eqx.train --exp {name} "
        f"--job-log-dir {path} [the same flags] --train.num-steps N (N > {pax.step}).",
        flush=True,
    )
    return 0


def _imported_state(exp, programs, pax):
    """A fresh TrainState of the experiment with the Pax parameters, step and (when the learner
    matches) Adam moments, placed on the state's shardings."""
    import jax

    from pax_eqx.checkpoint.pax_import import (
        adam_moments,
        to_model_params,
        with_adam_moments,
        with_schedule_count,
    )
    from pax_eqx.tasks.train_state import TrainState

    state = programs.init_state(exp.train.seed)
    params = to_model_params(pax.params, state.params)
    opt_state = state.opt_state
    learner = exp.resolved_learner()
    if learner.frozen or learner.variable_groups:
        # Their optimizer state covers a part of the parameters per group: not Pax's one Adam state.
        _warn("learner.frozen / learner.variable_groups split the optimizer state by parameter")
    elif learner.optimizer.kind not in ("adam", "adamw"):
        _warn(
            f"learner.optimizer {learner.optimizer.kind!r} is not Adam, whose moments the Paxml checkpoint holds"
            if pax.moments
            else f"the Paxml checkpoint holds no Adam moments for learner.optimizer {learner.optimizer.kind!r}"
        )
    else:
        moments = adam_moments(pax, state.params, b1=learner.optimizer.b1, b2=learner.optimizer.b2)
        if moments is None:
            _warn("the Paxml checkpoint holds no Adam moments for every variable (its optimizer was not Adam)")
        else:
            opt_state, replaced = with_adam_moments(opt_state, *moments)
            if replaced != 1:
                opt_state = state.opt_state
                _warn(f"the learner has {replaced} Adam states, not one")
    opt_state = with_schedule_count(opt_state, pax.step)
    shardings = programs.state_shardings
    params = jax.device_put(params, shardings.params)  # host arrays onto the state's shardings
    return TrainState(
        step=jax.device_put(jax.numpy.asarray(pax.step, state.step.dtype), shardings.step),
        params=params,
        nt_state=state.nt_state,
        opt_state=jax.device_put(opt_state, shardings.opt_state),
        ema=None if state.ema is None else programs.task.split_optimized(params)[0],
        key=state.key,
    )


def _refuse_used_job_dir(ckpt, path) -> None:
    """An import starts a job dir: refused where one has started (checkpoints, or a run's
    config.json and metrics, even without a checkpoint), which it would turn into one dir of two
    experiments."""
    from pax_eqx.job.job_dir import JobDirError

    if ckpt.committed_steps():
        raise JobDirError(
            f"--job-log-dir {str(path)!r} already holds checkpoints (steps {ckpt.committed_steps()}); import into a "
            "new --job-log-dir."
        )
    used = [name for name in ("config.json", "metrics.jsonl") if (path / name).exists()]
    if used:
        raise JobDirError(
            f"--job-log-dir {str(path)!r} already holds a run ({', '.join(used)}); import into a new --job-log-dir."
        )


def _warn(reason: str) -> None:
    warnings.warn(f"{reason}: the optimizer state starts afresh.", PaxImportWarning, stacklevel=3)


if __name__ == "__main__":
    entry.run(main)
