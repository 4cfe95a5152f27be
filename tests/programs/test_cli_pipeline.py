"""The pipelined experiment through the CLI, and checkpoints that cross between pipelined and not.

A pipelined stack keeps the unpipelined [num_layers, ...] weights, so a run may switch: 6 steps
pipelined (stage 2 x data 2 x fsdp 2) resumed unpipelined to 9 must log the losses of 6 steps
unpipelined resumed pipelined to 9, step for step (the same math; float32 reduction order only).
"""

import json

import jax
import pytest
from tiny import TINY
from tolerances import assert_same_math

from pax_eqx import train
from pax_eqx.command_line import entry, registry

PIPELINED = ["--mesh.ici-mesh-shape", "2", "2", "2", "1"]
UNPIPELINED = ["--model.pipeline.num-stages", "1", "--model.pipeline.num-microbatches", "1",
               "--mesh.ici-mesh-shape", "2", "2", "2"]  # fmt: skip


def _train_losses(job_dir) -> dict[int, float]:
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


def test_pipelined_run_resumes_unpipelined_and_back(tmp_path, capsys):
    assert jax.device_count() == 8
    base = ["--exp", "shakespeare_pipelined", *TINY, "--model.num-layers", "2", "--train.no-sample-at-end",
            "--data.train.batch-size", "16", "--data.eval.batch-size", "16"]  # fmt: skip
    there, back = tmp_path / "there", tmp_path / "back"
    assert train.main([*base, "--job-log-dir", str(there), *PIPELINED]) == 0
    assert train.main([*base, "--job-log-dir", str(there), *UNPIPELINED, "--train.num-steps", "9"]) == 0
    assert train.main([*base, "--job-log-dir", str(back), *UNPIPELINED]) == 0
    assert train.main([*base, "--job-log-dir", str(back), *PIPELINED, "--train.num-steps", "9"]) == 0
    out = capsys.readouterr().out
    assert out.count("Resuming shakespeare_pipelined from checkpoint at step 6") == 2
    a, b = _train_losses(there), _train_losses(back)
    assert sorted(a) == sorted(b) and max(a) == 9
    assert_same_math([a[s] for s in sorted(a)], [b[s] for s in sorted(b)], rtol=2e-5)
    # The job dir records what each run chose: the last one was pipelined over (2, 2, 2, 1).
    config = json.loads((back / "config.json").read_text())
    assert config["model"]["pipeline"]["num_stages"] == 2 and config["mesh"]["ici_mesh_shape"] == [2, 2, 2, 1]


def test_the_registered_experiment_fits_the_two_devices_the_docs_fake():
    """docs/experiments.md runs it as registered with XLA_FLAGS=--xla_force_host_platform_device_count=2."""
    exp = registry.load_experiment("shakespeare_pipelined")
    assert exp.mesh.ici_mesh_shape == (2, 1, 1, 1) and exp.model.pipeline.num_stages == 2
    exp.validate(num_devices=2)


def test_a_stage_axis_without_a_pipeline_is_refused(tmp_path, capsys):
    args = ["--exp", "shakespeare_char", "--job-log-dir", str(tmp_path / "x"), *TINY, "--mesh.ici-mesh-shape", "2",
            "2", "2", "1"]  # fmt: skip
    with pytest.raises(SystemExit) as info:
        entry.run(lambda: train.main(args))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "has a stage axis of 2, but the model is not pipelined" in err and "--model.pipeline.num-stages 2" in err
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())  # nothing written
