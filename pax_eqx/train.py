"""`python -m pax_eqx.train --exp NAME --job-log-dir DIR [--section.field VALUE ...]`

Trains the experiment (default: shakespeare_char), resuming from DIR's newest checkpoint.
`--dry-run` prints the sharding/memory plan without devices or writing anything; with
`--dry-run-device-memory-gb G` it exits 1 when the plan does not fit G GiB per device;
`--dry-run --recommend --dry-run-devices N` searches N devices' layouts for the fastest that fits
(pax_eqx/programs/plan/recommend.py) and prints the command that trains it. Those flags are
declared, checked and run in pax_eqx/programs/plan/plan_flags.py; this module only joins the
command line to the programs.

The first line, `Loading experiment NAME ...`, is printed before JAX, orbax, tyro and the
experiment are imported (they take seconds), so a run says what it is doing at once; the
second says what is being built and compiled.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from pax_eqx import programs
from pax_eqx.command_line import entry
from pax_eqx.config import ConfigError
from pax_eqx.programs.plan.plan_flags import PlanRequest, argparse_flags

DESCRIPTION = "Train a pax_eqx experiment; a second run on the same --job-log-dir resumes it."


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not {"-h", "--help", "--help-all"} & set(argv):
        print(f"Loading experiment {entry.experiment_named(argv)} ...", flush=True)
    from pax_eqx.command_line import cli

    exp, job_dir, ns = cli.parse(
        argv, "python -m pax_eqx.train", DESCRIPTION, job_dir_required=False, saved_experiment=True,
        extra=argparse_flags(),
    )  # fmt: skip
    try:
        request = PlanRequest.read(ns)
    except ConfigError as error:
        raise cli.fail(str(error)) from None
    if request.dry_run:
        return request.run(exp, argv)
    if not job_dir:
        raise cli.fail("--job-log-dir is required: python -m pax_eqx.train --exp NAME --job-log-dir DIR")
    return _train(exp, job_dir, argv)


def _train(exp, job_dir: str, argv: list[str]) -> int:
    """Validates `exp` against the devices and runs the checks before compile (what the data,
    the tokenizer, the user's metrics and a LoRA base would fail mid-run), then trains in
    `job_dir` (made if new; a run that fails before writing anything leaves no trace of it)."""
    from pathlib import Path

    import jax

    from pax_eqx.job.job_dir import prepare
    from pax_eqx.programs import preflight
    from pax_eqx.programs.train.train_loop import train
    from pax_eqx.sharding.distributed import initialize
    from pax_eqx.summaries.trackers import require_trackers

    initialize()
    exp.validate(num_devices=jax.device_count(), num_hosts=jax.process_count())  # the one validation
    require_trackers(exp.train.trackers)  # a missing extra stops the run before it writes anything
    preflight.check_trainable(exp)
    preflight.check(exp, Path(job_dir))  # reads files and runs the user's metrics; writes nothing
    created = not os.path.exists(job_dir)
    path = prepare(job_dir)
    try:
        train(exp, path, argv=argv)
    except BaseException:
        if created:
            _remove_if_empty(path)
        raise
    return 0


def _remove_if_empty(path) -> None:
    """Removes `path` if no file was written under it (empty folders such as checkpoints/, made
    before a failure, are no trace worth leaving); anything else stays as it is."""
    if any(files for _, _, files in os.walk(path)):
        return  # something was written: keep it
    for folder, _, _ in sorted(os.walk(path), key=lambda entry: -len(entry[0])):  # deepest first
        try:
            os.rmdir(folder)
        except OSError:  # something appeared meanwhile: keep it
            return


if __name__ == "__main__":
    entry.run(main, memory_planner=programs.planned_bytes)  # an out-of-memory line quotes the plan
