"""One evaluation run, following Pax's reset_for_eval x eval_loop_num_batches table.

reset_for_eval=True: the eval input is reset and read to StopIteration (one epoch; every host
stops after the same number of batches, padded rows carrying zero weight). Otherwise the next
`eval_loop_num_batches` batches of a repeating input are read, so successive runs roll over
non-overlapping data. Each metric is merged by its own weight (pax_eqx.metrics), so padded
rows never count; layer summaries are averaged over the batches.

A batch's outputs are fetched to the host after the next batch's step has been dispatched, so
the device is never idle while the host reads the input and merges metrics (one batch in
flight; no more outputs held than that).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from pax_eqx.config import ConfigError
from pax_eqx.data import eval_num_batches
from pax_eqx.job.errors import DataPipelineError, raised_at
from pax_eqx.metric_fns import EvalContext, resolve
from pax_eqx.metrics import HostAccumulator
from pax_eqx.programs.evaluate import eval_metrics
from pax_eqx.programs.evaluate.decoded_eval import decoded_scores
from pax_eqx.summaries import mean_summaries, step_scalars, with_loss_alias

# The tuner runs each trial's trainer with the study's metric in this variable; the trainer
# checks it against its eval's names at start (`check_watched_metric`), so a misspelt --metric
# costs the first trial's start, not its run up to the first eval.
WATCHED_METRIC_ENV = "PAX_EQX_WATCHED_METRIC"
WATCHED_METRIC_ERROR = "--metric "  # how the trainer's error line starts, for the tuner to tell it apart


def evaluate(rt: Any, state: Any, log: Callable = print, *, files_dir: Any = None) -> dict[str, float]:
    """One eval run's metrics. Files an eval metric writes (the confusion matrix) go under
    `files_dir` (default: the job dir; a separate `eval` passes its own, beside the trainer's)."""
    cfg = rt.exp.data.eval
    source = rt.input("eval")
    num_batches = eval_num_batches(cfg)
    step = int(jax.device_get(state.step))
    if cfg.reset_for_eval:
        source.reset()
    else:  # a rolling window: where it starts, for `eval` on this step's checkpoint to read it again
        rt.last_eval_window = {"state": source.get_state(), "first": rt.eval_batches_read + 1, "step": step}
    unfed = rt.exp.unfed_metrics()  # an experiment's own metric another model cannot feed: skipped
    kinds = {name: resolve(name).kind for name in cfg.metrics if name not in unfed}
    score_names = [n for n, kind in kinds.items() if kind == "scores"]
    decoded_names = [n for n, kind in kinds.items() if kind == "decoded"]
    metrics = HostAccumulator()
    summaries = []
    per_example = []
    read = []  # the host batches, for the metrics on decoded outputs
    count = 0
    in_flight = None

    def merge(device_outputs: Any) -> None:
        outputs = jax.device_get(device_outputs)
        metrics.add(outputs.metrics)
        summaries.append(outputs.summaries)
        if score_names:
            per_example.append(outputs.per_example)

    while num_batches is None or count < num_batches:
        try:
            local = source.get_next()
        except StopIteration:
            break
        except Exception as e:
            raise DataPipelineError(
                f"the eval input failed while reading eval batch {count + 1}: {type(e).__name__}: {e}"
                f"{raised_at(e)}. Fix data.eval (or its files) and rerun the same command (set "
                "PAX_EQX_TRACEBACK=1 for the full traceback)"
            ) from e
        outputs = rt.programs.eval_step(state, rt.programs.global_batch(local))
        if decoded_names:
            read.append(local)
        if in_flight is not None:
            merge(in_flight)
        in_flight = outputs
        count += 1
    if in_flight is not None:
        merge(in_flight)
    if count == 0:
        raise ConfigError("the eval input produced no batches; check data.eval (path, split, batch_size).")
    merged = metrics.result()
    result = step_scalars(merged, mean_summaries(summaries))
    result["num_predictions"] = float(merged["total_loss"].weight)
    result["num_batches"] = float(count)
    which = which_batches(cfg, rt.eval_batches_read, count)
    rt.eval_batches_read += count
    job_dir = (rt.job_dir if files_dir is None else files_dir) if jax.process_index() == 0 else None
    if score_names:
        rows = eval_metrics.real_rows(per_example)
        result.update(eval_metrics.score(score_names, rows, merged, EvalContext(rt.tokenizer, job_dir, step)))
    if decoded_names:
        result.update(decoded_scores(rt, state, read, decoded_names, step, job_dir, log))
    if "log_pplx" in result:  # Pax reports a language model's perplexity beside its log
        result["pplx"] = float(np.exp(min(result["log_pplx"], 50.0)))
    shown = "".join(f", {k} {result[k]:.4f}" for k in ("accuracy",) if k in result)
    log(f"eval: loss {result['total_loss']:.4f}{shown}{declared_scores(result, cfg.metrics)}, {which}")
    return result


def which_batches(cfg: Any, before: int, count: int) -> str:
    """Which eval batches a run read, for the eval line: "all 613 batches" of the eval split
    (reset_for_eval: the same every run, so `eval` on the checkpoint reads them too), or
    "batches 151-200" of a rolling stream (Pax's reset_for_eval=False: each run reads the next
    ones; `eval` on a checkpoint written at an eval's step reads that eval's batches again,
    input_positions.replay_eval_window)."""
    if cfg.reset_for_eval:
        return f"all {count} batches"
    return f"batches {before + 1}-{before + count}"


def declared_scores(result: dict[str, float], metrics: tuple[str, ...]) -> str:
    """ ", bits_per_byte 1.9123, bleu 12.4000": what the input's declared metrics reported."""
    names = [name for metric in metrics for name in resolve(metric).reports if name in result]
    return "".join(f", {name} {result[name]:.4f}" for name in names)


def check_watched_metric(metric: str, names: set[str]) -> None:
    """ConfigError (exit 2) when the tuner's `metric` is not one of the eval's `names`."""
    if metric not in names:
        raise ConfigError(
            f"{WATCHED_METRIC_ERROR}{metric!r} is not an eval metric of this experiment; its evals report "
            f"{', '.join(sorted(names))}. Pass --metric with one of them."
        )


def reported_names(
    programs: Any, local: dict[str, np.ndarray], metrics: tuple[str, ...] = (), unfed: Any = ()
) -> set[str]:
    """The names an eval run reports (what `evaluate` returns), known before any eval from the
    eval step's abstract outputs on a host batch's shapes: `train.early_stopping.metric` is
    checked against them at start, not at the first eval after checkpoints are written.
    metrics: data.eval.metrics, whose scores an eval adds (each metric's `reports`), less the
    `unfed` ones, which it skips."""
    abstract = jax.eval_shape(programs.task.eval_step, programs.abstract_state, programs.abstract_batch(local))
    outputs = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), abstract)
    names = set(step_scalars(outputs.metrics, mean_summaries([outputs.summaries] if outputs.summaries else [])))
    reported = {name for metric in metrics for name in resolve(metric).reports}
    reported -= {name for metric in unfed for name in resolve(metric).reports}
    names |= {"num_predictions", "num_batches"} | reported | ({"pplx"} if "log_pplx" in names else set())
    return set(with_loss_alias(dict.fromkeys(names)))
