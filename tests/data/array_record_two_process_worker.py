"""One of two real processes (jax.distributed, 1 CPU device each) reading a prepared corpus with
`--data.source array_record`, the host split taken from jax.process_count() / process_index().

Usage: array_record_two_process_worker.py PORT PROCESS_ID ROWS_DIR DOCUMENTS_DIR OUT_JSON

For each prepared directory (pre-packed rows; documents packed at read time) it reads 4 batches,
saves the iterator state as JSON (what a checkpoint holds), reads 4 more, then builds a fresh
input (a restarted process), restores the state and reads 4: these must be the same 4.
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

port, pid, rows_dir, documents_dir, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}",
    coordinator_bind_address=f"127.0.0.1:{port}",
    num_processes=2,
    process_id=pid,
)

from pax_eqx.data import ArrayRecordSource, DataConfig, InputConfig, build_input, build_tokenizer  # noqa: E402


def read(inp, n: int) -> list[list[list[int]]]:
    return [inp.get_next()["ids"].tolist() for _ in range(n)]


result = {"process": pid, "process_count": jax.process_count()}
for name, path in (("rows", rows_dir), ("documents", documents_dir)):
    data = DataConfig(source=ArrayRecordSource(path=path), seq_len=32, train=InputConfig(batch_size=2))
    tokenizer = build_tokenizer(data)
    inp = build_input(data, "train", tokenizer)
    first = read(inp, 4)
    state = json.loads(json.dumps(inp.get_state()))
    expected = read(inp, 4)
    restarted = build_input(data, "train", tokenizer)
    restarted.set_state(state)
    result[name] = {"shard": [inp.shard.count, inp.shard.index], "first": first, "expected": expected,
                    "resumed": read(restarted, 4)}  # fmt: skip
with open(out, "w") as f:
    json.dump(result, f)
