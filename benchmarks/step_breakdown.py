"""`python -m benchmarks.step_breakdown --exp NAME [--steps N] [--top K] [--reference] [overrides]`: where time goes.

`benchmarks.mfu` says how fast the train step is; this says why. It compiles the experiment's
real train step (as `benchmarks.mfu` does, synthetic tokens), times `--steps` steps untraced
(median), traces as many more under the JAX profiler, and joins every kernel in the trace to
the instruction of the optimized HLO that launched it (`benchmarks.hlo_ops`). It prints

- time per step by kind of work (matmul, attention, elementwise and reduction fusions,
  copies, collectives), with the matmuls' achieved TFLOP/s: how far the GEMMs are from the
  chip's rate, and how much of the step is memory-bound work around them;
- "busy": the union of kernel intervals, against the untraced step time (the rest is launch
  gaps and host time);
- the `--top` most expensive instructions, each with its jax source (`op_name`), shape and
  TFLOP/s,

and, as its last line, the same as one JSON object. `--reference` does the same for the
plain-JAX step `benchmarks.mfu` compares against (same shapes and policies) and prints the two
side by side, category by category: where a `ratio_to_reference` above 1 comes from.

CUDA-graph command buffers are turned off for the run (they hide the instructions from the
trace; on one H100 they made no difference to the step time, docs/performance.md). Kernels
that overlap (XLA:CPU's thunks on several threads, a GPU's collectives on their own stream) are
each counted whole, so the categories can add up to more than the step; "busy" counts
overlapping time once.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

import jax

from benchmarks import hlo_ops
from benchmarks.mfu import reference_step, synthetic_step, time_steps
from benchmarks.pgle import without_command_buffers
from pax_eqx.command_line import cli
from pax_eqx.programs.train.pgle import newest_trace_dir

Event = tuple[str, str, int, int]  # (hlo_op, device, start_ns, end_ns)
# Lines a trace viewer derives from a GPU's kernel lines; adding them would count time twice.
_DERIVED_LINES = {"XLA Ops", "XLA Modules", "Steps", "Framework Ops", "Framework Name Scope", "Source code"}


def kernel_events(trace_root: Path, module: str) -> list[Event]:
    """Every kernel of `module` in the newest trace under `trace_root`.

    GPU: the device planes' stream lines, one event per kernel; lines a trace viewer derives from
    them ("XLA Ops", "XLA Modules") are skipped. CPU: the host threads' XLA thunks, told apart by
    their `device_ordinal`. When nothing matches, the error lists the lines the trace has.
    """
    files = sorted(newest_trace_dir(trace_root).glob("*.xplane.pb"))
    if not files:
        raise FileNotFoundError(f"no *.xplane.pb under {trace_root}; the profiler wrote no trace.")
    data = jax.profiler.ProfileData.from_file(str(files[-1]))
    device = [p for p in data.planes if p.name.startswith("/device:")]
    own_module = re.compile(re.escape(module) + r"(?![\w.\-])")  # jit_train_step, not jit_train_step_2
    events: list[Event] = []
    seen_lines = []
    for plane in device or [p for p in data.planes if p.name.startswith("/host:CPU")]:
        lines = list(plane.lines)
        if device:  # kernels sit on "Stream #N(...)" lines; else everything but the derived lines
            streams = [line for line in lines if line.name.startswith("Stream")]
            lines = streams or [line for line in lines if line.name not in _DERIVED_LINES]
        for line in lines:
            seen_lines.append(f"{plane.name}/{line.name}")
            for event in line.events:
                stats = dict(event.stats)
                if "hlo_op" in stats and own_module.match(str(stats.get("hlo_module", ""))):
                    where = plane.name if device else f"cpu:{stats.get('device_ordinal', 0)}"
                    events.append((str(stats["hlo_op"]), where, event.start_ns, event.end_ns))
    if not events:
        raise RuntimeError(
            f"the trace in {trace_root} has no kernel of module {module!r}; its lines: {seen_lines[:20]}"
        )
    return events


def busy_ns(events: list[Event]) -> int:
    """Length of the union of the events' intervals, summed over devices: time a device was
    running at least one kernel."""
    total = 0
    for device in {ev[1] for ev in events}:
        total += _union_ns([(s, e) for _, d, s, e in events if d == device])
    return total


def _union_ns(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def breakdown(
    events: list[Event], ops: dict[str, hlo_ops.Op], steps: int, step_time_s: float, top: int = 15
) -> dict[str, Any]:
    """Per-step, per-device time by category and by instruction; matmul TFLOP/s from the HLO's
    FLOPs (the module is one device's program, so its FLOPs are per device too).

    Events of control-flow instructions (XLA:CPU times a while loop as one event around its
    body's) are dropped: their contents are counted already."""
    events = [ev for ev in events if ev[0] not in ops or ops[ev[0]].category != hlo_ops.CONTROL_FLOW]
    per = steps * len({ev[1] for ev in events})  # time summed over steps and devices -> per step and device
    per_op: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # name -> [ns, kernels]
    for name, _, s, e in events:
        per_op[name][0] += e - s
        per_op[name][1] += 1
    categories: dict[str, dict[str, float]] = defaultdict(lambda: {"time_s": 0.0, "kernels": 0.0, "flops": 0.0})
    rows = []
    for name, (ns, kernels) in per_op.items():
        op = ops.get(name)
        category = op.category if op else "not in the module"
        flops = op.flops * op.executions if op else 0.0
        time_s = ns / 1e9 / per
        c = categories[category]
        c["time_s"] += time_s
        c["kernels"] += kernels / per
        c["flops"] += flops
        rows.append({
            "op": name, "category": category, "time_s": time_s, "share": time_s / step_time_s,
            "tflops_per_s": flops / time_s / 1e12 if flops and time_s else None,
            "shape": op.shape if op else "", "source": op.source if op else "",
        })  # fmt: skip
    rows.sort(key=lambda r: -r["time_s"])
    summary = {
        name: {
            "time_s": c["time_s"], "share": c["time_s"] / step_time_s, "kernels_per_step": c["kernels"],
            "tflops_per_s": c["flops"] / c["time_s"] / 1e12 if c["flops"] and c["time_s"] else None,
        }
        for name, c in sorted(categories.items(), key=lambda kv: -kv[1]["time_s"])
    }  # fmt: skip
    busy = busy_ns(events) / 1e9 / per
    return {"step_time_s": step_time_s, "busy_s": busy, "categories": summary, "top_ops": rows[:top]}


def module_name(hlo_text: str) -> str:
    m = re.match(r"HloModule ([\w.\-]+)", hlo_text)
    if not m:
        raise ValueError("not an HLO module's text: it does not start with 'HloModule <name>'.")
    return m.group(1)


def _print(exp_name: str, r: dict[str, Any], steps: int) -> None:
    ms = lambda s: f"{s * 1e3:9.2f}"  # noqa: E731
    tf = lambda x: f"{x:8.1f}" if x else "        "  # noqa: E731
    step = r["step_time_s"]
    print(f"{exp_name}: step {step * 1e3:.1f} ms (median of {steps}, untraced); kernels busy "
          f"{r['busy_s'] * 1e3:.1f} ms/step ({r['busy_s'] / step:.1%}), the rest is launch gaps "
          "and host time")  # fmt: skip
    print(f"\n{'category':<20} {'ms/step':>9} {'of step':>8} {'kernels':>8} {'TFLOP/s':>8}")
    for name, c in r["categories"].items():
        print(f"{name:<20} {ms(c['time_s'])} {c['share']:8.1%} {c['kernels_per_step']:8.0f} {tf(c['tflops_per_s'])}")
    print(f"\ntop {len(r['top_ops'])} instructions:")
    print(f"{'ms/step':>9} {'of step':>8} {'TFLOP/s':>8}  category / instruction / shape / source")
    for row in r["top_ops"]:
        print(f"{ms(row['time_s'])} {row['share']:8.1%} {tf(row['tflops_per_s'])}  "
              f"{row['category']} / {row['op']} / {row['shape'][:60]} / {row['source'][-90:]}")  # fmt: skip


def profile(compiled: Any, state: Any, batch: Any, steps: int, top: int) -> dict[str, Any]:
    """Times `steps` calls of a compiled `(state, batch) -> (state, out)` step untraced, traces as
    many more, and breaks the trace down (`breakdown`). `state` is donated and used up."""
    hlo = compiled.as_text()
    step = lambda s: compiled(s, batch)  # noqa: E731
    times, state = time_steps(step, state, warmup=1, steps=steps)
    with tempfile.TemporaryDirectory() as trace:
        with jax.profiler.trace(trace):
            time_steps(step, state, warmup=0, steps=steps)
        events = kernel_events(Path(trace), module_name(hlo))
    ops = hlo_ops.index_module(hlo)
    result = breakdown(events, ops, steps, statistics.median(times), top)
    result["all_loops_counted"] = all(op.counted for op in ops.values())
    return result


def main(argv: Sequence[str] | None = None) -> int:
    without_command_buffers()
    exp, _, ns = cli.parse(
        argv, "python -m benchmarks.step_breakdown", "Where an experiment's train step spends its time, by kernel.",
        job_dir_required=False,
        extra=[
            ("--steps", dict(type=int, default=5)),
            ("--top", dict(type=int, default=15)),
            ("--reference", dict(action="store_true")),
        ],
    )  # fmt: skip
    if ns.steps < 1:
        raise cli.fail(f"--steps must be >= 1, got {ns.steps}: pass --steps 5.")
    programs, state, batch = synthetic_step(exp)
    compiled = programs.train_step.lower(state, batch).compile()
    result = profile(compiled, state, batch, ns.steps, ns.top)
    _print(exp.name, result, ns.steps)
    report = {"exp": exp.name, "device_kind": jax.devices()[0].device_kind, **result}
    if ns.reference:  # the plain-JAX step of the same shapes (benchmarks.mfu's), side by side
        del state, compiled
        report["reference"] = _reference(exp, ns.steps, ns.top)
        _print(f"{exp.name}, plain-JAX reference", report["reference"], ns.steps)
        _print_comparison(result, report["reference"])
    if not all(r.get("all_loops_counted", True) for r in (result, report.get("reference", {}))):
        print("note: some instructions sit in loops XLA gave no trip count; their FLOPs count one run.")
    print(json.dumps(report))
    return 0


def _reference(exp, steps: int, top: int) -> dict[str, Any]:
    step, state, batch = reference_step(exp)
    return profile(step.lower(state, batch).compile(), state, batch, steps, top)


def _print_comparison(ours: dict[str, Any], ref: dict[str, Any]) -> None:
    """Time per step of each category, both steps, and what pax_eqx spends more (+) or less (-)."""
    rows = {name: (c["time_s"], 0.0) for name, c in ours["categories"].items()}
    for name, c in ref["categories"].items():
        rows[name] = (rows.get(name, (0.0, 0.0))[0], c["time_s"])
    rows["kernels busy"] = (ours["busy_s"], ref["busy_s"])
    rows["step"] = (ours["step_time_s"], ref["step_time_s"])
    print(f"\n{'ms/step':<20} {'pax_eqx':>9} {'reference':>10} {'difference':>11}")
    for name, (a, b) in rows.items():
        print(f"{name:<20} {a * 1e3:9.2f} {b * 1e3:10.2f} {(a - b) * 1e3:+11.2f}")


if __name__ == "__main__":
    from pax_eqx.command_line import entry

    entry.run(lambda: main(sys.argv[1:]))
