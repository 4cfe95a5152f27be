"""One of two real processes (2 CPU devices each) saving and restoring one sharded checkpoint.

Usage: two_process_worker.py PORT PROCESS_ID DIR PHASE OUT_JSON, PHASE in {save, restore}.
save:    steps 1 and 2 of a state sharded over all 4 devices of a (1, 4) mesh, each process with
         its own data iterator state; checks that the time-based save decision is process 0's.
restore: restores onto a (2, 2) mesh (the test damaged step 2 in between), checks each local
         shard against the expected values, and reports the step, the data state and warnings.
"""

import json
import os
import sys
import warnings

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

port, pid, directory, phase, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}",
    coordinator_bind_address=f"127.0.0.1:{port}",
    num_processes=2,
    process_id=pid,
)

from pax_eqx.checkpoint import CheckpointConfig, Checkpointer  # noqa: E402


def host_values(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(step)
    return {"w": rng.standard_normal((8, 16)).astype(np.float32), "count": np.array(step, np.int32)}


def global_state(step: int, mesh, specs) -> dict[str, jax.Array]:
    return {
        name: jax.make_array_from_callback(value.shape, NamedSharding(mesh, specs[name]), lambda i, v=value: v[i])
        for name, value in host_values(step).items()
    }


result = {"process": pid}
if phase == "save":
    mesh = jax.make_mesh((1, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    specs = {"w": P(None, "model"), "count": P()}
    ckpt = Checkpointer(directory, CheckpointConfig(every_n_steps=0, every_n_seconds=3600))
    # Process 1's clock says a save is due, process 0's says not: process 0 decides for both.
    ckpt._last_save_time = float("-inf") if pid == 1 else ckpt._last_save_time
    result["due_when_process_0_says_no"] = ckpt.should_save(7)
    ckpt._last_save_time = float("-inf") if pid == 0 else ckpt._last_save_time + 1e9
    result["due_when_process_0_says_yes"] = ckpt.should_save(7)
    for step in (1, 2):
        ckpt.save(step, global_state(step, mesh, specs), {"process": pid, "position": 10 * step + pid}, force=True)
    ckpt.close()
    result["committed"] = ckpt.committed_steps()
else:
    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    specs = {"w": P("data", "model"), "count": P()}
    target = {
        name: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(mesh, specs[name]))
        for name, v in host_values(0).items()
    }
    ckpt = Checkpointer(directory, CheckpointConfig())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step, state, data = ckpt.restore(target)
    ckpt.close()
    expected = host_values(step)
    result["shards_match"] = all(
        np.array_equal(np.asarray(shard.data), expected[name][shard.index])
        for name, array in state.items()
        for shard in array.addressable_shards
    )
    result["w_sharding"] = str(state["w"].sharding.spec)
    result.update(step=step, data=data, warnings=[str(w.message) for w in caught])
with open(out, "w") as f:
    json.dump(result, f)
