"""Step time of a small LM sharded over 8 fake CPU devices vs one device, same global batch.

    python -m benchmarks.sharded_step [--steps 20]

CPU "devices" share the same two cores, so this measures the framework's sharding overhead
(collectives, resharding, partitioned programs), not a speed-up. Prints one line per mesh and,
last, a JSON object with the median step times and their ratio to one device.
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

from pax_eqx.learners import LearnerConfig  # noqa: E402
from pax_eqx.models import LanguageModelConfig  # noqa: E402
from pax_eqx.programs.compiled import Programs  # noqa: E402
from pax_eqx.sharding.mesh import MeshConfig, build_mesh  # noqa: E402
from pax_eqx.tasks.task import Task  # noqa: E402

MODEL = LanguageModelConfig(vocab_size=256, max_seq_len=128, num_layers=4, model_dims=128, hidden_dims=512, num_heads=4)
MESHES = {"1 device": ((1, 1, 1), 1), "data (8,1,1)": ((8, 1, 1), 8), "fsdp (1,8,1)": ((1, 8, 1), 8),
          "tensor (1,1,8)": ((1, 1, 8), 8), "mixed (2,2,2)": ((2, 2, 2), 8)}  # fmt: skip


def median_step_time(ici, n_devices, steps: int, batch: int = 16, seq: int = 128) -> float:
    mesh = build_mesh(MeshConfig(ici_mesh_shape=ici), jax.devices()[:n_devices])
    programs = Programs(Task(MODEL, LearnerConfig(learning_rate=1e-3)), mesh)
    state = programs.init_state(0)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 256, (batch, seq + 1)).astype(np.int32)
    b = {"ids": ids[:, :-1], "labels": ids[:, 1:], "weights": np.ones((batch, seq), np.float32)}
    gb = programs.global_batch(b)
    times = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        state, metrics = programs.train_step(state, gb)
        jax.block_until_ready(metrics["total_loss"])
        if i >= 2:  # the first two include compilation
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    results = {}
    for name, (ici, n) in MESHES.items():
        results[name] = median_step_time(ici, n, args.steps)
        print(f"{name:16s} median step {results[name] * 1e3:8.1f} ms  ratio {results[name] / results['1 device']:.2f}")
    base = results["1 device"]
    print(json.dumps({"step_time_s": results, "ratio_to_one_device": {k: v / base for k, v in results.items()}}))


if __name__ == "__main__":
    main()
