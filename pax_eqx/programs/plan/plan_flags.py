"""The flags of a plan, declared once: `python -m pax_eqx.train --dry-run [--recommend ...]`.

    --dry-run                       print the sharding and memory plan, then exit
    --dry-run-device-memory-gb G    exit 1 when the plan does not fit G GiB per device
    --recommend --dry-run-devices N the fastest layouts of N devices that fit (recommend.py)
      --dry-run-device-kind, --dry-run-devices-per-host, --dry-run-ici-size: what N devices are

`PLAN_FLAGS` is each flag with its argparse settings and the rules it obeys (read only by
--recommend, > 0); `PlanRequest.read` turns a parsed namespace into the request, refusing a
combination that means nothing with one line naming the flag and the fix, and
`PlanRequest.run` prints the plan or the search. The train entry point only adds the flags and
dispatches. Nothing here loads JAX: a run prints its first line before that.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from pax_eqx.config import ConfigError
from pax_eqx.sharding.device_kinds import DEVICE_KINDS

DEFAULT_DEVICE_KIND = "h100"


def _kinds_text() -> str:
    """'a100, h100 (default), tpu_v4, tpu_v5e or tpu_v5p'."""
    names = [k + (" (default)" if k == DEFAULT_DEVICE_KIND else "") for k in sorted(DEVICE_KINDS)]
    return ", ".join(names[:-1]) + " or " + names[-1]


@dataclasses.dataclass(frozen=True)
class PlanFlag:
    """One flag: its name, argparse's settings, and its rules."""

    flag: str
    settings: dict[str, Any]
    recommend_only: bool = False  # read only by --recommend
    positive: bool = False  # a number that must be > 0

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


PLAN_FLAGS: tuple[PlanFlag, ...] = (
    PlanFlag("--dry-run", dict(action="store_true", help="print the sharding and memory plan, then exit")),
    PlanFlag(
        "--dry-run-device-memory-gb",
        dict(type=float, default=None, metavar="GIB",
             help="with --dry-run: GiB per device; exit 1 when the plan does not fit"),
        positive=True,
    ),
    PlanFlag(
        "--recommend",
        dict(action="store_true",
             help="with --dry-run: the five fastest layouts of --dry-run-devices that fit (docs/sharding.md)"),
    ),
    PlanFlag(
        "--dry-run-devices",
        dict(type=int, default=None, metavar="N", help="with --recommend: devices in all"),
        recommend_only=True,
        positive=True,
    ),
    PlanFlag(
        "--dry-run-device-kind",
        dict(detail=True, default=None, choices=sorted(DEVICE_KINDS), metavar="KIND",
             help=f"with --recommend: {_kinds_text()}"),
        recommend_only=True,
    ),
    PlanFlag(
        "--dry-run-devices-per-host",
        dict(detail=True, type=int, default=None, metavar="K",
             help="with --recommend: devices per host (default: the kind's)"),
        recommend_only=True,
        positive=True,
    ),
    PlanFlag(
        "--dry-run-ici-size",
        dict(detail=True, type=int, default=None, metavar="D",
             help="with --recommend: devices on the fast interconnect (default: a GPU host, a TPU slice)"),
        recommend_only=True,
        positive=True,
    ),
)  # fmt: skip


def argparse_flags() -> list[tuple[str, dict[str, Any]]]:
    """(flag, settings) pairs, as `cli.parse(extra=...)` takes them."""
    return [(f.flag, dict(f.settings)) for f in PLAN_FLAGS]


@dataclasses.dataclass(frozen=True)
class PlanRequest:
    """What the plan flags ask for: nothing (train), a plan (`dry_run`), or a layout search."""

    dry_run: bool = False
    dry_run_device_memory_gb: float | None = None
    recommend: bool = False
    dry_run_devices: int | None = None
    dry_run_device_kind: str | None = None
    dry_run_devices_per_host: int | None = None
    dry_run_ici_size: int | None = None

    @classmethod
    def read(cls, namespace: Any) -> PlanRequest:
        """The request of a parsed namespace; ConfigError for a value out of range or a flag
        without the flag that reads it."""
        request = cls(**{f.dest: getattr(namespace, f.dest) for f in PLAN_FLAGS})
        for f in PLAN_FLAGS:
            value = getattr(request, f.dest)
            if f.positive and value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{f.flag} {value:g} is out of range: it must be a finite number > 0.")
        given = [f.flag for f in PLAN_FLAGS if f.recommend_only and getattr(request, f.dest) is not None]
        if given and not request.recommend:
            raise ConfigError(f"{given[0]} is read only by --recommend: add --dry-run --recommend, or drop it.")
        if request.recommend and not request.dry_run:
            raise ConfigError("--recommend searches layouts in a dry run: add --dry-run (nothing is trained).")
        if request.recommend and request.dry_run_devices is None:
            raise ConfigError("--recommend needs --dry-run-devices N, the devices to lay the experiment out on.")
        return request

    def run(self, exp: Any, argv: Sequence[str]) -> int:
        """Prints the plan (or the search) of `exp`; the exit status: 1 when nothing fits the
        memory given (--dry-run-device-memory-gb, or the search's), so a script can gate a
        launch on the verdict. `argv`: the command line the search's
        suggested commands start from. On a terminal both are laid out for its width; piped,
        each line is whole (text_width.py)."""
        from pax_eqx.programs.plan.text_width import terminal_width

        if self.recommend:
            from pax_eqx.programs.plan.recommend import recommend

            kind = self.dry_run_device_kind or DEFAULT_DEVICE_KIND
            found = recommend(
                exp, self.dry_run_devices, self.dry_run_device_memory_gb, kind, self.dry_run_devices_per_host,
                self.dry_run_ici_size, base_argv=list(argv), width=terminal_width(),
            )  # fmt: skip
            print(found.text)
            return 0 if found.best is not None else 1
        from pax_eqx.programs.plan.dry_run import plan

        result = plan(exp, device_memory_gb=self.dry_run_device_memory_gb)
        print(result.laid_out(terminal_width()))
        # Only a memory asked for gates the exit: the verdict against mesh.device_kind's memory
        # (an experiment written for a TPU, planned from anywhere) is information, not a failure.
        return 1 if result.fits is False and self.dry_run_device_memory_gb is not None else 0
