"""Manual PGLE (the Pax README's GPU workflow), as one command.

    python -m benchmarks.pgle --exp gpt3_xl --job-log-dir runs/pgle [--steps 5] [overrides]

1. runs `--steps` train steps of the experiment on synthetic data under the JAX profiler
   (trace in DIR/pgle_trace/),
2. converts the trace into XLA's ProfiledInstructionsProto, DIR/profile.pb,
3. prints the flag for the second run, which feeds the measured latencies to XLA's scheduler:

    XLA_FLAGS="--xla_gpu_enable_command_buffer= --xla_gpu_pgle_profile_file_or_directory_path=DIR/profile.pb" \
        python -m benchmarks.mfu --exp gpt3_xl

The profiling run turns XLA's CUDA-graph command buffers off (`--xla_gpu_enable_command_buffer=`,
added to XLA_FLAGS before JAX starts): with them on, the trace times whole command buffers
(`command_buffer_89`), not instructions, and the profile names nothing the scheduler can use
(measured on an H100: 150 bytes of command buffers vs 7 KB of instruction latencies).

On CPU the profile has no instruction latencies (XLA records them on NVIDIA GPUs only); the
command then says so and writes nothing. Automatic PGLE is `--profile.auto-pgle` on train.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

import jax

from benchmarks.mfu import synthetic_step
from pax_eqx.command_line import cli
from pax_eqx.programs.train.pgle import write_profile, xla_flag

NO_COMMAND_BUFFERS = "--xla_gpu_enable_command_buffer="


def without_command_buffers() -> None:
    """Adds NO_COMMAND_BUFFERS to XLA_FLAGS, which XLA reads when the backend starts: call it
    before anything touches a device. With CUDA-graph command buffers on, a trace times whole
    command buffers, not the instructions inside them."""
    if NO_COMMAND_BUFFERS not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {NO_COMMAND_BUFFERS}".strip()


def main(argv: Sequence[str] | None = None) -> int:
    without_command_buffers()
    exp, job_dir, ns = cli.parse(
        argv, "python -m benchmarks.pgle", "Collect a PGLE profile (DIR/profile.pb) for an experiment's train step.",
        extra=[("--steps", dict(type=int, default=5))],
    )  # fmt: skip
    from pax_eqx.job.job_dir import prepare

    exp.validate(num_devices=jax.device_count())
    path = prepare(job_dir)
    programs, state, batch = synthetic_step(exp)
    state, metrics = programs.train_step(state, batch)  # compile outside the trace
    jax.block_until_ready(metrics)
    trace = path / "pgle_trace"
    with jax.profiler.trace(str(trace)):
        for _ in range(ns.steps):
            state, metrics = programs.train_step(state, batch)
        jax.block_until_ready(metrics)
    size = write_profile(trace, path / "profile.pb")
    if size == 0:
        print(f"The trace in {trace} has no instruction latencies (they are recorded on NVIDIA GPUs only); "
              "no profile.pb written.")  # fmt: skip
        return 0
    flags = f"{NO_COMMAND_BUFFERS} {xla_flag(path / 'profile.pb')}"
    print(f'Wrote {path / "profile.pb"} ({size:,} bytes). Run with:\n  XLA_FLAGS="{flags}" ...')
    return 0


if __name__ == "__main__":
    from pax_eqx.command_line import entry

    entry.run(lambda: main(sys.argv[1:]))
