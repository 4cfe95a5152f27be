"""How a training run opens, before its first step: the job dir locked and its config checked on
every host, then the train state made from scratch, read from a start point (a step-0 import to
fine-tune), or restored from the newest checkpoint.

`open_state` says which it did (`Opened.how`), so the loop decides what follows: a resumed run
may have nothing left to do and restores its inputs' positions; the others start at batch one.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp

from pax_eqx.checkpoint import Checkpointer
from pax_eqx.checkpoint.start_point import restore_start_point
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.job.job_dir import JobDirError, check_config, exclusive
from pax_eqx.programs import lora_base
from pax_eqx.programs.runtime import Runtime
from pax_eqx.programs.train.init_from import init_from_checkpoints
from pax_eqx.programs.train.state_from_params import state_with_params
from pax_eqx.sharding.distributed import any_host


@dataclass
class Opened:
    """The train state a run starts from, the step it is at and how it was made; `data_state`
    (the inputs' positions, early stopping's record) only when it was restored."""

    step: int
    state: Any
    data_state: dict[str, Any] | None
    how: Literal["scratch", "start point", "resume"]


def open_state(
    rt: Runtime, exp: ExperimentConfig, ckpt: Checkpointer, job_dir: Path, start_point: dict[str, Any] | None, log
) -> Opened:
    """From scratch when DIR has no checkpoint (then LoRA's base and `init_from_checkpoint_rules`
    are read in); from the start point's parameters when `start_point` (its manifest) is given;
    else the newest readable checkpoint."""
    if ckpt.latest_step() is None:
        state = rt.programs.init_state(exp.train.seed)
        log(f"Starting {exp.name or 'experiment'} from scratch in {job_dir}.")
        if exp.lora.enabled:
            state = lora_base.start(rt.programs, state, exp, job_dir, log)
        if exp.checkpoint.init_from_checkpoint_rules:
            state = state_from_checkpoint_rules(rt, state, exp, log)
        return Opened(0, state, None, "scratch")
    if start_point is not None:
        read = restore_start_point(ckpt.directory, start_point, rt.programs.abstract_with_shardings())
        state = state_with_params(rt.programs, read["params"], exp.train.seed, read["nt_state"])
        log(f"Fine-tuning {exp.name or 'the model'} from the imported step-0 checkpoint in {job_dir}: its "
            "parameters, with this run's learner state and data starting afresh.")  # fmt: skip
        return Opened(0, state, None, "start point")
    step, state, data_state = lora_base.restore_state(ckpt, rt.programs, exp, job_dir)
    return Opened(step, state, data_state, "resume")


def lock_everywhere(stack: contextlib.ExitStack, job_dir: Path) -> None:
    """Process 0 takes DIR/train.lock for the run (held until `stack` closes); every host learns
    whether it could, so a refused run stops all of them."""
    refusal = None
    try:
        stack.enter_context(exclusive(job_dir, lock=jax.process_index() == 0))
    except JobDirError as e:
        refusal = e
    if any_host(refusal is not None):
        raise refusal or JobDirError(
            f"process 0 could not lock --job-log-dir {str(job_dir)!r} (its error names the holder); another "
            "training run is using it."
        )


def check_config_everywhere(exp: ExperimentConfig, job_dir: Path, start_point: bool = False) -> list[str]:
    """Process 0 owns config.json and compares it; every host learns the verdict, so a refused
    resume stops all of them instead of leaving the others waiting in the first collective.
    `start_point`: the job dir holds a step-0 import, which a run may fine-tune with its own
    learner and data."""
    refusal, changed = None, []
    if jax.process_index() == 0:
        reader = Checkpointer(job_dir / "checkpoints", read_only=True)
        resumable = bool(reader.committed_steps())
        lost = resumable and not (job_dir / "config.json").exists()  # deleted: the checkpoint's copy stands in
        try:
            changed = check_config(
                job_dir,
                exp.to_dict(),
                exp.checkpoint.allow_config_change,
                resumable=resumable,
                saved=reader.saved_config() if lost else None,
                start_point=start_point,
            )
        except JobDirError as e:
            refusal = e
    if any_host(refusal is not None) and refusal is None:
        refusal = JobDirError(
            f"process 0 refused to resume --job-log-dir {str(job_dir)!r} with this config (its error names "
            "the changed fields); pass the flags the run was started with, or a new --job-log-dir."
        )
    if refusal is not None:
        raise refusal
    return changed


def state_from_checkpoint_rules(rt: Runtime, state: Any, exp: ExperimentConfig, log) -> Any:
    """The fresh state with the parameters `checkpoint.init_from_checkpoint_rules` name copied
    from their sources (and the EMA, if kept, starting from them too)."""
    rules = exp.checkpoint.init_from_checkpoint_rules
    params, _ = init_from_checkpoints(state.params, rules, rt.programs.mesh, log, type(exp.model))
    state = eqx.tree_at(lambda s: s.params, state, params)
    if state.ema is not None:
        trainable, _ = rt.programs.task.split_optimized(params)
        state = eqx.tree_at(lambda s: s.ema, state, jax.tree.map(jnp.copy, trainable))
    return state
