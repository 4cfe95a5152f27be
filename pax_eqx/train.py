"""`python -m pax_eqx.train --exp NAME --job-log-dir DIR [--section.field VALUE ...]`

Trains the experiment (default: shakespeare_char), resuming from DIR's newest checkpoint.
`--dry-run` prints the sharding/memory plan without devices or writing anything; with
`--dry-run-device-memory-gb G` it exits 1 when the plan does not fit G GiB per device;
`--dry-run --recommend --dry-run-devices N` searches N devices' layouts for the fastest that fits
(pax_eqx/programs/recommend.py) and prints the command that trains it.

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

DEVICE_KIND_NAMES = ("h100", "tpu_v4", "tpu_v5e", "tpu_v5p")  # pax_eqx.programs.device_kinds, unimported here
_RECOMMEND_ONLY = ("--dry-run-devices", "--dry-run-device-kind", "--dry-run-devices-per-host", "--dry-run-ici-size")
DESCRIPTION = "Train a pax_eqx experiment; a second run on the same --job-log-dir resumes it."


def main(argv: Sequence[str] | None = None) -> int:
    entry.set_memory_planner(programs.planned_bytes)  # an out-of-memory line quotes the plan
    argv = list(sys.argv[1:] if argv is None else argv)
    if not {"-h", "--help", "--help-all"} & set(argv):
        print(f"Loading experiment {entry.experiment_named(argv)} ...", flush=True)
    from pax_eqx.command_line import cli

    exp, job_dir, ns = cli.parse(
        argv,
        "python -m pax_eqx.train",
        DESCRIPTION,
        job_dir_required=False,
        saved_experiment=True,
        extra=[
            ("--dry-run", dict(action="store_true", help="print the sharding and memory plan, then exit")),
            (
                "--dry-run-device-memory-gb",
                dict(
                    type=float,
                    default=None,
                    metavar="GIB",
                    help="with --dry-run: GiB per device; exit 1 when the plan does not fit",
                ),
            ),
            (
                "--recommend",
                dict(
                    action="store_true",
                    help="with --dry-run: the five fastest layouts of --dry-run-devices that fit (docs/sharding.md)",
                ),
            ),
            ("--dry-run-devices", dict(type=int, default=None, metavar="N", help="with --recommend: devices in all")),
            (
                "--dry-run-device-kind",
                dict(
                    detail=True,
                    default=None,
                    choices=sorted(DEVICE_KIND_NAMES),
                    metavar="KIND",
                    help="with --recommend: h100 (default), tpu_v4, tpu_v5e or tpu_v5p",
                ),
            ),
            (
                "--dry-run-devices-per-host",
                dict(
                    detail=True,
                    type=int,
                    default=None,
                    metavar="K",
                    help="with --recommend: devices per host (default: the kind's)",
                ),
            ),
            (
                "--dry-run-ici-size",
                dict(
                    detail=True,
                    type=int,
                    default=None,
                    metavar="D",
                    help="with --recommend: devices on the fast interconnect (default: a GPU host, a TPU slice)",
                ),
            ),
        ],
    )
    for flag, value in (
        ("--dry-run-device-memory-gb", ns.dry_run_device_memory_gb),
        ("--dry-run-devices", ns.dry_run_devices),
    ):
        if value is not None and value <= 0:
            raise cli.fail(f"{flag} {value:g} is out of range: it must be > 0.")
    recommend_flags = [f for f in _RECOMMEND_ONLY if getattr(ns, f.lstrip("-").replace("-", "_")) not in (None, False)]
    if recommend_flags and not ns.recommend:
        raise cli.fail(f"{recommend_flags[0]} is read only by --recommend: add --dry-run --recommend, or drop it.")
    if ns.recommend and not ns.dry_run:
        raise cli.fail("--recommend searches layouts in a dry run: add --dry-run (nothing is trained).")
    if ns.recommend:
        if ns.dry_run_devices is None:
            raise cli.fail("--recommend needs --dry-run-devices N, the devices to lay the experiment out on.")
        from pax_eqx.programs.recommend import recommend

        found = recommend(
            exp, ns.dry_run_devices, ns.dry_run_device_memory_gb, ns.dry_run_device_kind or "h100",
            ns.dry_run_devices_per_host, ns.dry_run_ici_size, base_argv=argv,
        )  # fmt: skip
        print(found.text)
        return 0 if found.best is not None else 1
    if ns.dry_run:
        from pax_eqx.programs.dry_run import plan

        result = plan(exp, device_memory_gb=ns.dry_run_device_memory_gb)
        print(result)
        return 1 if result.fits is False else 0  # scripts can gate a launch on the verdict
    if not job_dir:
        raise cli.fail("--job-log-dir is required: python -m pax_eqx.train --exp NAME --job-log-dir DIR")
    import jax

    from pax_eqx.programs.job_dir import prepare
    from pax_eqx.programs.train_loop import train
    from pax_eqx.sharding.distributed import initialize

    initialize()
    exp.validate(num_devices=jax.device_count(), num_hosts=jax.process_count())  # the one validation
    created = not os.path.exists(job_dir)
    path = prepare(job_dir)
    try:
        train(exp, path, argv=argv)
    except BaseException:
        if created:
            _remove_if_empty(path)  # a run that failed before writing anything leaves no trace
        raise
    return 0


def _remove_if_empty(path) -> None:
    try:
        os.rmdir(path)
    except OSError:  # not empty: something was written, keep it
        pass


if __name__ == "__main__":
    entry.run(main)
