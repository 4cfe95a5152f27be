"""One process of the refused-resume test: does every host stop when process 0 refuses?

Usage: python multihost_config_worker.py PORT PROCESS_ID JOB_DIR OUT_JSON
Process 0's JOB_DIR holds config.json of another model; process 1's is empty (a host-local
disk). Each process writes the error it raised (or null) to OUT_JSON.
"""

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

from experiments.shakespeare import shakespeare_char  # noqa: E402
from pax_eqx.job.job_dir import JobDirError  # noqa: E402
from pax_eqx.programs.train.opening import check_config_everywhere  # noqa: E402

exp = shakespeare_char()
error = None
try:
    check_config_everywhere(exp, job_dir)
except JobDirError as e:
    error = str(e)
with open(out, "w") as f:
    json.dump({"error": error}, f)
jax.distributed.shutdown()
