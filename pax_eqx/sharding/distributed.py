"""Multi-host start-up: `jax.distributed.initialize` from the environment, once.

Set PAX_EQX_COORDINATOR (host:port), PAX_EQX_NUM_PROCESSES and PAX_EQX_PROCESS_ID (and, on a
shared machine, PAX_EQX_COORDINATOR_BIND) -- or JAX's own cluster variables, which
`jax.distributed.initialize()` detects by itself (Cloud TPU, SLURM, Kubernetes, ...).
With none of them set this is a no-op: one process.

`all_hosts`, `any_host` and `from_process_0` make a host-local value the same on every host
(a collective: every host must call them at the same point); with one process they return it.
"""

from __future__ import annotations

import os

import jax
import numpy as np

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


def all_hosts(ok: bool) -> bool:
    """True on every host iff `ok` on every host."""
    return ok if jax.process_count() == 1 else bool(np.min(_gather(ok)))


def any_host(flag: bool) -> bool:
    """True on every host iff `flag` on some host."""
    return flag if jax.process_count() == 1 else bool(np.max(_gather(flag)))


def from_process_0(value: int) -> int:
    """Process 0's `value`, on every host."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    return int(multihost_utils.broadcast_one_to_all(np.array(value, np.int64)))


def _gather(flag: bool) -> np.ndarray:
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(np.array([bool(flag)], np.int32))
