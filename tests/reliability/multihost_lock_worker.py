"""One process of the two-process job-dir lock test: process 0 locks for every host.

Usage: python multihost_lock_worker.py PORT PROCESS_ID JOB_DIR OUT_JSON
Both processes share JOB_DIR (a shared file system). Each writes to OUT_JSON the error it raised
(or null) and, while the lock is held, the pid the holder file names.
"""

import contextlib
import json
import os
import sys
from pathlib import Path

os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

port, pid, job_dir, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}",
    coordinator_bind_address=f"127.0.0.1:{port}",
    num_processes=2,
    process_id=pid,
)

from pax_eqx.job.job_dir import JobDirError  # noqa: E402
from pax_eqx.programs.train.opening import lock_everywhere  # noqa: E402
from pax_eqx.sharding.distributed import any_host  # noqa: E402

result = {"error": None, "holder_pid": None, "own_pid": os.getpid()}
try:
    with contextlib.ExitStack() as stack:
        lock_everywhere(stack, job_dir)
        result["holder_pid"] = json.loads((job_dir / "train.lock.holder").read_text())["pid"]
        any_host(False)  # both have read the holder file before process 0 lets go
except JobDirError as e:
    result["error"] = str(e)
with open(out, "w") as f:
    json.dump(result, f)
jax.distributed.shutdown()
