"""The host loop of `python -m pax_eqx.train`: move data, call the step, hand results on.

Everything numeric happens in `Programs.train_step`; this loop only
- resumes from the newest readable checkpoint: the train state and the positions of the
  training input and of a rolling eval input, so a resumed run continues exactly as if it had
  never stopped (docs/errors.md, "What an exact resume restores"),
- feeds per-host batches, fetching metrics from the device only every
  `train.summary_interval_steps` (the one host sync of the steady state); with
  `train.steps_per_loop` K > 1, K batches at a time to `Programs.train_steps` (K steps in one
  compiled call), single steps only where a loop of K would pass an eval, summary, decode or
  checkpoint step, `train.num_steps` or a profiled step (so no interval has to be a multiple of K),
- evaluates every `train.eval_interval_steps`, saves checkpoints by step or time,
- stops cleanly on SIGTERM/SIGINT (finish the step, save, exit 0), with all hosts agreeing,
- stops on a NaN/Inf loss or gradient norm (or counts the skipped updates, by policy), and on
  a failing data pipeline, after letting an in-flight checkpoint commit,
- and at the end saves a final checkpoint, draws the plots and prints a sample.

The whole run holds DIR/train.lock (pax_eqx.programs.job_dir.exclusive): a second trainer on
the same DIR is refused before it builds anything. A run whose newest checkpoint is already at
`train.num_steps` says so and returns: no eval, plots or sample are redone, config.json is
left as it was. A metrics or TensorBoard write that fails (disk full, permissions) stops the run
at once with the file and the OS's reason (RunError, exit 1), as a checkpoint save that fails
does (CheckpointSaveError); the checkpoints written before are intact.

DIR/config.json is written only once the run has restored its checkpoint (or started from
scratch) without error, so a refused or failed start never changes what the job dir records.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from pax_eqx.checkpoint import Checkpointer, CheckpointSaveError
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.learners import skipped_steps
from pax_eqx.programs.decode_modes import check_decode
from pax_eqx.programs.early_stopping import STATE_KEY as EARLY_STOPPING_KEY
from pax_eqx.programs.early_stopping import EarlyStopping
from pax_eqx.programs.errors import DataPipelineError, NonFiniteLossError, RunError, raised_at
from pax_eqx.programs.eval_loop import evaluate
from pax_eqx.programs.init_from import init_from_checkpoints
from pax_eqx.programs.job_dir import JobDirError, check_config, exclusive, write_config
from pax_eqx.programs.pgle import enable_auto_pgle
from pax_eqx.programs.runtime import Runtime
from pax_eqx.programs.sampling import check_prompt, print_samples
from pax_eqx.programs.seq2seq_decoding import decodes_examples
from pax_eqx.sharding.distributed import any_host
from pax_eqx.summaries import Progress, SummaryWriter, step_scalars, write_plots
from pax_eqx.summaries.writer import SummaryWriteError

# Marks the data state a checkpoint holds as {"train": ..., "eval": ..., "eval_data": ...}; a
# checkpoint without it (written before rolling eval positions were saved) holds the train
# iterator's state alone.
INPUT_STATES_KEY = "pax_eqx_input_states"


@dataclass
class TrainResult:
    last_step: int
    train_metrics: dict[str, float]
    eval_metrics: dict[str, float]
    preempted: bool
    tokens_per_s: float
    wall_s: float
    stopped_early: str = ""  # why the run stopped early (train.early_stopping), "" if it did not


class _StopFlag:
    """Set by SIGTERM/SIGINT; read once per step. Agreed across hosts when there are several.

    Installed for the whole run, so a preemption notice that arrives while the run is still
    compiling or restoring is honoured after the first step. A second SIGINT (Ctrl-C twice)
    stops at once without saving, as a user pressing it again expects; SIGTERM never does,
    since schedulers resend it while they wait for the save.

    The handler acknowledges the signal on stderr with one unbuffered `os.write`: a `print`
    there could re-enter a stdout write the main thread was in the middle of, and fail.
    """

    def __init__(self):
        self.requested: str | None = None
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt(f"second {name}: stopping without saving")
        if not self.requested:
            note = f"{name} received: finishing the current step, then saving a checkpoint and exiting.\n"
            os.write(2, note.encode())
        self.requested = self.requested or name

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def agreed(self) -> bool:
        return any_host(bool(self.requested))


def train(exp: ExperimentConfig, job_dir: Path, log=print) -> TrainResult:
    with contextlib.ExitStack() as stack:
        _lock_everywhere(stack, job_dir)
        log(
            f"Building {exp.name or 'the experiment'}'s inputs and model, then compiling its train step "
            "(the first step waits for the compile) ..."
        )
        sys.stdout.flush()
        stop = stack.enter_context(_StopFlag())
        return _train(exp, job_dir, log, stop)


def _lock_everywhere(stack: contextlib.ExitStack, job_dir: Path) -> None:
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


def _check_config_everywhere(exp: ExperimentConfig, job_dir: Path) -> list[str]:
    """Process 0 owns config.json and compares it; every host learns the verdict, so a refused
    resume stops all of them instead of leaving the others waiting in the first collective."""
    refusal, changed = None, []
    if jax.process_index() == 0:
        try:
            changed = check_config(job_dir, exp.to_dict(), exp.checkpoint.allow_config_change)
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


def _train(exp: ExperimentConfig, job_dir: Path, log, stop: _StopFlag) -> TrainResult:
    if exp.profile.auto_pgle:
        enable_auto_pgle()
    rt = Runtime.create(exp, job_dir, log=log)
    changed = _check_config_everywhere(exp, job_dir)
    if exp.train.sample_at_end or exp.train.decode_interval_steps:  # not after hours of training
        check_prompt(rt.tokenizer, exp.decode.prompt)
        check_decode(exp.decode, examples=decodes_examples(exp))
    # Both inputs are built now, so an empty data file or an empty eval split fails before any
    # write, not at the first eval.
    train_input = rt.input("train")
    rt.input("eval")
    _check_step_traces(rt, train_input)
    ckpt = Checkpointer(job_dir / "checkpoints", exp.checkpoint)
    try:
        return _run(exp, job_dir, log, stop, rt, ckpt, train_input, changed)
    except BaseException:
        _finish_in_flight_save(ckpt, log)
        raise


def _run(exp, job_dir, log, stop, rt, ckpt, train_input, changed) -> TrainResult:
    primary = jax.process_index() == 0
    start = time.time()
    latest = ckpt.latest_step()
    early = EarlyStopping(exp.train.early_stopping)
    if latest is None:
        state = rt.programs.init_state(exp.train.seed)
        step = 0
        log(f"Starting {exp.name or 'experiment'} from scratch in {job_dir}.")
        if exp.checkpoint.init_from_checkpoint_rules:
            state = _init_from_checkpoints(rt, state, exp, log)
    else:
        step, state, data_state = ckpt.restore(rt.programs.abstract_with_shardings())
        if step >= exp.train.num_steps:
            ckpt.close()
            log(f"{exp.name or 'The experiment'} in {job_dir} is already trained to step {step} (train.num_steps="
                f"{exp.train.num_steps}): nothing to do. Raise --train.num-steps to train further.")  # fmt: skip
            return TrainResult(step, {}, {}, False, 0.0, time.time() - start)
        early = EarlyStopping.restore(exp.train.early_stopping, data_state)
        if early.stopped:
            ckpt.close()
            log(f"{exp.name or 'The experiment'} in {job_dir} stopped early at step {step}: {early.stopped} "
                "(train.early_stopping): nothing to do. Change train.early_stopping to train further.")  # fmt: skip
            return TrainResult(step, {}, {}, False, 0.0, time.time() - start, early.stopped)
        _restore_inputs(rt, exp, data_state, log)
        log(f"Resuming {exp.name or 'experiment'} from checkpoint at step {step} in {job_dir}.")
    if primary:
        write_config(job_dir, exp.to_dict())
        if changed:
            log("Config changes since the last run in this job dir:\n  " + "\n  ".join(changed))
    writer = _log_writes(ckpt, SummaryWriter, job_dir, enabled=primary, start_step=step)
    progress = Progress(exp.train.num_steps, step) if primary and step < exp.train.num_steps else None
    examples_per_step = exp.data.train.batch_size * jax.process_count()
    # Throughput in the model's unit: tokens (Pax's and nanoGPT's; a sequence-to-sequence
    # model's input + target tokens) where an example carries several, else examples.
    tokens_per_example = exp.model.tokens_per_example(exp.data)
    tokens_per_step = examples_per_step * tokens_per_example
    train_metrics: dict[str, float] = {}
    eval_metrics: dict[str, float] = {}
    window_start, window_steps, tokens_per_s = time.time(), 0, 0.0
    skipped_so_far = int(jax.device_get(skipped_steps(state.opt_state)))
    preempted = False
    stop_reason = ""
    while step < exp.train.num_steps:
        n = _loop_length(exp, step)
        if n == 1:
            batch = rt.programs.global_batch(_next_train_batch(train_input, step + 1, ckpt))
            _maybe_profile(exp, job_dir, step)
            state, outputs = rt.programs.train_step(state, batch)
        else:
            batches = [_next_train_batch(train_input, step + 1 + i, ckpt) for i in range(n)]
            state, outputs = rt.programs.train_steps(state, rt.programs.global_batches(batches))
        step += n
        window_steps += n
        interval = exp.train.summary_interval_steps
        if (interval and step % interval == 0) or step == exp.train.num_steps:
            train_metrics = step_scalars(*jax.device_get((outputs.metrics, outputs.summaries)))
            elapsed = time.time() - window_start
            tokens_per_s = tokens_per_step * window_steps / max(elapsed, 1e-9)
            if tokens_per_example > 1:
                train_metrics["tokens_per_s"] = tokens_per_s
            train_metrics["examples_per_s"] = examples_per_step * window_steps / max(elapsed, 1e-9)
            train_metrics["steps_per_s"] = window_steps / max(elapsed, 1e-9)
            window_start, window_steps = time.time(), 0
            _log_writes(ckpt, writer.write, step, "train", train_metrics)
            if progress:
                progress.update(step, train_metrics)
            _check_finite(exp, step, train_metrics, ckpt)
            skipped_so_far = _report_skipped(step, train_metrics, skipped_so_far, log)
        if exp.train.eval_interval_steps and step % exp.train.eval_interval_steps == 0:
            eval_metrics = _evaluate(rt, state, step, ckpt, log)
            _log_writes(ckpt, writer.write, step, "eval", eval_metrics)
            stop_reason = early.update(step, eval_metrics)
        if exp.train.decode_interval_steps and step % exp.train.decode_interval_steps == 0:
            _decode_during_training(rt, state, step, ckpt, writer, log)
        stopping = stop.agreed()
        if ckpt.should_save(step) or stopping or stop_reason or step == exp.train.num_steps:
            finite = {k: float(outputs.metrics[k].value) for k in ("total_loss", "grad_norm")}
            _check_finite(exp, step, finite, ckpt)
            ckpt.save(step, state, _input_states(rt, exp, early), force=True)
        if stop_reason and not stopping:
            ckpt.wait_until_finished()
            log(f"Stopping early at step {step}: {stop_reason} (train.early_stopping); saved a checkpoint.")
            break
        if stopping:
            preempted = True
            ckpt.wait_until_finished()
            log(f"Stop requested ({stop.requested or 'by another host'}): saved a checkpoint at step {step}; "
                "exiting. Rerun the same command to resume from it.")  # fmt: skip
            break
    if progress:
        progress.close()
    if exp.profile.steps and primary and exp.profile.steps[0] < step <= exp.profile.steps[1]:
        jax.profiler.stop_trace()
    interval = exp.train.eval_interval_steps
    if not preempted and (interval == 0 or step % interval):
        eval_metrics = _evaluate(rt, state, step, ckpt, log)
        _log_writes(ckpt, writer.write, step, "eval", eval_metrics)
    ckpt.wait_until_finished()
    ckpt.close()
    _log_writes(ckpt, writer.close)
    if primary:
        _log_writes(ckpt, write_plots, job_dir, what=f"drawing the plots in {job_dir / 'plots'}")
    wall = time.time() - start
    if not preempted and primary:
        unit = "tokens" if tokens_per_example > 1 else "examples"
        log(_summary_line(step, train_metrics, eval_metrics, tokens_per_s, unit, wall))
        if exp.train.sample_at_end:
            print_samples(rt, state, exp.decode, log=log)
    return TrainResult(step, train_metrics, eval_metrics, preempted, tokens_per_s, wall, stop_reason)


def _init_from_checkpoints(rt: Runtime, state: Any, exp: ExperimentConfig, log) -> Any:
    """The fresh state with the parameters `checkpoint.init_from_checkpoint_rules` name copied
    from their sources (and the EMA, if kept, starting from them too)."""
    rules = exp.checkpoint.init_from_checkpoint_rules
    params, _ = init_from_checkpoints(state.params, rules, rt.programs.mesh, log, type(exp.model))
    state = eqx.tree_at(lambda s: s.params, state, params)
    if state.ema is not None:
        trainable, _ = rt.programs.task.split_frozen(params)
        state = eqx.tree_at(lambda s: s.ema, state, jax.tree.map(jnp.copy, trainable))
    return state


def _decode_during_training(rt: Runtime, state: Any, step: int, ckpt: Checkpointer, writer: Any, log) -> None:
    """`train.decode_interval_steps`: decode.num_samples samples (or a seq2seq model's outputs, or
    the beam's n-best) to the log, metrics.jsonl (split "decode", key "samples") and TensorBoard."""
    log(f"step {step}: decoding (train.decode_interval_steps):")
    texts = print_samples(rt, state, rt.exp.decode, log=log)
    _log_writes(ckpt, writer.write_text, step, "decode", "samples", texts)


def _loop_length(exp: ExperimentConfig, step: int) -> int:
    """How many steps the next compiled call runs from `step`: `train.steps_per_loop` K when no
    event falls strictly inside those K steps, else 1. The events are the eval, summary, decode
    and checkpoint steps (multiples of their intervals), the last step and a profiled range; so
    every event falls at a call's end whatever the intervals, K need not divide them, and the
    steps up to an event K would pass run one a call (two compiled programs in all: the K-step
    loop and the single step; the updates are the same step for step)."""
    k = exp.train.steps_per_loop
    end = step + k
    if k == 1 or end > exp.train.num_steps:
        return 1
    intervals = (
        exp.train.eval_interval_steps,
        exp.train.summary_interval_steps,
        exp.train.decode_interval_steps,
        exp.checkpoint.every_n_steps,
    )
    if any(n and (step // n + 1) * n < end for n in intervals):
        return 1  # that interval's next event comes before the loop would end
    if exp.profile.steps and exp.profile.steps[0] <= end and step <= exp.profile.steps[1] + 1:
        return 1  # the trace starts before step `first` and stops after step `last`: single steps
    return k


def _check_step_traces(rt: Runtime, train_input: Any) -> None:
    """Traces the train step abstractly on the first batch's shapes, so a batch without the
    model's keys or a task loss the model does not report fails before anything is written.
    The batch is read and the input put back where it was: the run still starts with it."""
    position = train_input.get_state()
    try:
        first = train_input.get_next()
    except Exception:  # the loop reports a failing input with the step it failed at
        return
    finally:
        train_input.set_state(position)
    rt.programs.check_batch(first)


# ------------------------------------------------------------------- data iterator positions


def _eval_data(exp: ExperimentConfig) -> dict[str, Any]:
    """What the eval input is built from: its saved position only applies to the same pipeline.
    (As it reads back from the checkpoint's JSON, so a saved and a fresh one compare equal.)"""
    return json.loads(json.dumps({k: v for k, v in exp.data.to_dict().items() if k != "train"}))


def _input_states(rt: Any, exp: ExperimentConfig, early: EarlyStopping | None = None) -> dict[str, Any]:
    """This host's input positions for the checkpoint: the training input's, and the rolling eval
    input's (reset_for_eval=False: each eval run reads the next batches, so where it stands
    decides what the next eval sees). `rt`: the Runtime (anything whose .input(split) has
    get_state/set_state). With early stopping on, its state rides along (early_stopping.py)."""
    states: dict[str, Any] = {INPUT_STATES_KEY: 1, "train": rt.input("train").get_state()}
    if early is not None and early.enabled:
        states[EARLY_STOPPING_KEY] = early.saved()
    if not exp.data.eval.reset_for_eval:
        states["eval"] = rt.input("eval").get_state()
        states["eval_data"] = _eval_data(exp)
    return states


def _restore_inputs(rt: Any, exp: ExperimentConfig, data_state: dict[str, Any] | None, log) -> None:
    if data_state is None:
        log("The checkpoint holds no data iterator state: the training input starts from its first batch.")
        return
    if INPUT_STATES_KEY not in data_state:  # an older checkpoint: the train iterator's state alone
        rt.input("train").set_state(data_state)
        return
    rt.input("train").set_state(data_state["train"])
    if "eval" in data_state and not exp.data.eval.reset_for_eval:
        if data_state.get("eval_data") == _eval_data(exp):
            rt.input("eval").set_state(data_state["eval"])
        else:
            log("data.eval changed since the checkpoint: the rolling eval input starts from its first batch.")


# ------------------------------------------------------------------------------ failures


def _kept(ckpt: Checkpointer) -> str:
    """Lets an in-flight save commit, then says which checkpoint a rerun will resume from."""
    note = ""
    try:
        ckpt.wait_until_finished()
    except CheckpointSaveError as e:
        note = f" (the save in progress failed: {e})"
    latest = ckpt.latest_step()
    if latest is None:
        return "no checkpoint has been written yet" + note
    return f"the newest checkpoint, step {latest}, is intact" + note


def _finish_in_flight_save(ckpt: Checkpointer, log) -> None:
    """On the way out of a failed run: a save already started is still a good checkpoint."""
    try:
        ckpt.close()
    except CheckpointSaveError as e:
        log(f"warning: {e}")
    except Exception as e:  # noqa: BLE001 -- never hide the error that ended the run
        log(f"warning: closing the checkpointer failed: {type(e).__name__}: {e}")


def _log_writes(ckpt: Checkpointer, write: Any, *args: Any, what: str = "writing the logs", **kwargs: Any) -> Any:
    """`write(*args, **kwargs)`, whose failure to write a log file (metrics.jsonl, TensorBoard, plots: a full
    disk, a read-only directory) stops the run with the file, the reason and the checkpoint a
    rerun resumes from."""
    try:
        return write(*args, **kwargs)
    except (SummaryWriteError, OSError) as e:
        cause = str(e) if isinstance(e, SummaryWriteError) else f"{what} failed ({e.strerror or e})"
        raise RunError(
            f"{cause}; {_kept(ckpt)}. Free space (or fix the permissions) and rerun the same command to resume."
        ) from e


def _evaluate(rt: Runtime, state: Any, step: int, ckpt: Checkpointer, log) -> dict[str, float]:
    try:
        return evaluate(rt, state, log=log)
    except DataPipelineError as e:
        raise DataPipelineError(f"the eval after step {step} failed: {e}; {_kept(ckpt)}.") from e.__cause__


def _next_train_batch(train_input: Any, step: int, ckpt: Checkpointer) -> dict[str, np.ndarray]:
    try:
        return train_input.get_next()
    except StopIteration:
        raise DataPipelineError(
            f"the training input ran out of batches before step {step}; {_kept(ckpt)}. Training inputs must "
            "repeat forever (data.train.repeat=True); a custom input must never raise StopIteration."
        ) from None
    except Exception as e:
        raise DataPipelineError(
            f"the training input failed while reading the batch for step {step}: {type(e).__name__}: {e}"
            f"{raised_at(e)}; {_kept(ckpt)}. Fix the input and rerun the same command to resume "
            "(set PAX_EQX_TRACEBACK=1 for the full traceback)."
        ) from e


def _check_finite(exp: ExperimentConfig, step: int, metrics: dict, ckpt: Checkpointer) -> None:
    if exp.learner.skip_nonfinite:
        return
    bad = [
        f"{name} is {metrics[name]}"
        for name in ("total_loss", "grad_norm")
        if not math.isfinite(metrics.get(name, 0.0))
    ]
    if not bad:
        return
    raise NonFiniteLossError(
        f"{' and '.join(bad)} at step {step}; stopping without saving it ({_kept(ckpt)}). Lower "
        "learner.learning_rate, enable learner.clip_grad_norm, check the data, or pass --learner.skip-nonfinite "
        "to skip such updates (counted in the skipped_steps metric)."
    )


def _report_skipped(step: int, metrics: dict, before: int, log) -> int:
    now = int(metrics.get("skipped_steps", before))
    if now > before:
        log(f"step {step}: non-finite loss or gradients; {now - before} update(s) skipped since the last report "
            f"({now} in all; learner.skip_nonfinite).")  # fmt: skip
    return now


def _summary_line(step, train_m, eval_m, per_s, unit, wall) -> str:
    def fmt(m, k):
        return f"{m[k]:.4f}" if k in m else "n/a"

    return (
        f"Finished at step {step}: train loss {fmt(train_m, 'total_loss')}, "
        f"eval loss {fmt(eval_m, 'total_loss')}, {per_s:,.0f} {unit}/s, {wall:.1f}s wall."
    )


def _maybe_profile(exp: ExperimentConfig, job_dir: Path, step: int) -> None:
    if not exp.profile.steps or jax.process_index() != 0:
        return
    first, last = exp.profile.steps
    if step == first:
        jax.profiler.start_trace(str(job_dir / "profile"))
    elif step == last + 1:
        jax.profiler.stop_trace()
