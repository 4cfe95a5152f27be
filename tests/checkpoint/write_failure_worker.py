"""Saves step 1, then lowers RLIMIT_FSIZE so the save of step 2 fails inside tensorstore's writes.

Usage: write_failure_worker.py DIR ASYNC(1|0). Prints one JSON line: the error's type and message.
A file-size limit is a real write failure (EFBIG) raised by the kernel, like a full disk
(ENOSPC), without needing a small filesystem.
"""

import json
import os
import resource
import signal
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

from ckpt_states import make_state  # noqa: E402

from pax_eqx.checkpoint import CheckpointConfig, Checkpointer  # noqa: E402

directory, async_save = sys.argv[1], sys.argv[2] == "1"
ckpt = Checkpointer(directory, CheckpointConfig(max_to_keep=1, async_save=async_save))
ckpt.save(1, make_state(1, width=256), {"next_index": 1}, force=True)
ckpt.wait_until_finished()

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG from write() instead of being killed
resource.setrlimit(resource.RLIMIT_FSIZE, (8 * 1024, resource.RLIM_INFINITY))
result = {"error": None, "message": ""}
try:
    ckpt.save(2, make_state(2, width=256), {"next_index": 2}, force=True)
    ckpt.wait_until_finished()
except Exception as e:  # noqa: BLE001 -- report whatever came out
    result = {"error": type(e).__name__, "message": str(e)}
print(json.dumps(result))
