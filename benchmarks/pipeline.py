"""Step time of a pipelined LM on 8 fake CPU devices: the bubble's shape, and the cost of pipelining.

    python -m benchmarks.pipeline [--steps 10]

Fake CPU devices share the machine's cores, so no schedule runs faster here than its total
work. That is what makes the bubble measurable: every pipeline iteration runs all S stages, the
bubble ones on garbage, so a step does (M R + S - 1) / (M R) times the work of the layers alone.
With the per-step rest (embedding, loss, optimizer, dispatch) t_0, the model is

    t(M) = t_0 + t_layers x (M R + S - 1) / (M R)

The benchmark times S = 4 stages on 4 devices at M = 1, 2, 4, 8, 16 (GPipe) and M = 4 with R = 2
(circular), fits t_0 and t_layers to the GPipe points' CPU times by least squares, and prints
each measured time beside the model's, then the ratio of each pipelined step to the unpipelined
step on the same 8 devices and batch (stage 2 x data 2 x fsdp 2 against data 2 x fsdp 2 x
tensor 2). Last, a JSON object with every number.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from pax_eqx.layers.pipeline import PipelineConfig  # noqa: E402
from pax_eqx.learners import LearnerConfig  # noqa: E402
from pax_eqx.models import LanguageModelConfig  # noqa: E402
from pax_eqx.programs.compiled import Programs  # noqa: E402
from pax_eqx.sharding.mesh import MeshConfig, build_mesh  # noqa: E402
from pax_eqx.tasks.task import Task  # noqa: E402

MODEL = LanguageModelConfig(vocab_size=256, max_seq_len=64, num_layers=8, model_dims=128, hidden_dims=512, num_heads=4)
BATCH, SEQ = 32, 64


def median_step_time(model: LanguageModelConfig, ici: tuple[int, ...], steps: int) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds of this process) per step. The CPU time is every
    fake device's work summed, whatever else the machine runs: the measure the bubble model is
    about, and steady on a shared machine where wall time is not."""
    devices = jax.devices()[: int(np.prod(ici))]
    mesh = build_mesh(MeshConfig(ici_mesh_shape=ici), devices)
    programs = Programs(Task(model, LearnerConfig(learning_rate=1e-3)), mesh)
    state = programs.init_state(0)
    ids = np.random.default_rng(0).integers(0, 256, (BATCH, SEQ + 1)).astype(np.int32)
    batch = programs.global_batch(
        {"ids": ids[:, :-1], "labels": ids[:, 1:], "weights": np.ones((BATCH, SEQ), np.float32)}
    )
    wall, cpu = [], []
    for i in range(steps + 2):
        t0, c0 = time.perf_counter(), time.process_time()
        state, outputs = programs.train_step(state, batch)
        jax.block_until_ready(outputs.metrics["total_loss"].value)
        if i >= 2:  # the first two include compilation
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def pipelined(stages: int, microbatches: int, repeat: int = 1) -> LanguageModelConfig:
    return MODEL.replace(
        pipeline=PipelineConfig(num_stages=stages, num_microbatches=microbatches, circular_repeat=repeat)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    stages = 4
    points = []  # (M, R, wall seconds, CPU seconds)
    for m, r in ((1, 1), (2, 1), (4, 1), (8, 1), (16, 1), (4, 2)):
        points.append((m, r, *median_step_time(pipelined(stages, m, r), (stages, 1, 1, 1), args.steps)))
    work = lambda m, r: (m * r + stages - 1) / (m * r)
    gpipe = [(work(m, r), cpu) for m, r, _, cpu in points if r == 1]
    (t_layers, t_0), *_ = np.linalg.lstsq(np.array([[w, 1.0] for w, _ in gpipe]), np.array([t for _, t in gpipe]))
    print(f"S = {stages} stages on {stages} fake devices, 8 layers, batch {BATCH} x {SEQ}; CPU time per step fit: "
          f"t(M) = {1e3 * t_0:.0f} ms + {1e3 * t_layers:.0f} ms x (M R + S - 1) / (M R)")  # fmt: skip
    print(f"{'M':>3} {'R':>2} {'bubble':>7} {'CPU ms':>8} {'model ms':>9} {'wall ms':>8}")
    rows = []
    for m, r, wall, cpu in points:
        bubble = PipelineConfig(num_stages=stages, num_microbatches=m, circular_repeat=r).bubble_fraction
        model = t_0 + t_layers * work(m, r)
        rows.append({"microbatches": m, "repeat": r, "bubble": bubble, "cpu_ms": 1e3 * cpu, "model_ms": 1e3 * model,
                     "wall_ms": 1e3 * wall})  # fmt: skip
        print(f"{m:>3} {r:>2} {bubble:>7.1%} {1e3 * cpu:>8.0f} {1e3 * model:>9.0f} {1e3 * wall:>8.0f}")
    plain_wall, plain_cpu = median_step_time(MODEL, (1, 2, 2, 2), args.steps)
    ratios = {}
    for m in (4, 8):
        wall, cpu = median_step_time(pipelined(2, m), (2, 2, 2, 1), args.steps)
        ratios[f"stage2_M{m}"] = {"cpu": cpu / plain_cpu, "wall": wall / plain_wall}
        bubble = PipelineConfig(num_stages=2, num_microbatches=m).bubble_fraction
        print(
            f"stage 2 x data 2 x fsdp 2, M = {m} (bubble {bubble:.0%}): "
            f"CPU {1e3 * cpu:.0f} ms = {cpu / plain_cpu:.2f}x, wall {1e3 * wall:.0f} ms = {wall / plain_wall:.2f}x "
            f"the unpipelined (2, 2, 2) step (CPU {1e3 * plain_cpu:.0f} ms, wall {1e3 * plain_wall:.0f} ms)"
        )
    print(json.dumps({"fit_cpu_ms": {"t_0": 1e3 * t_0, "t_layers": 1e3 * t_layers}, "points": rows,
                      "unpipelined_ms": {"cpu": 1e3 * plain_cpu, "wall": 1e3 * plain_wall},
                      "pipelined_over_unpipelined": ratios}))  # fmt: skip


if __name__ == "__main__":
    main()
