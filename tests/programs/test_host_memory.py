"""`host_memory.retain_freed_pages`: a freed block's pages are reused, not faulted in again.

Counted in a fresh process (the setting is process-wide): the minor page faults of writing an
8 MiB block that was allocated, written and freed before. glibc on its own maps such a block
anew each time once any malloc option is set (`MALLOC_TOP_PAD_=0` here); with the pad and the
32 MiB threshold the second block reuses the first's pages.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

from pax_eqx.command_line import host_memory

PAGES = (8 << 20) // os.sysconf("SC_PAGE_SIZE")  # the probe's block

PROBE = r"""
import ctypes, json, resource, sys
from pax_eqx.command_line.host_memory import retain_freed_pages
applied = retain_freed_pages()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 8 << 20
faults = []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(size)
    ctypes.memset(p, 1, size)
    libc.free(p)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": faults}))
"""

glibc_linux = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL(None), "gnu_get_libc_version"),
    reason="glibc's malloc only",
)


def _probe(**env: str) -> dict:
    """Runs PROBE in a fresh process whose environment tunes nothing but `env`."""
    skip = (*host_memory._USER_TUNING_ENV, host_memory.OPT_OUT_ENV)
    clean = {k: v for k, v in os.environ.items() if k not in skip}
    run = [sys.executable, "-c", PROBE]
    out = subprocess.run(run, env={**clean, **env}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


@glibc_linux
def test_a_freed_block_is_reused_without_page_faults():
    kept = _probe()
    assert kept["applied"] is True
    assert kept["faults"][0] >= PAGES // 2  # the first block is new memory
    assert max(kept["faults"][1:]) < PAGES // 20, kept  # later ones reuse its pages


@glibc_linux
def test_the_environments_own_malloc_tuning_and_the_opt_out_are_left_alone():
    tuned = _probe(MALLOC_TOP_PAD_="0")
    assert tuned["applied"] is False
    assert min(tuned["faults"]) >= PAGES // 2, tuned  # glibc maps and faults every block again
    assert _probe(PAX_EQX_GLIBC_MALLOC_DEFAULTS="1")["applied"] is False


def test_entry_run_applies_it(monkeypatch):
    from pax_eqx.command_line import entry

    calls = []
    monkeypatch.setattr(entry, "retain_freed_pages", lambda: calls.append(1))
    with pytest.raises(SystemExit):
        entry.run(lambda: 0)
    assert calls == [1]
