"""The job-dir lock with two real processes of one run (loopback, gloo): process 0 takes it for
both, and when another trainer holds it, every process stops, not only process 0."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pax_eqx.job.job_dir import exclusive

HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pair(job: Path, tmp_path: Path, phase: str) -> list[dict]:
    port = free_port()
    outs = [tmp_path / f"{phase}{i}.json" for i in range(2)]
    env = {"PYTHONPATH": f"{HERE}:{HERE.parent.parent}", "PATH": "/usr/bin:/bin"}
    procs = [
        subprocess.Popen([sys.executable, str(HERE / "multihost_lock_worker.py"), str(port), str(i), str(job),
                          str(outs[i])], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)
    ]  # fmt: skip
    logs = [p.communicate(timeout=180)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    return [json.loads(o.read_text()) for o in outs]


def test_process_0_locks_for_every_host_and_a_refusal_stops_them_all(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    with exclusive(job):  # another trainer (this test process) holds the job dir
        refused = run_pair(job, tmp_path, "refused")
    assert (
        f"is in use by another training run (pid {os.getpid()} on host {socket.gethostname()}" in (refused[0]["error"])
    )
    assert "process 0 could not lock" in refused[1]["error"]

    held = run_pair(job, tmp_path, "held")
    assert [r["error"] for r in held] == [None, None]
    assert held[0]["holder_pid"] == held[1]["holder_pid"] == held[0]["own_pid"]  # process 0 holds it
    assert list(job.iterdir()) == []  # released and removed


def test_a_start_refused_for_a_full_disk_leaves_no_lock_behind(tmp_path, monkeypatch):
    """The holder file cannot be written (ENOSPC: the disk or its inodes are full). It left
    train.lock and train.lock.holder.<pid>.tmp behind, and advised fixing the permissions."""
    import errno

    from pax_eqx.job.job_dir import JobDirError

    write = Path.write_text

    def full_disk(self, *args, **kwargs):
        if self.name.startswith("train.lock.holder"):
            self.touch()  # the name got an inode, its bytes no room
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(JobDirError, match=r"No space left on device\); free space \(or inodes"):
        with exclusive(tmp_path):
            pass
    assert os.listdir(tmp_path) == []
