"""Restore the newest checkpoint of a job dir for eval or decode (no training state is written)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax

from pax_eqx.checkpoint import Checkpointer
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.programs.job_dir import prepare
from pax_eqx.programs.runtime import Runtime


def restore_for_inference(exp: ExperimentConfig, job_dir: str) -> tuple[Runtime, Any, int]:
    from pax_eqx.sharding.distributed import initialize

    initialize()
    path: Path = prepare(job_dir, create=False)
    exp.validate(num_devices=jax.device_count())
    rt = Runtime.create(exp, path)
    ckpt = Checkpointer(path / "checkpoints", exp.checkpoint)
    if ckpt.latest_step() is None:
        raise FileNotFoundError(
            f"no checkpoint in {path / 'checkpoints'}; train first: python -m pax_eqx.train --exp {exp.name} "
            f"--job-log-dir {path}"
        )
    step, state, _ = ckpt.restore(rt.programs.abstract_with_shardings(), restore_data=False)
    ckpt.close()
    return rt, state, step
