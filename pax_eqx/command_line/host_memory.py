"""Keep freed host memory for the next step: glibc's `M_TOP_PAD` raised to 64 MiB.

On the CPU, every call of a compiled step allocates its temporaries on the host and frees them
when it returns. With glibc's defaults the allocator hands those pages back to the kernel as
soon as they are free (it keeps 128 KiB), so the next step faults every page in again and the
kernel zeroes each one: on the 2-core machine of docs/performance.md that was a fifth of the
default experiment's step (one step per call 50.4 ms with the defaults, 39.5 ms with a 64 MiB
pad, medians of 4 alternated runs; 16 MiB, less than the step's 45 MB of temporaries, gained
nothing). A pad of
64 MiB keeps that much free memory mapped at the top of each of the allocator's heaps: the
step reuses its pages, for at most that much more resident memory per heap (about 100 MB more
for the default run). Setting it turns off glibc's moving mmap threshold (it would grow to
32 MiB as large blocks are freed and stay at 128 KiB once any option is set), so the threshold
is set to that 32 MiB as well: blocks below it come from the heaps the pad keeps.

`python -m pax_eqx.<program>` and the benchmarks set it when they start (`entry.run`); code
that runs pax_eqx from its own script calls `retain_freed_pages()` once. It leaves glibc alone
when `PAX_EQX_GLIBC_MALLOC_DEFAULTS=1` is set, or when the environment already tunes glibc's
malloc (`MALLOC_TOP_PAD_`, `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, `GLIBC_TUNABLES`:
the user's choice stands), and elsewhere than Linux with glibc (macOS, musl).
"""

from __future__ import annotations

import ctypes
import os
import sys

TOP_PAD_BYTES = 64 << 20
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
_M_TOP_PAD, _M_MMAP_THRESHOLD = -2, -3  # <malloc.h>
OPT_OUT_ENV = "PAX_EQX_GLIBC_MALLOC_DEFAULTS"
_USER_TUNING_ENV = ("MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def retain_freed_pages(pad_bytes: int = TOP_PAD_BYTES) -> bool:
    """Set glibc's top pad to `pad_bytes` (and the mmap threshold to 32 MiB) for the rest of the
    process; True when set, False when left alone (opted out, tuned by the environment, or not
    glibc)."""
    if os.environ.get(OPT_OUT_ENV) == "1" or any(name in os.environ for name in _USER_TUNING_ENV):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):  # musl has a mallopt that ignores M_TOP_PAD
            return False
        return bool(libc.mallopt(_M_TOP_PAD, int(pad_bytes)) and libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except OSError:
        return False
