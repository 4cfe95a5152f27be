"""A run checkpointed on one mesh resumes on another: saved on (1, 8, 1), resumed on (2, 2, 2)."""

import json
import sys
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).parent.parent / "programs"))
from tiny import TINY  # noqa: E402

from pax_eqx import train  # noqa: E402


def test_resume_on_a_different_mesh(tmp_path, capsys):
    base = ["--exp", "shakespeare_char", "--job-log-dir", str(tmp_path), *TINY,
            "--data.train.batch-size", "8", "--data.eval.batch-size", "8", "--train.no-sample-at-end"]  # fmt: skip
    assert jax.device_count() == 8
    assert train.main(base + ["--mesh.ici-mesh-shape", "1", "8", "1"]) == 0
    assert train.main(base + ["--mesh.ici-mesh-shape", "2", "2", "2", "--train.num-steps", "9"]) == 0
    out = capsys.readouterr().out
    assert "Resuming shakespeare_char from checkpoint at step 6" in out
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if r["split"] == "train"]
    assert [r["step"] for r in rows if r["split"] == "train"][-1] == 9
    assert all(isinstance(x, float) for x in losses)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["mesh"]["ici_mesh_shape"] == [2, 2, 2]
