"""Two real processes on loopback (2 CPU devices each, gloo): training matches one process."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import jax
from spmd_common import losses
from tolerances import assert_same_math

from pax_eqx.sharding.mesh import MeshConfig

HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_processes(tmp_path, worker: str, args_of=lambda i: [], timeout: int = 300) -> list[dict]:
    """Runs `worker PORT PROCESS_ID *args_of(i) OUT_JSON` as processes 0 and 1; their JSON outputs."""
    port = free_port()
    outs = [tmp_path / f"p{i}.json" for i in range(2)]
    env = {"PYTHONPATH": f"{HERE}:{HERE.parent.parent}", "PATH": "/usr/bin:/bin"}
    procs = [
        subprocess.Popen([sys.executable, str(HERE / worker), str(port), str(i), *args_of(i), str(outs[i])],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)
    ]  # fmt: skip
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    return [json.loads(o.read_text()) for o in outs]


def test_two_processes_train_like_one(tmp_path):
    results = run_two_processes(tmp_path, "multihost_worker.py")
    assert results[0]["devices"] == 4
    assert results[0]["first_ids"] != results[1]["first_ids"]  # each host fed different rows
    assert results[0]["losses"] == results[1]["losses"]
    single = losses(MeshConfig(ici_mesh_shape=(1, 2, 1), dcn_mesh_shape=(2, 1, 1)), devices=jax.devices()[:4])
    assert_same_math(results[0]["losses"], single, rtol=2e-5)


def test_a_resume_refused_by_process_0_stops_every_process(tmp_path):
    """config.json lives where process 0 writes it; the other host must not go on alone."""
    from experiments.shakespeare import shakespeare_char

    dirs = [tmp_path / f"job{i}" for i in range(2)]
    for d in dirs:
        d.mkdir()
    saved = shakespeare_char().to_dict()
    saved["model"]["num_layers"] += 1  # a different model was trained in process 0's job dir
    saved["name"] = "another_" + saved["name"]  # another experiment: refused even without a checkpoint
    (dirs[0] / "config.json").write_text(json.dumps(saved))
    results = run_two_processes(tmp_path, "multihost_config_worker.py", lambda i: [str(dirs[i])], timeout=120)
    errors = [r["error"] for r in results]
    assert "model.num_layers" in errors[0]
    assert "process 0 refused" in errors[1]
