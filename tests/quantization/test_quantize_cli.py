"""`python -m pax_eqx.quantize` end to end on a tiny trained job dir: int8 and int4 job dirs whose
checkpoints hold integers and scales, evaluated and decoded from there; and a bad --bits refused."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from pax_eqx import decode, quantize, train
from pax_eqx import eval as eval_main
from pax_eqx.checkpoint import Checkpointer
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.programs.materialize import materialize

TINY = [
    "--exp", "shakespeare_char", "--model.num-layers", "1", "--model.model-dims", "32", "--model.hidden-dims", "64",
    "--model.num-heads", "2", "--data.seq-len", "16", "--data.eval.eval-loop-num-batches", "2",
    "--train.num-steps", "2", "--train.eval-interval-steps", "2", "--checkpoint.every-n-steps", "2",
    "--train.no-sample-at-end", "--mesh.ici-mesh-shape", str(jax.device_count()), "1", "1",
    "--data.train.batch-size", "8", "--data.eval.batch-size", "8",
]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    job = tmp_path_factory.mktemp("q") / "float"
    assert train.main(["--job-log-dir", str(job), *TINY]) == 0
    return job


def _eval_loss(job, capsys) -> float:
    assert eval_main.main(["--job-log-dir", str(job)]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["log_pplx"]


@pytest.mark.parametrize("bits, bound", [(8, 0.3), (4, 0.17)])
def test_quantized_job_dir_holds_integers_and_evaluates_and_decodes(trained, tmp_path, capsys, bits, bound):
    out = tmp_path / f"int{bits}"
    sizes = materialize(trained, out, bits, log=lambda _: None)
    # The arrays against the float32 parameters' bytes (the tiny checkpoint's own bytes are mostly
    # orbax's metadata; benchmarks/quantization.py measures the full model's checkpoint).
    assert sizes["quantized_params_bytes"] <= bound * sizes["float32_bytes"]
    exp = ExperimentConfig.from_dict(json.loads((out / "config.json").read_text()))
    assert exp.quantization.kind == "int" and exp.quantization.weight_bits == bits
    ckpt = Checkpointer(out / "checkpoints", exp.checkpoint, read_only=True)
    assert ckpt.latest_step() == 2
    ckpt.close()
    dtypes = {np.dtype(a.dtype).name for a in _saved_arrays(out)}
    assert "int8" in dtypes
    float_loss, int_loss = _eval_loss(trained, capsys), _eval_loss(out, capsys)
    assert int_loss == pytest.approx(float_loss, rel=1e-3 if bits == 8 else 1e-2)
    assert decode.main(["--job-log-dir", str(out), "--prompt", "ROMEO:", "--max-new-tokens", "5"]) == 0
    assert "ROMEO:" in capsys.readouterr().out


def _saved_arrays(job):
    """The arrays of the job dir's newest checkpoint, restored into the quantized structure."""
    from pax_eqx.programs.restore import restore_for_inference

    exp = ExperimentConfig.from_dict(json.loads((job / "config.json").read_text()))
    _, state, _ = restore_for_inference(exp, str(job), "decode", log=lambda _: None)
    return jax.tree.leaves(state.params)


def test_bits_other_than_8_or_4_are_refused_in_one_line_and_nothing_is_written(trained, tmp_path, capsys):
    out = tmp_path / "int3"
    with pytest.raises(SystemExit) as e:
        quantize.main(["--job-log-dir", str(trained), "--out", str(out), "--bits", "3"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--bits" in err and "3" in err
    assert not out.exists()


def test_training_a_materialized_model_is_refused(trained, tmp_path):
    from pax_eqx.config import ConfigError
    from pax_eqx.programs.preflight import check_trainable

    out = tmp_path / "int8"
    materialize(trained, out, 8, log=lambda _: None)
    exp = ExperimentConfig.from_dict(json.loads((out / "config.json").read_text()))
    with pytest.raises(ConfigError, match="quantization=int"):
        check_trainable(exp)
