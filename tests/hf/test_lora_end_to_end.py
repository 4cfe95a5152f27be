"""LoRA through the command line's programs, in process (the conftest's 8 CPU devices): import a tiny
Llama, fine-tune it with LoRA on a JSONL file, export it merged and re-import it: the same logits as
the LoRA model's own forward (float32, 1e-5); the PEFT export's tensors checked against the merged
weights with numpy; refusals of an export that cannot be written."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
from hf_models import FIXTURES, forward_logits, imported_model, reference

from pax_eqx import export_hf, import_hf
from pax_eqx import train as train_cli
from pax_eqx.checkpoint import Checkpointer
from pax_eqx.config import ConfigError
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.hf.safetensors_files import SafetensorsFiles
from pax_eqx.layers import Context, Mode
from pax_eqx.programs.compiled import Programs
from pax_eqx.programs.lora_base import restore_state
from pax_eqx.programs.runtime import build_task
from pax_eqx.sharding.mesh import build_mesh

LINES = [
    "Now is the winter of our discontent made glorious summer by this sun of York;",
    "And all the clouds that lour'd upon our house in the deep bosom of the ocean buried.",
]
TARGETS = [r"stack\.layers\.attention\.w_[qv]", r"stack\.layers\.ff_out\.w"]


def lora_logits(job, ids):
    exp = ExperimentConfig.from_dict(json.loads((job / "config.json").read_text()))
    programs = Programs(build_task(exp), build_mesh(exp.mesh), exp.mesh.rules)
    _, state, _ = restore_state(
        Checkpointer(job / "checkpoints", read_only=True), programs, exp, job, restore_data=False
    )
    model = programs.task.model(programs.task.inference_params(state))
    return np.asarray(model(jnp.asarray(ids), Context(mode=Mode.EVAL))[0])


def test_import_lora_fine_tune_export_merged_and_peft(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": line}) + "\n" for line in LINES * 8))
    base, lora = tmp_path / "base", tmp_path / "lora"
    assert import_hf.main([str(FIXTURES / "llama"), "--job-log-dir", str(base), "--data.seq-len", "16"]) == 0
    assert train_cli.main([
        "--exp", str(base / "config.json"), "--job-log-dir", str(lora),
        "--lora.targets", *TARGETS, "--lora.rank", "4", "--lora.alpha", "8", "--lora.base-job-dir", str(base),
        "--data.source", "jsonl", "--data.path", str(corpus), "--learner.learning-rate", "0.05",
        "--train.num-steps", "2", "--train.eval-interval-steps", "2", "--train.no-sample-at-end",
    ]) == 0  # fmt: skip
    assert {p.name for p in (lora / "checkpoints").iterdir()} >= {"2"}

    merged = tmp_path / "merged"
    assert export_hf.main(["--job-log-dir", str(lora), "--out", str(merged), "--dtype", "float32"]) == 0
    ids = reference("llama")["ids"]
    want = lora_logits(lora, ids)
    model, _ = imported_model(merged)
    np.testing.assert_allclose(forward_logits(model, ids), want, atol=1e-5, rtol=0)
    assert np.abs(want - reference("llama")["logits"]).max() > 1e-3  # the adapters changed the model

    peft = tmp_path / "peft"
    assert (
        export_hf.main(["--job-log-dir", str(lora), "--out", str(peft), "--adapters-only", "--dtype", "float32"]) == 0
    )
    config = json.loads((peft / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and config["lora_dropout"] == 0.0
    assert config["target_modules"] == ["down_proj", "q_proj", "v_proj"] and not config["fan_in_fan_out"]
    assert config["base_model_name_or_path"] and config["peft_type"] == "LORA"
    adapters, after, before = (SafetensorsFiles.open(d) for d in (peft, merged, FIXTURES / "llama"))
    modules = sorted({n.split(".lora_")[0] for n in adapters.names()})
    assert len(modules) == 3 * 2  # three weights in each of the two layers
    for module in modules:
        name = module.removeprefix("base_model.model.")
        a = np.asarray(adapters.read(module + ".lora_A.weight"))
        b = np.asarray(adapters.read(module + ".lora_B.weight"))
        w0, w1 = np.asarray(before.read(name + ".weight")), np.asarray(after.read(name + ".weight"))
        assert a.shape == (4, w0.shape[1]) and b.shape == (w0.shape[0], 4)  # [r, in], [out, r]
        np.testing.assert_allclose(w1 - w0, 8 / 4 * b @ a, atol=1e-5, rtol=0)
        assert np.abs(b).max() > 0
    untouched = "model.layers.0.self_attn.k_proj.weight"
    np.testing.assert_array_equal(np.asarray(after.read(untouched)), np.asarray(before.read(untouched)))

    with pytest.raises(ConfigError, match=r"--adapters-only: .* is not a LoRA run"):
        export_hf.export(base, tmp_path / "nothing", adapters_only=True)
