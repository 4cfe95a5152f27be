"""Context parallelism's activation memory: XLA's compiled train step per device, for N context shards.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m benchmarks.context_parallel_memory
    XLA_FLAGS=--xla_force_host_platform_device_count=32 python -m benchmarks.context_parallel_memory \\
        --exp lm_long_context_32k --shards 8 16 32                # 32k, compiled only (not CI)

For each N of --shards, the experiment's real train step (`Programs.train_step`: its jit, state and
input shardings, donation) on a mesh of N devices that all split the sequence, ICI (stage, data,
fsdp, context, tensor) = (1, 1, 1, N, 1), is lowered and compiled, not run. XLA's
`memory_analysis()` gives per device its temporaries (`temp_size_in_bytes`: the activations the
backward keeps, one layer's working set, the attention scores, gradients before the update) and
its arguments (the state, replicated over `context`, and the batch). At a long sequence and a tiny
width the temporaries are the activations, and they should fall as 1/N: each device holds S / N
tokens of every row and [S / N, S] scores a head. The dry run's activation estimate for the same
layout (`models/lm_plan.py`) is printed beside it.

--steps K then runs K training steps on the last N (tokens of a fixed random stream) and prints each
step's seconds and loss. At 32k on fake CPU devices that needs the host memory of all N devices
together, 8 x 7 GiB at N = 8 (docs/long_context.md): more than a 23 GiB machine has.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from pax_eqx.command_line import registry  # noqa: E402
from pax_eqx.programs.compiled import Programs  # noqa: E402
from pax_eqx.programs.plan.dry_run import MemoryModel  # noqa: E402
from pax_eqx.programs.runtime import build_task  # noqa: E402
from pax_eqx.sharding.mesh import build_mesh  # noqa: E402

MIB = 2**20


def with_shards(exp, n: int, seq: int | None):
    """`exp` on n devices that all split the sequence (and at `seq` tokens a row, when given)."""
    if seq:
        exp = exp.replace(model=exp.model.replace(max_seq_len=seq), data=exp.data.replace(seq_len=seq))
    return exp.replace(mesh=exp.mesh.replace(ici_mesh_shape=(1, 1, 1, n, 1), dcn_mesh_shape=(1, 1, 1)))


def batch_of(exp, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One host batch of the LM's inputs: random tokens, one document a row."""
    rows, seq = exp.data.train.batch_size, exp.data.seq_len
    ids = rng.integers(0, exp.model.vocab_size, (rows, seq + 1)).astype(np.int32)
    return {
        "ids": ids[:, :-1],
        "labels": ids[:, 1:],
        "weights": np.ones((rows, seq), np.float32),
        "segment_ids": np.ones((rows, seq), np.int32),
        "segment_pos": np.tile(np.arange(seq, dtype=np.int32), (rows, 1)),
    }


def compiled_memory(programs: Programs, exp) -> object:
    """XLA's memory analysis of the compiled train step, per device."""
    state = programs.abstract_with_shardings()
    local = batch_of(exp, np.random.default_rng(0))
    batch = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=programs.input_sharding(v.shape)) for k, v in local.items()
    }
    return programs.train_step.lower(state, batch).compile().memory_analysis()


def table(name: str, shards: list[int], seq: int | None) -> tuple[list[str], Programs, object]:
    base = registry.load_experiment(name)
    rows, programs, exp = [], None, None
    first = None
    for n in shards:
        exp = with_shards(base, n, seq)
        exp.validate(data_files=False)
        programs = Programs(build_task(exp), build_mesh(exp.mesh, jax.devices()[:n]), exp.mesh.rules)
        m = compiled_memory(programs, exp)
        planned = MemoryModel(exp).bytes_for(exp).activations
        first = first or m.temp_size_in_bytes
        rows.append(
            f"| {n} | {exp.data.seq_len // n} | {m.temp_size_in_bytes / MIB:.1f} | {first / m.temp_size_in_bytes:.2f}x "
            f"| {planned / MIB:.1f} | {m.argument_size_in_bytes / MIB:.2f} |"
        )
        print(rows[-1], flush=True)
    return rows, programs, exp


def run_steps(programs: Programs, exp, steps: int) -> None:
    state = programs.init_state(0)
    rng = np.random.default_rng(0)
    for step in range(steps):
        batch = programs.global_batch(batch_of(exp, rng))
        start = time.perf_counter()
        state, outputs = programs.train_step(state, batch)
        loss = float(outputs.metrics["total_loss"].value)
        print(f"step {step + 1}: {time.perf_counter() - start:.1f} s, loss {loss:.4f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--exp", default="lm_long_context")
    parser.add_argument("--seq", type=int, default=0, help="tokens a row (0: the experiment's)")
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--steps", type=int, default=0, help="then train this many steps on the last --shards")
    args = parser.parse_args()
    exp = registry.load_experiment(args.exp)
    seq = args.seq or exp.data.seq_len
    m = exp.model
    print(
        f"{args.exp}: seq {seq}, batch {exp.data.train.batch_size}, {m.num_layers} layers of width {m.model_dims}, "
        f"{m.num_heads} heads ({m.num_kv_heads or m.num_heads} kv), remat {m.remat_policy}, "
        f"{exp.train.fprop_dtype}, on {jax.devices()[0].platform}"
    )
    print("| context shards N | tokens a device | XLA temporaries MiB a device | first row / this row "
          "| dry-run activations MiB | arguments MiB |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    _, programs, last = table(args.exp, args.shards, args.seq or None)
    if args.steps:
        run_steps(programs, last, args.steps)


if __name__ == "__main__":
    main()
