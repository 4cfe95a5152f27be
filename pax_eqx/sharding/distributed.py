"""Multi-host start-up: `jax.distributed.initialize` from the environment, once.

Set PAX_EQX_COORDINATOR (host:port), PAX_EQX_NUM_PROCESSES and PAX_EQX_PROCESS_ID (and, on a
shared machine, PAX_EQX_COORDINATOR_BIND) -- or JAX's own cluster variables, which
`jax.distributed.initialize()` detects by itself (Cloud TPU, SLURM, Kubernetes, ...).
With none of them set this is a no-op: one process.
"""

from __future__ import annotations

import os

import jax

_done = False


def initialize() -> None:
    global _done
    if _done:
        return
    coordinator = os.environ.get("PAX_EQX_COORDINATOR")
    if coordinator:
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=int(os.environ["PAX_EQX_NUM_PROCESSES"]),
            process_id=int(os.environ["PAX_EQX_PROCESS_ID"]),
            coordinator_bind_address=os.environ.get("PAX_EQX_COORDINATOR_BIND"),
        )
    elif os.environ.get("JAX_COORDINATOR_ADDRESS"):
        jax.distributed.initialize()
    _done = True
