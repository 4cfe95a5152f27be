"""The host loop of `python -m pax_eqx.train`: move data, call the step, hand results on.

Everything numeric happens in `Programs.train_step`; this loop only
- resumes from the newest readable checkpoint (train state + data iterator state),
- feeds per-host batches, fetching metrics from the device only every
  `train.summary_interval_steps` (the one host sync of the steady state),
- evaluates every `train.eval_interval_steps`, saves checkpoints by step or time,
- stops cleanly on SIGTERM/SIGINT (finish the step, save, exit 0), with all hosts agreeing,
- and at the end saves a final checkpoint, draws the plots and prints a sample.
"""

from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np

from pax_eqx.checkpoint import Checkpointer
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.programs.eval_loop import evaluate
from pax_eqx.programs.job_dir import write_or_check_config
from pax_eqx.programs.pgle import enable_auto_pgle
from pax_eqx.programs.runtime import Runtime
from pax_eqx.programs.sampling import print_samples
from pax_eqx.summaries import Progress, SummaryWriter, write_plots


class NonFiniteLossError(RuntimeError):
    pass


@dataclass
class TrainResult:
    last_step: int
    train_metrics: dict[str, float]
    eval_metrics: dict[str, float]
    preempted: bool
    tokens_per_s: float
    wall_s: float


class _StopFlag:
    """Set by SIGTERM/SIGINT; read once per step. Agreed across hosts when there are several."""

    def __init__(self):
        self.requested = False
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.requested = True

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def agreed(self) -> bool:
        if jax.process_count() == 1:
            return self.requested
        from jax.experimental import multihost_utils

        flags = multihost_utils.process_allgather(np.array([self.requested], np.int32))
        return bool(np.max(flags))


def train(exp: ExperimentConfig, job_dir: Path, log=print) -> TrainResult:
    if exp.profile.auto_pgle:
        enable_auto_pgle()
    rt = Runtime.create(exp, job_dir, log=log)
    primary = jax.process_index() == 0
    if primary:
        changed = write_or_check_config(job_dir, exp.to_dict(), exp.checkpoint.allow_config_change)
        if changed:
            log("Config changes since the last run in this job dir:\n  " + "\n  ".join(changed))
    ckpt = Checkpointer(job_dir / "checkpoints", exp.checkpoint)
    train_input = rt.input("train")
    start = time.time()
    latest = ckpt.latest_step()
    if latest is None:
        state = rt.programs.init_state(exp.train.seed)
        step = 0
        log(f"Starting {exp.name or 'experiment'} from scratch in {job_dir}.")
    else:
        step, state, data_state = ckpt.restore(rt.programs.abstract_with_shardings())
        if data_state is not None:
            train_input.set_state(data_state)
        log(f"Resuming {exp.name or 'experiment'} from checkpoint at step {step} in {job_dir}.")
    writer = SummaryWriter(job_dir, enabled=primary, start_step=step)
    progress = Progress(exp.train.num_steps, step) if primary else None
    tokens_per_step = exp.data.train.batch_size * jax.process_count() * exp.data.seq_len
    train_metrics: dict[str, float] = {}
    eval_metrics: dict[str, float] = {}
    window_start, window_steps, tokens_per_s = time.time(), 0, 0.0
    preempted = False
    last_saved = step if latest is not None else -1
    with _StopFlag() as stop:
        while step < exp.train.num_steps:
            batch = rt.programs.global_batch(train_input.get_next())
            _maybe_profile(exp, job_dir, step)
            state, metrics = rt.programs.train_step(state, batch)
            step += 1
            window_steps += 1
            interval = exp.train.summary_interval_steps
            if (interval and step % interval == 0) or step == exp.train.num_steps:
                train_metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
                elapsed = time.time() - window_start
                tokens_per_s = tokens_per_step * window_steps / max(elapsed, 1e-9)
                train_metrics["tokens_per_s"] = tokens_per_s
                train_metrics["steps_per_s"] = window_steps / max(elapsed, 1e-9)
                window_start, window_steps = time.time(), 0
                writer.write(step, "train", train_metrics)
                if progress:
                    progress.update(step, train_metrics)
                _check_finite(exp, step, train_metrics, ckpt, last_saved)
            if exp.train.eval_interval_steps and step % exp.train.eval_interval_steps == 0:
                eval_metrics = evaluate(rt, state, log=log)
                writer.write(step, "eval", eval_metrics)
            stopping = stop.agreed()
            if ckpt.should_save(step) or stopping or step == exp.train.num_steps:
                _check_finite(exp, step, {"total_loss": float(metrics["total_loss"])}, ckpt, last_saved)
                ckpt.save(step, state, train_input.get_state(), force=True)
                last_saved = step
            if stopping:
                preempted = True
                log(f"Stop requested (SIGTERM/SIGINT): saved a checkpoint at step {step}; exiting.")
                break
    if progress:
        progress.close()
    if exp.profile.steps and primary and exp.profile.steps[0] < step <= exp.profile.steps[1]:
        jax.profiler.stop_trace()
    interval = exp.train.eval_interval_steps
    if not preempted and (interval == 0 or step % interval):
        eval_metrics = evaluate(rt, state, log=log)
        writer.write(step, "eval", eval_metrics)
    ckpt.wait_until_finished()
    ckpt.close()
    writer.close()
    if primary:
        write_plots(job_dir)
    wall = time.time() - start
    if not preempted and primary:
        log(_summary_line(step, train_metrics, eval_metrics, tokens_per_s, wall))
        if exp.train.sample_at_end:
            print_samples(rt, state, exp.decode, log=log)
    return TrainResult(step, train_metrics, eval_metrics, preempted, tokens_per_s, wall)


def _summary_line(step, train_m, eval_m, tokens_per_s, wall) -> str:
    def fmt(m, k):
        return f"{m[k]:.4f}" if k in m else "n/a"

    return (
        f"Finished at step {step}: train loss {fmt(train_m, 'total_loss')}, "
        f"eval loss {fmt(eval_m, 'total_loss')}, {tokens_per_s:,.0f} tokens/s, {wall:.1f}s wall."
    )


def _check_finite(exp: ExperimentConfig, step: int, metrics: dict, ckpt: Checkpointer, last_saved: int) -> None:
    loss = metrics.get("total_loss", 0.0)
    if math.isfinite(loss) or exp.learner.skip_nonfinite:
        return
    ckpt.wait_until_finished()
    kept = f"the last good checkpoint is step {last_saved}" if last_saved >= 0 else "no checkpoint was written"
    raise NonFiniteLossError(
        f"loss is {loss} at step {step}; stopping ({kept}). Lower learner.learning_rate, enable "
        "learner.clip_grad_norm, or set learner.skip_nonfinite True to skip such steps."
    )


def _maybe_profile(exp: ExperimentConfig, job_dir: Path, step: int) -> None:
    if not exp.profile.steps or jax.process_index() != 0:
        return
    first, last = exp.profile.steps
    if step == first:
        jax.profiler.start_trace(str(job_dir / "profile"))
    elif step == last + 1:
        jax.profiler.stop_trace()
