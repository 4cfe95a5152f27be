"""`python -m benchmarks.interleave --exp NAME [--rounds R] [--steps-per-round S] -- 'FLAGS A' 'FLAGS B' ...`

Times several variants of one experiment's real train step (each a string of experiment
overrides; '' is the experiment as registered) in one process, round-robin: every round runs
each variant for S steps in turn. On a shared machine whose load drifts, variants timed
minutes apart in separate processes are not comparable; interleaved, each round sees about
the same load for every variant, and the ratio of their medians holds. Prints, per variant,
the median step (wall) and its ratio to the first variant, and the median CPU time a step used
(all threads of the process: on a machine shared with other jobs it moves less with their load
than the wall time does), then one JSON line.

XLA flags are process-wide (read once, before jax starts), so they cannot be compared this
way: compare those with two processes over several runs each.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from typing import Any, Sequence

import jax

from benchmarks.mfu import synthetic_step
from pax_eqx.command_line import cli


def build(exp_name: str, flags: str) -> Any:
    """A variant's compiled step as a function of the state, and its initial state."""
    exp, _, _ = cli.parse(["--exp", exp_name, *shlex.split(flags)], "interleave", "", job_dir_required=False)
    programs, state, data = synthetic_step(exp)
    compiled = programs.train_step.lower(state, data).compile()

    def step(s):
        s, outputs = compiled(s, data)
        return s, outputs.metrics["total_loss"].value

    return step, state


def run(exp_name: str, variants: Sequence[str], rounds: int, steps_per_round: int, log=print) -> dict[str, Any]:
    built = [build(exp_name, v) for v in variants]
    steps = [b[0] for b in built]
    states = [b[1] for b in built]
    times: list[list[float]] = [[] for _ in variants]
    cpu: list[list[float]] = [[] for _ in variants]
    for i, step in enumerate(steps):  # warm-up
        for _ in range(2):
            states[i], out = step(states[i])
            jax.block_until_ready(out)
    for _ in range(rounds):
        for i, step in enumerate(steps):
            for _ in range(steps_per_round):
                start, start_cpu = time.perf_counter(), time.process_time()
                states[i], out = step(states[i])
                jax.block_until_ready(out)
                times[i].append(time.perf_counter() - start)
                cpu[i].append(time.process_time() - start_cpu)
    medians = [statistics.median(t) for t in times]
    cpu_medians = [statistics.median(c) for c in cpu]
    log(f"{'wall ms':>8}  {'IQR':>13}  {'ratio':>6}  {'cpu ms':>7}  {'ratio':>6}  variant")
    for v, m, t, c in zip(variants, medians, times, cpu_medians):
        q = statistics.quantiles(t, n=4)
        spread = f"{q[0] * 1e3:.1f}-{q[2] * 1e3:.1f}"
        log(f"{m * 1e3:8.1f}  {spread:>13}  {m / medians[0]:6.3f}  {c * 1e3:7.1f}  {c / cpu_medians[0]:6.3f}  "
            f"{v or '(as registered)'}")  # fmt: skip
    return {
        "exp": exp_name, "variants": list(variants), "median_s": medians, "cpu_median_s": cpu_medians,
        "steps": len(times[0]),
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.interleave", description=__doc__.split("\n\n")[1])
    parser.add_argument("--exp", default=cli.DEFAULT_EXPERIMENT)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps-per-round", type=int, default=5)
    parser.add_argument("variants", nargs="+", help="one string of overrides per variant ('' = as registered)")
    ns = parser.parse_args(argv)
    print(json.dumps(run(ns.exp, ns.variants, ns.rounds, ns.steps_per_round)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
