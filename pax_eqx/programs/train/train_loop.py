"""The host loop of `python -m pax_eqx.train`: move data, call the step, hand results on.

Everything numeric happens in `Programs.train_step`; this loop only
- resumes from the newest readable checkpoint: the train state and the positions of the
  training input and of a rolling eval input, so a resumed run continues exactly as if it had
  never stopped (docs/errors.md, "What an exact resume restores"),
- feeds per-host batches, fetching metrics from the device only every
  `train.summary_interval_steps` (the one host sync of the steady state), and on a slow model
  holds the calls queued ahead of the device to a few seconds of work (InFlight), so a stop
  request waits for those, not for a whole summary interval; with
  `train.steps_per_loop` K > 1, K batches at a time to `Programs.train_steps` (K steps in one
  compiled call), single steps only where a loop of K would pass an eval, summary, decode or
  checkpoint step, `train.num_steps` or a profiled step (so no interval has to be a multiple of K),
- evaluates every `train.eval_interval_steps`, saves checkpoints by step or time,
- stops cleanly on SIGTERM/SIGINT (finish the step, save, exit 0), with all hosts agreeing,
- says which step the device has finished, piped too, when the run has printed nothing for 30 s
  (a long compile, slow steps: Progress's heartbeat),
- stops on a NaN/Inf loss or gradient norm (or counts the skipped updates, by policy), and on
  a failing data pipeline, after letting an in-flight checkpoint commit,
- and at the end saves a final checkpoint, draws the plots and prints a sample.

The whole run holds DIR/train.lock (pax_eqx.job.job_dir.exclusive): a second trainer on
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
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from pax_eqx.checkpoint import Checkpointer, CheckpointSaveError
from pax_eqx.checkpoint.start_point import start_point_manifest
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.job.errors import DataPipelineError, NonFiniteLossError, RunError, raised_at
from pax_eqx.job.job_dir import write_config
from pax_eqx.job.run_record import log_file, record_command, tee_to_log
from pax_eqx.learners import skipped_steps
from pax_eqx.models.decoding import check_prompt
from pax_eqx.programs import lora_base
from pax_eqx.programs.decode.sampling import print_samples
from pax_eqx.programs.evaluate.eval_loop import (
    WATCHED_METRIC_ENV,
    check_watched_metric,
    declared_scores,
    evaluate,
    reported_names,
)
from pax_eqx.programs.input_positions import input_states, restore_inputs
from pax_eqx.programs.runtime import Runtime
from pax_eqx.programs.train.early_stopping import EarlyStopping
from pax_eqx.programs.train.in_flight import InFlight
from pax_eqx.programs.train.opening import check_config_everywhere, lock_everywhere, open_state
from pax_eqx.programs.train.pgle import enable_auto_pgle
from pax_eqx.programs.train.run_report import banner, closing_block
from pax_eqx.programs.train.screen_lines import print_fitted
from pax_eqx.programs.train.stop_flag import StopFlag
from pax_eqx.summaries import Progress, SummaryWriter, step_scalars, write_plots
from pax_eqx.summaries.progress import heartbeat_seconds
from pax_eqx.summaries.trackers import TrackerError
from pax_eqx.summaries.writer import SummaryWriteError


@dataclass
class TrainResult:
    last_step: int
    train_metrics: dict[str, float]
    eval_metrics: dict[str, float]
    preempted: bool
    tokens_per_s: float
    wall_s: float
    stopped_early: str = ""  # why the run stopped early (train.early_stopping), "" if it did not


def train(exp: ExperimentConfig, job_dir: Path, log=print_fitted, argv: list[str] | None = None) -> TrainResult:
    """Trains `exp` in `job_dir` (resuming its newest checkpoint); `argv` (the command's flags,
    default sys.argv's) is recorded in DIR/command.txt. `log` prints a line (by default wrapped
    between words on a terminal narrower than it: screen_lines)."""
    with contextlib.ExitStack() as stack:
        lock_everywhere(stack, job_dir)
        log(f"Building {exp.name or 'the experiment'}'s inputs and model, then compiling its train step ...")
        sys.stdout.flush()
        stop = stack.enter_context(StopFlag())
        return _train(exp, job_dir, log, stop, argv)


def _train(exp: ExperimentConfig, job_dir: Path, log, stop: StopFlag, argv: list[str] | None) -> TrainResult:
    if exp.profile.auto_pgle:
        enable_auto_pgle()
    rt = Runtime.create(exp, job_dir, log=log)
    committed = Checkpointer(job_dir / "checkpoints", read_only=True).committed_steps()
    start = start_point_manifest(job_dir / "checkpoints", committed)
    changed = check_config_everywhere(exp, job_dir, start is not None)
    if exp.train.sample_at_end or exp.train.decode_interval_steps:  # not after hours of training
        check_prompt(rt.tokenizer, exp.decode.prompt)
    # Both inputs are built now, so an empty data file or an empty eval split fails before any
    # write, not at the first eval.
    train_input = rt.input("train")
    rt.input("eval")
    _check_step_traces(rt, train_input)
    ckpt = Checkpointer(job_dir / "checkpoints", exp.checkpoint)
    run = None
    try:
        run = _Run(exp, job_dir, log, stop, rt, ckpt, train_input, argv, start)
        return run.run(changed)
    except BaseException:
        if run is not None and run.progress:
            run.progress.close()  # the terminal's stdout back before the error line
        _finish_in_flight_save(ckpt, log)
        raise


@dataclass
class _Run:
    """One training run: the pieces `_train` built, the train state, and the running counters.
    `run` is the loop; each event of it (a compiled call, a summary, an eval, a decode, a
    checkpoint) is a method of its own, and `start` / `finish` open and close the run."""

    exp: ExperimentConfig
    job_dir: Path
    log: Callable[[str], None]
    stop: StopFlag
    rt: Runtime
    ckpt: Checkpointer
    train_input: Any
    argv: list[str] | None = None
    start_point: dict[str, Any] | None = None  # the manifest of a step-0 import to fine-tune from
    primary: bool = field(default_factory=lambda: jax.process_index() == 0)
    started: float = field(default_factory=time.time)
    step: int = 0
    state: Any = None
    outputs: Any = None
    early: EarlyStopping | None = None
    writer: Any = None
    progress: Progress | None = None
    heartbeat_s: float = field(default_factory=heartbeat_seconds)  # read (and checked) before anything is written
    in_flight: InFlight | None = None
    train_metrics: dict[str, float] = field(default_factory=dict)
    eval_metrics: dict[str, float] = field(default_factory=dict)
    window_start: float = 0.0  # when the throughput's window began (0: at the first call's return, its compile done)
    window_steps: int = 0
    examples_per_step: int = 0  # global
    tokens_per_example: int = 1  # the model's throughput unit: tokens when > 1, else examples
    tokens_per_s: float = 0.0
    average_from: tuple[int, float] | None = None  # (step, time) of the first summary: compile excluded
    average_to: tuple[int, float] | None = None  # ... and of the last
    skipped_so_far: int = 0
    preempted: bool = False
    stop_reason: str = ""
    plots_due: bool = False
    plots_warned: bool = False

    def run(self, changed: list[str]) -> TrainResult:
        done = self.start(changed)
        if done is not None:
            return done
        exp = self.exp
        while self.step < exp.train.num_steps:
            self.train_call()
            if _due(self.step, exp.train.summary_interval_steps) or self.step == exp.train.num_steps:
                self.summarize()
            if _due(self.step, exp.train.eval_interval_steps):
                self.evaluate()
            if _due(self.step, exp.train.decode_interval_steps):
                self.decode()
            self.in_flight.make_room()  # a slow model: wait here, just before a stop request is read
            stopping = self.stop.agreed()
            if self.ckpt.should_save(self.step) or stopping or self.stop_reason or self.step == exp.train.num_steps:
                self.save()
            if self.plots_due and self.step < exp.train.num_steps:  # (the last step's are drawn by finish)
                self.draw_plots_meanwhile()
            if self.stop_reason and not stopping:
                self.ckpt.wait_until_finished()
                self.log(f"Stopping early at step {self.step}: {self.stop_reason} (train.early_stopping); saved a "
                         "checkpoint.")  # fmt: skip
                break
            if stopping:
                self.preempted = True
                self.ckpt.wait_until_finished()
                self.log(f"Stop requested ({self.stop.requested or 'by another host'}): saved a checkpoint at step "
                         f"{self.step}; exiting. Rerun the same command to resume from it.")  # fmt: skip
                break
        return self.finish()

    # -- opening: a fresh state or the newest checkpoint ------------------------------------
    def start(self, changed: list[str]) -> TrainResult | None:
        """Restores (or initialises) the state, writes config.json and opens the writers; a
        TrainResult when there is nothing to train (already at num_steps, stopped early)."""
        exp, ckpt, log = self.exp, self.ckpt, self.log
        self.early = EarlyStopping(exp.train.early_stopping)
        opened = open_state(self.rt, exp, ckpt, self.job_dir, self.start_point, log)
        self.step, self.state = opened.step, opened.state
        if opened.how == "resume":
            if self.step >= exp.train.num_steps:
                ckpt.close()
                log(f"{exp.name or 'The experiment'} in {self.job_dir} is already trained to step {self.step} "
                    f"(train.num_steps={exp.train.num_steps}): nothing to do. Raise --train.num-steps to train "
                    "further.")  # fmt: skip
                return TrainResult(self.step, {}, {}, False, 0.0, time.time() - self.started)
            self.early = EarlyStopping.restore(exp.train.early_stopping, opened.data_state)
            if self.early.stopped:
                ckpt.close()
                log(f"{exp.name or 'The experiment'} in {self.job_dir} stopped early at step {self.step}: "
                    f"{self.early.stopped} (train.early_stopping): nothing to do. Change train.early_stopping to "
                    "train further.")  # fmt: skip
                return TrainResult(self.step, {}, {}, False, 0.0, time.time() - self.started, self.early.stopped)
            restore_inputs(self.rt, exp, opened.data_state, log)
            log(f"Resuming {exp.name or 'experiment'} from checkpoint at step {self.step} in {self.job_dir}.")
        if self.primary:
            write_config(self.job_dir, exp.to_dict())
            record_command(self.job_dir, self.argv)
            self.log = log = tee_to_log(self.job_dir, log)
            if changed:
                afresh = ""
                if opened.how == "start point":
                    afresh = " (fine-tuning the imported step-0 checkpoint with them)"
                elif opened.how == "scratch":
                    afresh = " (no checkpoint to resume: this run starts afresh with them)"
                log(f"Config changes since the last run in this job dir{afresh}:\n  " + "\n  ".join(changed))
            for line in banner(
                exp, self.rt.programs.abstract_state.params, self.rt.programs.mesh, self.job_dir, self.step
            ):
                log(line)
        self.writer = _log_writes(ckpt, SummaryWriter, self.job_dir, enabled=self.primary, start_step=self.step)
        if self.primary and self.step < exp.train.num_steps:
            self.progress = Progress(
                exp.train.num_steps,
                self.step,
                heartbeat_s=self.heartbeat_s,
                events=_scheduled_events(exp),
                record=log_file(self.job_dir),
            )
            self.log = _noting_output(self.log, self.progress)
            self.progress.start_heartbeat()
        self.in_flight = InFlight(self.step, on_finish=self.progress.completed if self.progress else None)
        self.examples_per_step = exp.data.train.batch_size * jax.process_count()
        # Throughput in the model's unit: tokens (Pax's and nanoGPT's; a sequence-to-sequence
        # model's input + target tokens) where an example carries several, else examples.
        self.tokens_per_example = exp.model.tokens_per_example(exp.data)
        self.skipped_so_far = int(jax.device_get(skipped_steps(self.state.opt_state)))
        return None

    # -- the events of the loop ---------------------------------------------------------------
    def train_call(self) -> None:
        """One compiled call: a single step, or `train.steps_per_loop` of them (`_loop_length`)."""
        rt, n = self.rt, _loop_length(self.exp, self.step)
        if n == 1:
            batch = rt.programs.global_batch(_next_train_batch(self.train_input, self.step + 1, self.ckpt))
            _maybe_profile(self.exp, self.job_dir, self.step)
            self.state, self.outputs = rt.programs.train_step(self.state, batch)
        else:
            batches = [_next_train_batch(self.train_input, self.step + 1 + i, self.ckpt) for i in range(n)]
            self.state, self.outputs = rt.programs.train_steps(self.state, rt.programs.global_batches(batches))
        self.step += n
        self.window_steps += n
        self.window_start = self.window_start or time.time()  # the first call: compiled, now running
        self.in_flight.dispatched(self.step, n, self.outputs.metrics["total_loss"].value)
        if self.progress:
            self.progress.advance(self.step)

    def summarize(self) -> None:
        """The train metrics of the last step and the throughput since the last summary, to the
        log files and the progress bar (the loop's one host sync); stops on a non-finite loss."""
        self.in_flight.drain()
        metrics = step_scalars(*jax.device_get((self.outputs.metrics, self.outputs.summaries)))
        elapsed = max(time.time() - self.window_start, 1e-9)
        self.tokens_per_s = self.examples_per_step * self.tokens_per_example * self.window_steps / elapsed
        if self.tokens_per_example > 1:
            metrics["tokens_per_s"] = self.tokens_per_s
        metrics["examples_per_s"] = self.examples_per_step * self.window_steps / elapsed
        metrics["steps_per_s"] = self.window_steps / elapsed
        self.window_start, self.window_steps = time.time(), 0
        self.average_from = self.average_from or (self.step, self.window_start)
        self.average_to = (self.step, self.window_start)
        self.train_metrics = metrics
        _log_writes(self.ckpt, self.writer.write, self.step, "train", metrics)
        if self.progress:
            self.progress.update(self.step, metrics)
        _check_finite(self.exp, self.step, metrics, self.ckpt)
        self.skipped_so_far = _report_skipped(self.step, metrics, self.skipped_so_far, self.log)

    @contextlib.contextmanager
    def aside(self, doing: str):
        """Time that is no step's (an eval, a checkpoint, ...): told to the progress (its
        heartbeat says it, its ETA times it apart) and left out of the throughput's window. The
        steps in flight are waited for first, so their time stays theirs."""
        self.in_flight.drain()
        began = time.time()
        if self.progress:
            self.progress.doing(doing)
        try:
            yield
        finally:
            if self.progress:
                self.progress.doing(None)
            self.window_start += time.time() - began

    def evaluate(self) -> None:
        """An eval run, its metrics logged, and early stopping's verdict on them."""
        with self.aside("evaluating"):
            self.evaluate_and_log()
        self.stop_reason = self.early.update(self.step, self.eval_metrics)
        self.plots_due = True  # curves while it runs: drawn after this step's checkpoint (run)

    def draw_plots_meanwhile(self) -> None:
        """The curves so far. A courtesy while training: a failure (a full disk) is one warning and
        training goes on; `finish` draws them again, and there a failure stops the run."""
        try:
            with self.aside("drawing the plots"):
                self.draw_plots()
        except RunError as e:
            if not self.plots_warned:
                self.log(f"warning: {e.args[0].split('; ')[0]}; training goes on (they are drawn again at the end).")
            self.plots_warned = True

    def draw_plots(self) -> None:
        self.plots_due = False
        if self.primary:
            _log_writes(self.ckpt, write_plots, self.job_dir, what=f"drawing the plots in {self.job_dir / 'plots'}")

    def decode(self) -> None:
        with self.aside("decoding"):
            _decode_during_training(self.rt, self.state, self.step, self.ckpt, self.writer, self.log)

    def save(self) -> None:
        """A checkpoint of this step (asynchronous), after checking the loss is finite."""
        self.in_flight.drain()
        finite = {k: float(self.outputs.metrics[k].value) for k in ("total_loss", "grad_norm")}
        _check_finite(self.exp, self.step, finite, self.ckpt)
        with self.aside("saving a checkpoint"):
            data = input_states(self.rt, self.exp, self.early.riders())
            lora = self.exp.lora.enabled  # then the base is referenced, not saved
            state = lora_base.adapters_only(self.state) if lora else self.state
            self.ckpt.save(self.step, state, data, force=True, config=self.exp.to_dict())

    # -- closing: the last eval, plots, a sample, the summary line and what next ---------------
    def finish(self) -> TrainResult:
        exp, log = self.exp, self.log
        if self.progress:
            self.progress.close()
        if exp.profile.steps and self.primary and exp.profile.steps[0] < self.step <= exp.profile.steps[1]:
            jax.profiler.stop_trace()
        if not self.preempted and not _due(self.step, exp.train.eval_interval_steps):
            self.evaluate_and_log()
        self.ckpt.wait_until_finished()
        self.ckpt.close()
        _log_writes(self.ckpt, self.writer.close)
        self.draw_plots()
        wall = time.time() - self.started
        if not self.preempted and self.primary:
            if exp.train.sample_at_end:  # before the closing block, whose commands end the screen
                print_samples(self.rt, self.state, exp.decode, log=log)
            scores = declared_scores(self.eval_metrics or {}, self.exp.data.eval.metrics)
            log(_summary_line(self.step, self.train_metrics, self.eval_metrics, scores))
            for line in closing_block(exp, self.job_dir, wall, self.throughput()):
                log(line)
        return TrainResult(
            self.step, self.train_metrics, self.eval_metrics, self.preempted, self.tokens_per_s, wall, self.stop_reason
        )

    def throughput(self) -> str:
        """The run's average from its first summary to its last (the compile left out, evals
        included), beside the last window's."""
        unit = "tokens" if self.tokens_per_example > 1 else "examples"
        last = f"{self.tokens_per_s:,.0f} {unit}/s in the last window"
        if not (self.average_from and self.average_to and self.average_to[1] > self.average_from[1]):
            return last
        steps, seconds = self.average_to[0] - self.average_from[0], self.average_to[1] - self.average_from[1]
        average = steps * self.examples_per_step * self.tokens_per_example / seconds
        return f"{average:,.0f} {unit}/s over the run, evals included; last window {self.tokens_per_s:,.0f}"

    def evaluate_and_log(self) -> None:
        """An eval run and its metrics logged (at the end, when the last step was no eval step:
        early stopping has had its say)."""
        self.eval_metrics = _evaluate(self.rt, self.state, self.step, self.ckpt, self.log)
        _log_writes(self.ckpt, self.writer.write, self.step, "eval", self.eval_metrics)


def _scheduled_events(exp: ExperimentConfig) -> dict[str, int]:
    """What the loop does between steps on a schedule (`_Run.aside`'s names) -> every how many
    steps: the ETA adds their measured time once for each still to come."""
    return {
        "evaluating": exp.train.eval_interval_steps,
        "drawing the plots": exp.train.eval_interval_steps,
        "decoding": exp.train.decode_interval_steps,
        "saving a checkpoint": exp.checkpoint.every_n_steps,
    }


def _noting_output(log: Callable[[str], None], progress: Progress) -> Callable[[str], None]:
    """`log`, telling `progress` of each line (its heartbeat stays quiet while the run talks)."""

    def noted(line: str) -> None:
        log(line)
        progress.noted_output()

    return noted


def _due(step: int, interval: int) -> bool:
    """Whether an event every `interval` steps (0 = never) falls on `step`."""
    return bool(interval) and step % interval == 0


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
    model's keys, a task loss the model does not report or an early-stopping metric the eval
    does not report fails before anything is written.
    The batch is read and the input put back where it was: the run still starts with it."""
    position = train_input.get_state()
    try:
        first = train_input.get_next()
    except Exception:  # the loop reports a failing input with the step it failed at
        return
    finally:
        train_input.set_state(position)
    rt.programs.check_batch(first)
    watched = os.environ.get(WATCHED_METRIC_ENV)  # a tuner's trial: the study's metric
    if rt.exp.train.early_stopping.metric or watched:  # a misspelt metric: now, not at the first eval
        names = reported_names(rt.programs, first, rt.exp.data.eval.metrics, rt.exp.unfed_metrics())
        EarlyStopping(rt.exp.train.early_stopping).check_metric(names)
        if watched:
            check_watched_metric(watched, names)


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
        # A tracker that cannot start names its own fix (a login, an offline mode); a file's is disk space.
        fix = "Fix that" if isinstance(e.__cause__, TrackerError) else "Free space (or fix the permissions)"
        raise RunError(f"{cause}; {_kept(ckpt)}. {fix} and rerun the same command to resume.") from e


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


def _summary_line(step, train_m, eval_m, scores: str = "") -> str:
    """The run's result in one line (the wall time is the closing block's first line)."""

    def fmt(m, k):
        return f"{m[k]:.4f}" if k in m else "n/a"

    losses = f"train loss {fmt(train_m, 'total_loss')}, eval loss {fmt(eval_m, 'total_loss')}"
    return f"Finished at step {step}: {losses}{scores}"


def _maybe_profile(exp: ExperimentConfig, job_dir: Path, step: int) -> None:
    if not exp.profile.steps or jax.process_index() != 0:
        return
    first, last = exp.profile.steps
    if step == first:
        jax.profiler.start_trace(str(job_dir / "profile"))
    elif step == last + 1:
        jax.profiler.stop_trace()
