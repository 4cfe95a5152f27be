"""LoRA through the command line's programs, in process (the conftest's 8 CPU devices), on a tiny
imported Llama:

- `train --lora.*` on a JSONL file writes checkpoints that hold the adapters and their optimizer
  state, never the base; stopped at step 2 and resumed to 4, a run ends with the adapters and
  optimizer state of an uninterrupted one (with lora.dropout: the resumed run draws the same masks);
- the merged export, re-imported, gives the LoRA model's own logits (float32, to 1e-5 of their
  scale: tests/tolerances.py); the PEFT export's tensors are checked against the merged weights
  with numpy;
- an export that cannot be written, and a base whose parameters changed since the adapters were
  trained, are refused by name."""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from hf_models import FIXTURES, forward_logits, imported_model, reference
from safetensors.numpy import save_file
from tolerances import assert_same_math

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


def read(job):
    """(step, state, programs) of a job dir's newest checkpoint, as eval, decode and export read it."""
    exp = ExperimentConfig.from_dict(json.loads((job / "config.json").read_text()))
    programs = Programs(build_task(exp), build_mesh(exp.mesh), exp.mesh.rules)
    ckpt = Checkpointer(job / "checkpoints", read_only=True)
    step, state, _ = restore_state(ckpt, programs, exp, job, restore_data=False)
    return step, state, programs


def saved_paths(job, step):
    """The leaf paths a checkpoint's manifest lists (what its arrays are)."""
    where = job / "checkpoints" / str(step)
    restored = ocp.Checkpointer(ocp.CompositeCheckpointHandler()).restore(
        where, args=ocp.args.Composite(manifest=ocp.args.JsonRestore())
    )
    return [leaf["path"] for leaf in restored["manifest"]["leaves"]]


def train_lora(base, job, corpus, steps):
    assert train_cli.main([
        "--exp", str(base / "config.json"), "--job-log-dir", str(job),
        "--lora.targets", *TARGETS, "--lora.rank", "4", "--lora.alpha", "8", "--lora.base-job-dir", str(base),
        "--lora.dropout", "0.1",
        "--data.source", "jsonl", "--data.path", str(corpus), "--learner.learning-rate", "0.05",
        "--train.num-steps", str(steps), "--train.eval-interval-steps", "0", "--train.no-sample-at-end",
        "--checkpoint.every-n-steps", "2",
    ]) == 0  # fmt: skip


def test_import_lora_fine_tune_resume_export_merged_and_peft(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": line}) + "\n" for line in LINES * 8))
    base, lora, whole = tmp_path / "base", tmp_path / "lora", tmp_path / "whole"
    assert import_hf.main([str(FIXTURES / "llama"), "--job-log-dir", str(base), "--data.seq-len", "16"]) == 0
    train_lora(base, lora, corpus, 2)  # stops at step 2 with a checkpoint: as a run killed after its save
    paths = saved_paths(lora, 2)
    params = [p for p in paths if p.startswith("params/")]
    assert params and all(p.startswith("params/adapters/") for p in params), params  # no base in it
    assert any(p.startswith("opt_state/") and "adapters" in p for p in paths)
    assert json.loads((lora / "lora_base.json").read_text())["step"] == 0  # the import's checkpoint
    train_lora(base, lora, corpus, 4)  # resumed
    train_lora(base, whole, corpus, 4)  # uninterrupted
    (step, resumed, programs), (_, straight, _) = read(lora), read(whole)
    assert step == 4
    _, imported, _ = read(base)  # the base comes back from its own job dir, bit for bit
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed.params.base), jax.device_get(imported.params))
    for a, b in [(resumed.params.adapters, straight.params.adapters), (resumed.opt_state, straight.opt_state)]:
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(a), jax.device_get(b))

    merged = tmp_path / "merged"
    assert export_hf.main(["--job-log-dir", str(lora), "--out", str(merged), "--dtype", "float32"]) == 0
    ids = reference("llama")["ids"]
    model = programs.task.model(programs.task.inference_params(resumed))
    want = np.asarray(model(jnp.asarray(ids), Context(mode=Mode.EVAL))[0])
    model, _ = imported_model(merged)
    assert_same_math(forward_logits(model, ids), want)  # merged weights against the adapters applied
    assert np.abs(want - reference("llama")["logits"]).max() > 1e-3  # the adapters changed the model

    peft = tmp_path / "peft"
    assert (
        export_hf.main(["--job-log-dir", str(lora), "--out", str(peft), "--adapters-only", "--dtype", "float32"]) == 0
    )
    config = json.loads((peft / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and config["lora_dropout"] == 0.1
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

    # the same model with one weight changed, imported in the base's place: not the adapters' base
    changed = tmp_path / "changed"
    shutil.copytree(FIXTURES / "llama", changed)
    tensors = {n: np.array(before.read(n)) for n in before.names()}
    tensors["model.norm.weight"] = tensors["model.norm.weight"] + 1.0
    save_file(tensors, str(changed / "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(base)
    assert import_hf.main([str(changed), "--job-log-dir", str(base), "--data.seq-len", "16"]) == 0
    with pytest.raises(ConfigError, match=r"holds other parameters than the base this LoRA run's adapters"):
        export_hf.export(lora, tmp_path / "refused", dtype="float32")
    assert not (tmp_path / "refused").exists() or not any((tmp_path / "refused").iterdir())
    shutil.rmtree(base / "checkpoints" / "0")  # the base's checkpoint gone: named, with the step the adapters need
    with pytest.raises(ConfigError, match=r"no longer holds checkpoint 0, the base this LoRA run's adapters"):
        export_hf.export(lora, tmp_path / "refused", dtype="float32")
