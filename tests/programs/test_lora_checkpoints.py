"""A LoRA run's checkpoints hold the adapters and their optimizer state, not the base; a run stopped
and resumed ends with the adapters of an uninterrupted one; a base whose parameters changed since
is refused by name; eval reads the adapted model."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest

from experiments import registry
from pax_eqx.checkpoint import Checkpointer
from pax_eqx.config import ConfigError
from pax_eqx.learners.lora_config import LoraConfig
from pax_eqx.programs.compiled import Programs
from pax_eqx.programs.lora_base import REFERENCE, adapters_only, restore_state
from pax_eqx.programs.runtime import build_task
from pax_eqx.programs.train_loop import train
from pax_eqx.sharding.mesh import build_mesh

TARGETS = (r"stack\.layers\.attention\.w_o", r"stack\.layers\.ff_out\.w")


def tiny(steps: int, seed: int = 1234, lora: LoraConfig | None = None):
    exp = registry.load_experiment("shakespeare_char")
    sizes = {
        "model.num_layers": 1, "model.model_dims": 32, "model.hidden_dims": 64, "model.num_heads": 2,
        "model.repeat": True, "data.seq_len": 16, "data.eval.eval_loop_num_batches": 1,
        "mesh.ici_mesh_shape": (jax.device_count(), 1, 1), "data.train.batch_size": 8, "data.eval.batch_size": 8,
        "train.num_steps": steps, "train.summary_interval_steps": 1, "train.eval_interval_steps": 0,
        "train.sample_at_end": False, "checkpoint.every_n_steps": 2, "train.seed": seed,
    }  # fmt: skip
    for path, value in sizes.items():
        exp = exp.override(path, value)
    return exp if lora is None else exp.replace(lora=lora)


def read(exp, job_dir):
    """(step, state) of the job dir's newest checkpoint, as every program reads it."""
    programs = Programs(build_task(exp), build_mesh(exp.mesh), exp.mesh.rules)
    ckpt = Checkpointer(job_dir / "checkpoints", read_only=True)
    step, state, _ = restore_state(ckpt, programs, exp, job_dir, restore_data=False)
    return step, state, programs


def test_adapters_only_checkpoints_resume_exactly_and_refuse_a_changed_base(tmp_path):
    base = tmp_path / "base"
    train(tiny(2), base, log=lambda _: None)
    lora = LoraConfig(targets=TARGETS, rank=2, alpha=4.0, base_job_dir=str(base))
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train(tiny(4, lora=lora), whole, log=lambda _: None)
    train(tiny(2, lora=lora), parts, log=lambda _: None)  # stops at step 2 (saved), as a killed run's last save
    train(tiny(4, lora=lora), parts, log=lambda _: None)  # resumes from it
    step, a, programs = read(tiny(4, lora=lora), whole)
    _, b, _ = read(tiny(4, lora=lora), parts)
    assert step == 4
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(a.params.adapters), jax.device_get(b.params.adapters))
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(a.opt_state), jax.device_get(b.opt_state))
    # the base came back from its own job dir, bit for bit
    _, base_state, _ = read(tiny(2), base)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(a.params.base), jax.device_get(base_state.params))

    # what the checkpoint holds: the adapters' arrays (A, B, their Adam moments), nothing of the base's size
    saved = Checkpointer(whole / "checkpoints", read_only=True).saved_config()
    assert saved is not None and saved[1]["lora"]["targets"] == list(TARGETS)
    on_disk = sum(f.stat().st_size for f in (whole / "checkpoints" / "4").rglob("*") if f.is_file())
    base_disk = sum(f.stat().st_size for f in (base / "checkpoints" / "2").rglob("*") if f.is_file())
    assert on_disk < base_disk / 2, (on_disk, base_disk)
    kept = jax.tree.leaves(adapters_only(programs.abstract_state))
    assert sum(x.size for x in kept) < sum(x.size for x in jax.tree.leaves(programs.abstract_state.params.base))
    reference = json.loads((whole / REFERENCE).read_text())
    assert reference["step"] == 2 and len(reference["fingerprint"]) == 64

    # a base trained again (another seed) in the same place is not the base the adapters know
    shutil.rmtree(base)
    train(tiny(2, seed=7), base, log=lambda _: None)
    with pytest.raises(ConfigError, match=r"holds other parameters than the base this LoRA run's adapters"):
        read(tiny(4, lora=lora), whole)
