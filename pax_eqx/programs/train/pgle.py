"""Profile-guided latency estimation (PGLE) for XLA on GPU, automatic and manual.

Automatic (`--profile.auto-pgle True`): JAX profiles the first `jax_pgle_profiling_runs`
executions of each jitted program, then recompiles it with the measured latencies feeding
XLA's latency-hiding scheduler. Must be switched on before the first compilation, which is
why `enable_auto_pgle` is called by the train loop before building the programs.

Manual (the Pax README's workflow): run a few steps under the profiler, convert the trace
into XLA's ProfiledInstructionsProto (`profile.pb`), then run with
`XLA_FLAGS=--xla_gpu_pgle_profile_file_or_directory_path=DIR/profile.pb`. `write_profile`
does the conversion; `benchmarks.pgle` is the command. The proto is empty on CPU (XLA records
instruction latencies only on NVIDIA GPUs), which `write_profile` reports rather than writing
a useless file.
"""

from __future__ import annotations

from pathlib import Path

import jax

from pax_eqx.config import MissingFileError


def enable_auto_pgle(profiling_runs: int = 3) -> None:
    jax.config.update("jax_enable_pgle", True)
    jax.config.update("jax_pgle_profiling_runs", profiling_runs)


def newest_trace_dir(trace_root: Path) -> Path:
    """`<trace_root>/plugins/profile/<run>/`, the newest run the profiler wrote."""
    runs = sorted((trace_root / "plugins" / "profile").glob("*"), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise MissingFileError(f"no profiler trace under {trace_root}; run steps under jax.profiler first.")
    return runs[-1]


def write_profile(trace_root: Path, out: Path) -> int:
    """Converts the newest trace into `out` (profile.pb); returns its size in bytes (0 = not written)."""
    from jax.experimental.profiler import get_profiled_instructions_proto

    proto = get_profiled_instructions_proto(str(newest_trace_dir(trace_root)))
    if not proto:
        return 0
    out.write_bytes(proto)
    return len(proto)


def xla_flag(profile: Path) -> str:
    return f"--xla_gpu_pgle_profile_file_or_directory_path={profile}"
