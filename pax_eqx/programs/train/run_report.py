"""What a training run says about itself: a banner when it starts, a closing block when it ends.

The banner answers what a person checks first (is this the run I meant?): the experiment, its
parameters in total and by top-level group, the devices and mesh, the global batch and what one
step reads, the steps to go and the job dir. The closing block says where everything went and
the commands that read it back, written for this job dir so they can be pasted as they are.
Both are lists of lines, one fact each, written to fit 80 columns (a line is added by adding
it to the list); a terminal narrower than a line gets it wrapped between words
(screen_lines.print_fitted).
"""

from __future__ import annotations

import shlex
from collections import defaultdict
from pathlib import Path
from typing import Any

import jax
import jax.tree_util as jtu

from pax_eqx.programs.train.screen_lines import ShellCommand
from pax_eqx.summaries.progress import format_duration


def banner(exp: Any, params: Any, mesh: Any, job_dir: Path, step: int) -> list[str]:
    """The run's introduction (`params`: the parameter tree, arrays or shapes)."""
    groups: dict[str, int] = defaultdict(int)
    for path, leaf in jtu.tree_leaves_with_path(params):
        groups[_top(path)] += int(leaf.size)
    total = sum(groups.values())
    by_group = ", ".join(f"{name} {_count(n)}" for name, n in sorted(groups.items(), key=lambda kv: -kv[1]))
    batch = exp.data.train.batch_size * jax.process_count()
    per_example = exp.model.tokens_per_example(exp.data)
    reads = f"{batch * per_example:,} tokens" if per_example > 1 else f"{batch:,} examples"
    devices = jax.devices()
    axes = ", ".join(f"{name} {size}" for name, size in mesh.shape.items() if size > 1) or "one device"
    todo = exp.train.num_steps - step
    metrics = []
    if exp.data.eval.metrics:
        unfed = exp.unfed_metrics()
        used = [m for m in exp.data.eval.metrics if m not in unfed]
        skipped = f"; skipped {', '.join(unfed)} (this model or data cannot feed it)" if unfed else ""
        metrics = [f"  metrics  {', '.join(used) or 'none'} at each eval{skipped}"]
    note = exp.learner.schedule.note_for_run(exp.train.num_steps)  # a run that ends before its schedule does
    schedule = [f"  schedule {note}"] if note else []
    return [
        f"Experiment {exp.name or '(unnamed)'} ({type(exp.model).__name__})",
        f"  params   {_count(total)}: {by_group}",
        f"  devices  {len(devices)} x {devices[0].device_kind} ({jax.process_count()} process(es)); mesh: {axes}",
        f"  batch    {batch:,} per step ({reads}); {exp.train.fprop_dtype} compute, float32 parameters",
        f"  steps    {step:,} -> {exp.train.num_steps:,} ({todo:,} to go), eval every "
        f"{exp.train.eval_interval_steps or 'run end'}, checkpoint every {exp.checkpoint.every_n_steps or '-'}",
        *metrics,
        *schedule,
        f"  job dir  {job_dir}",
    ]


def closing_block(exp: Any, job_dir: Path, wall_s: float, throughput: str) -> list[str]:
    """How long the run took and what it measured, where its files are, and the commands that
    read them back (each on a line of its own, to paste as it is: a `ShellCommand`, which a
    narrow terminal continues with a backslash rather than breaking). Every line but a command
    with a long job dir fits 80 columns."""
    d = shlex.quote(str(job_dir))
    lines = [
        f"  wall time    {format_duration(wall_s)} (the compile, evals and checkpoints included)",
        f"  throughput   {throughput}",
        "  job dir      checkpoints/ plots/ metrics.jsonl train.log command.txt",
        ShellCommand(f"  curves       python -m pax_eqx.plots {d}"),
        ShellCommand(f"  evaluate     python -m pax_eqx.eval --job-log-dir {d}"),
    ]
    if exp.model.decodes:
        lines.append(
            ShellCommand(
                f'  decode       python -m pax_eqx.decode --job-log-dir {d} --prompt "{exp.decode.prompt or "..."}"'
            )
        )
    lines += [
        ShellCommand(f"  TensorBoard  tensorboard --logdir {shlex.quote(str(job_dir / 'summaries'))}"),
        "  resume       the same train command again",
    ]
    return lines


def _top(path: tuple) -> str:
    """The first named part of a parameter's path (embedding, stack, final_norm, ...)."""
    for entry in path:
        if isinstance(entry, jtu.GetAttrKey):
            return entry.name
        if isinstance(entry, jtu.DictKey):
            return str(entry.key)
    return "params"


def _count(n: int) -> str:
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f}{suffix}"
    return str(n)
