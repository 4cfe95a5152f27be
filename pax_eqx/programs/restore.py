"""Restore the newest checkpoint of a job dir for eval or decode (no training state is written).

The experiment given on the command line is checked against DIR/config.json first, as a
resumed training run is: evaluating or sampling with another tokenizer or model than the one
the job trained would silently give wrong numbers or text, so it is refused with the changed
fields (unless --checkpoint.allow-config-change).

Eval and decode may run while `train` writes the same job dir: the checkpoints are opened
read-only (pax_eqx.checkpoint, `read_only=True`), so nothing in DIR/checkpoints is created,
deleted or renamed -- not the trainer's save in progress, not a damaged checkpoint (skipped
with a warning; the trainer sets it aside) -- and the newest *committed* checkpoint is read;
if the trainer's keep-N deletes it meanwhile, the newest one again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax

from pax_eqx.checkpoint import Checkpointer, CheckpointMismatchError
from pax_eqx.config import MissingFileError
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.job.job_dir import check_config, prepare
from pax_eqx.models.decoding import check_prompt
from pax_eqx.programs import preflight
from pax_eqx.programs.input_positions import replay_eval_window
from pax_eqx.programs.lora_base import restore_state
from pax_eqx.programs.runtime import Runtime


def restore_for_inference(
    exp: ExperimentConfig, job_dir: str, program: str = "evaluate", *, prompt: str | None = None, log=print
) -> tuple[Runtime, Any, int]:
    """(runtime, train state, step) of DIR's newest checkpoint. `program` names the caller in
    errors; `prompt`, if given, is checked against the tokenizer before anything is restored.
    For "evaluate" with a rolling eval, the eval input is put where the training eval at that
    step started (input_positions.replay_eval_window): the same batches, the same number."""
    from pax_eqx.sharding.distributed import initialize

    initialize()
    path: Path = prepare(job_dir, create=False)
    check_config(path, exp.to_dict(), exp.checkpoint.allow_config_change, program=program)
    exp.validate(num_devices=jax.device_count(), num_hosts=jax.process_count())
    preflight.check(exp, path, evaluates=program == "evaluate")  # before the compile, as train's
    rt = Runtime.create(exp, path)
    if prompt is not None:
        check_prompt(rt.tokenizer, prompt)
    ckpt = Checkpointer(path / "checkpoints", exp.checkpoint, read_only=True)
    if ckpt.latest_step() is None:
        raise MissingFileError(
            f"no checkpoint in {path / 'checkpoints'}; train first: python -m pax_eqx.train --exp {exp.name} "
            f"--job-log-dir {path}"
        )
    replay = program == "evaluate" and not exp.data.eval.reset_for_eval
    try:
        step, state, data_state = restore_state(ckpt, rt.programs, exp, path, restore_data=replay)
    except CheckpointMismatchError:
        if not replay:
            raise
        # another process count than the trainer's: its hosts' positions cannot be mapped; no replay
        step, state, data_state = restore_state(ckpt, rt.programs, exp, path, restore_data=False)
    ckpt.close()
    if replay and replay_eval_window(rt, exp, data_state, step):
        log(f"Reading the eval batches the training eval at step {step} read: the same batches, the same number.")
    return rt, state, step
