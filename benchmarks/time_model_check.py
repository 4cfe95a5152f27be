"""`python -m benchmarks.time_model_check RESULTS.jsonl`: the dry run's predictions beside a sweep's measurements.

For each measured line of a `benchmarks.sweep` results file (one device), the step time that
`--dry-run --recommend`'s time model predicts for the same command (pax_eqx/programs/plan/recommend.py,
at the device kind's constants) and the memory the dry run plans, beside what `benchmarks.mfu`
measured: one table, ratios predicted / measured. The recorded H100 run is
benchmarks/sweeps/recommend_time_model_h100.jsonl (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any

from pax_eqx.command_line import cli
from pax_eqx.programs.plan.dry_run import MemoryModel
from pax_eqx.programs.plan.recommend import Layout, model_sizes, step_time
from pax_eqx.sharding.device_kinds import DEVICE_KINDS

KINDS = (("H100", "h100"), ("TPU v4", "tpu_v4"), ("TPU v5 lite", "tpu_v5e"), ("TPU v5", "tpu_v5p"))


def predictions(record: dict[str, Any]) -> dict[str, float]:
    """{predicted_s, planned_gib} for one sweep record (a single-device benchmarks.mfu run)."""
    kind = next(name for key, name in KINDS if key.lower() in record["device_kind"].lower())
    exp, _, _ = cli.parse(shlex.split(record["variant"]), "time_model_check", "", job_dir_required=False)
    model = MemoryModel(exp)
    time = step_time(exp, Layout((1, 1, 1, 1), (1, 1, 1, 1)), DEVICE_KINDS[kind], model_sizes(model))
    return {"predicted_s": time.total, "planned_gib": model.bytes_for(exp).total / 1024**3}


def table(path: str) -> list[str]:
    lines = [
        "| variant | step measured | predicted | predicted / measured | peak memory measured | planned "
        "| planned / measured |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in open(path):
        record = json.loads(row)
        if record.get("step_time_s") is None or record.get("num_devices") != 1:
            continue
        p = predictions(record)
        measured, peak = record["step_time_s"], record.get("peak_mem_gb")
        memory = f"{peak:.1f} GiB | {p['planned_gib']:.1f} GiB | {p['planned_gib'] / peak:.3f}" if peak else "- | - | -"
        lines.append(
            f"| `{record['variant']}` | {measured * 1e3:.1f} ms | {p['predicted_s'] * 1e3:.1f} ms | "
            f"{p['predicted_s'] / measured:.3f} | {memory} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a benchmarks.sweep results file (JSON lines)")
    print("\n".join(table(parser.parse_args().results)))


if __name__ == "__main__":
    main()
