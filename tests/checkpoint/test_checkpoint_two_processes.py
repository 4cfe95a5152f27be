"""Two real processes on loopback: sharded save, per-host data state, fallback and resharding."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from jax.sharding import PartitionSpec as P

HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pair(directory: Path, phase: str, tmp_path: Path) -> list[dict]:
    port = free_port()
    outs = [tmp_path / f"{phase}{i}.json" for i in range(2)]
    env = {"PYTHONPATH": f"{HERE.parent.parent}", "PATH": "/usr/bin:/bin"}
    worker = [sys.executable, str(HERE / "two_process_worker.py"), str(port)]
    procs = [
        subprocess.Popen(
            [*worker, str(i), str(directory), phase, str(outs[i])],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i in range(2)
    ]  # fmt: skip
    logs = [p.communicate(timeout=300)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]
    return [json.loads(o.read_text()) for o in outs]


def test_two_processes_save_then_fall_back_and_reshard(tmp_path):
    directory = tmp_path / "ckpts"
    saved = run_pair(directory, "save", tmp_path)
    for r in saved:
        assert r["committed"] == [1, 2]
        assert r["due_when_process_0_says_no"] is False
        assert r["due_when_process_0_says_yes"] is True
    assert sorted(p.name for p in (directory / "2" / "data").glob("*.json")) == [
        "process_0-of-2.json",
        "process_1-of-2.json",
    ]
    # Damage the newest checkpoint's array bytes: both hosts must fall back to step 1 together.
    for data_file in (directory / "2" / "state" / "d").iterdir():
        data_file.write_bytes(b"\0" * data_file.stat().st_size)
    restored = run_pair(directory, "restore", tmp_path)
    for pid, r in enumerate(restored):
        assert r["step"] == 1
        assert r["data"] == {"process": pid, "position": 10 + pid}
        assert r["shards_match"] is True
        assert r["w_sharding"] == str(P("data", "model"))
        fallbacks = [w for w in r["warnings"] if "falling back" in w]
        assert len(fallbacks) == 1 and f"checkpoint {directory / '2'} is unreadable" in fallbacks[0]
    # Process 0 set the damaged step aside (renamed, kept); both hosts then agree it is gone.
    assert sorted(p.name.split("-")[0] for p in directory.iterdir()) == ["1", "2.unreadable"]
