"""Two real processes on loopback (2 CPU devices each, gloo): training matches one process."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
from spmd_common import losses

from pax_eqx.sharding.mesh import MeshConfig

HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_train_like_one(tmp_path):
    port = free_port()
    outs = [tmp_path / f"p{i}.json" for i in range(2)]
    env = {"PYTHONPATH": f"{HERE}:{HERE.parent.parent}", "PATH": "/usr/bin:/bin"}
    procs = [
        subprocess.Popen([sys.executable, str(HERE / "multihost_worker.py"), str(port), str(i), str(outs[i])],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)
    ]  # fmt: skip
    logs = [p.communicate(timeout=300)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    results = [json.loads(o.read_text()) for o in outs]
    assert results[0]["devices"] == 4
    assert results[0]["first_ids"] != results[1]["first_ids"]  # each host fed different rows
    assert results[0]["losses"] == results[1]["losses"]
    single = losses(MeshConfig(ici_mesh_shape=(1, 2, 1), dcn_mesh_shape=(2, 1, 1)), devices=jax.devices()[:4])
    np.testing.assert_allclose(results[0]["losses"], single, rtol=2e-5)


def test_a_resume_refused_by_process_0_stops_every_process(tmp_path):
    """config.json lives where process 0 writes it; the other host must not go on alone."""
    from experiments.shakespeare import shakespeare_char

    port = free_port()
    dirs = [tmp_path / f"job{i}" for i in range(2)]
    for d in dirs:
        d.mkdir()
    saved = shakespeare_char().to_dict()
    saved["model"]["num_layers"] += 1  # a different model was trained in process 0's job dir
    (dirs[0] / "config.json").write_text(json.dumps(saved))
    outs = [tmp_path / f"p{i}.json" for i in range(2)]
    env = {"PYTHONPATH": f"{HERE}:{HERE.parent.parent}", "PATH": "/usr/bin:/bin"}
    worker = str(HERE / "multihost_config_worker.py")
    procs = [
        subprocess.Popen([sys.executable, worker, str(port), str(i), str(dirs[i]), str(outs[i])],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)
    ]  # fmt: skip
    logs = [p.communicate(timeout=120)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    errors = [json.loads(o.read_text())["error"] for o in outs]
    assert "model.num_layers" in errors[0]
    assert "process 0 refused" in errors[1]
