"""One process of the two-process test: 2 CPU devices each, gloo collectives over loopback.

Usage: python multihost_worker.py PORT PROCESS_ID [pipeline] OUT_JSON
Each process feeds only its own half of every global batch (its infeed_host_index), the
halves are assembled into global arrays, and the losses of 5 steps are written to OUT_JSON.
`pipeline`: the model pipelined over 2 stages, one per process (the stage axis on DCN), batch 16.
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

port, pid, *flags, out = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}",
    coordinator_bind_address=f"127.0.0.1:{port}",
    num_processes=2,
    process_id=pid,
)

from spmd_common import PIPELINED, global_batches, programs_for  # noqa: E402

from pax_eqx.sharding.mesh import MeshConfig  # noqa: E402

if flags == ["pipeline"]:
    programs = programs_for(MeshConfig(ici_mesh_shape=(1, 1, 2, 1), dcn_mesh_shape=(2, 1, 1, 1)), model=PIPELINED)
    batches = global_batches(batch=16)
else:
    programs = programs_for(MeshConfig(ici_mesh_shape=(1, 2, 1), dcn_mesh_shape=(2, 1, 1)))
    batches = global_batches()
state = programs.init_state(0)
losses, first_ids = [], []
for batch in batches:
    half = batch["ids"].shape[0] // 2
    local = {k: v[pid * half : (pid + 1) * half] for k, v in batch.items()}
    first_ids.append(int(local["ids"][0, 0]))
    state, outputs = programs.train_step(state, programs.global_batch(local))
    losses.append(float(outputs.metrics["total_loss"].value))
with open(out, "w") as f:
    json.dump({"losses": losses, "first_ids": first_ids, "devices": jax.device_count()}, f)
jax.distributed.shutdown()
