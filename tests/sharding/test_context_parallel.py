"""Context parallelism on 8 fake CPU devices: the `context` mesh axis splits every row's tokens.

The step's math must not change: loss and gradients of a tiny Llama-shaped LM at 2048 tokens
(lm_long_context's model; two rows, one of them two packed documents, so the segment mask is split
too) on meshes with a context axis equal one device's within float32 tolerance (`assert_same_math`:
the sharded program sums in another order). What context parallelism is for is checked on the same
compiled programs: XLA's temporaries per device (the activations) fall about 1/N with N context
shards, and the dry run's activation estimate lands within 25% of them. The shapes, rules, input
placement and refusals are checked by their values; the CLI trains lm_long_context a few steps.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from tolerances import assert_same_math, assert_same_math_tree

from experiments import registry
from pax_eqx import train
from pax_eqx.config import ConfigError
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.layers.base import Mode
from pax_eqx.programs.compiled import Programs, UnderMesh
from pax_eqx.programs.plan.dry_run import MemoryModel, plan
from pax_eqx.programs.runtime import build_task
from pax_eqx.sharding.activations import activation_rules, activation_spec
from pax_eqx.sharding.mesh import MeshConfig, _check_context_within_processes, build_mesh
from pax_eqx.sharding.rules import batch_sharding, check_rule_names

OLD_JOB_DIR = Path(__file__).parents[1] / "fixtures" / "job_dir_2026_11_25"
SEQ = 2048


# Mesh shapes -----------------------------------------------------------------------------------
def test_a_five_entry_shape_names_the_context_axis_and_the_old_forms_mean_what_they_meant():
    assert MeshConfig(ici_mesh_shape=(2, 2, 2)).shape == (1, 2, 2, 1, 2)
    assert MeshConfig(ici_mesh_shape=(2, 2, 1, 2)).shape == (2, 2, 1, 1, 2)
    five = MeshConfig(ici_mesh_shape=(1, 2, 1, 4, 1))
    assert five.shape == (1, 2, 1, 4, 1) and five.context == 4 and five.num_stages == 1
    # ICI and DCN in different forms: each is read as its own length says.
    assert MeshConfig(ici_mesh_shape=(1, 1, 1, 4, 1), dcn_mesh_shape=(2, 1, 1)).shape == (1, 2, 1, 4, 1)
    mesh = build_mesh(five)
    assert mesh.axis_names == ("stage", "data", "fsdp", "context", "tensor")
    assert dict(mesh.shape) == {"stage": 1, "data": 2, "fsdp": 1, "context": 4, "tensor": 1}
    with pytest.raises(ConfigError, match=r"mesh.dcn_mesh_shape must be 3 .*, 4 .* or 5 .*got \(1, 1, 1, 1, 1, 1\)"):
        MeshConfig(dcn_mesh_shape=(1, 1, 1, 1, 1, 1))


def test_a_dcn_context_factor_is_the_outer_part_of_the_axis():
    """ICI context 4 x DCN context 2 in one process: devices 0-3 (granule 0) hold the first half
    of every row's tokens, 4-7 the second."""
    mesh = build_mesh(MeshConfig(ici_mesh_shape=(1, 1, 1, 4, 1), dcn_mesh_shape=(1, 1, 1, 2, 1)))
    order = [d.id for d in mesh.devices.reshape(-1)]
    assert order[:4] == sorted(order[:4]) and {*order[:4]} == {0, 1, 2, 3} and {*order[4:]} == {4, 5, 6, 7}


def test_an_old_job_dirs_mesh_loads_unchanged_and_a_context_mesh_round_trips():
    saved = json.loads((OLD_JOB_DIR / "config.json").read_text())
    assert saved["mesh"]["ici_mesh_shape"] == [1, 1, 1]  # written before the context axis
    old = ExperimentConfig.from_dict(saved)
    assert old.mesh.shape == (1, 1, 1, 1, 1) and old.mesh.context == 1
    exp = registry.load_experiment("lm_long_context")
    assert ExperimentConfig.from_json(exp.to_json()) == exp and exp.mesh.ici_mesh_shape == (1, 1, 1, 8, 1)


def test_a_context_group_across_processes_is_refused_with_the_fix():
    """Each process reads its own rows; a context group must split the same rows."""
    cfg = MeshConfig(ici_mesh_shape=(1, 1, 1, 2, 1), dcn_mesh_shape=(1, 2, 1, 1, 1))
    device = lambda process: SimpleNamespace(process_index=process)  # noqa: E731
    within = np.array([device(0), device(0), device(1), device(1)], dtype=object).reshape(1, 2, 1, 2, 1)
    _check_context_within_processes(within, cfg)  # data across the processes: fine
    across = np.array([device(0), device(1), device(0), device(1)], dtype=object).reshape(1, 2, 1, 2, 1)
    with pytest.raises(ConfigError, match=r"context axis \(2 devices\) crosses processes.*mesh.ici_mesh_shape"):
        _check_context_within_processes(across, cfg)


def test_the_context_axis_must_divide_the_sequence_and_take_a_kernel_that_splits_it():
    exp = registry.load_experiment("lm_long_context")
    odd = exp.replace(data=exp.data.replace(seq_len=2044), model=exp.model.replace(max_seq_len=2044))
    with pytest.raises(ConfigError, match=r"context axis of 8, which does not divide data.seq_len=2044"):
        odd.validate(data_files=False)
    block = exp.model.block
    cudnn = exp.model.replace(block=block.replace(attention=block.attention.replace(implementation="cudnn")))
    with pytest.raises(ConfigError, match=r"model.block.attention.implementation='cudnn' with a context axis of 8"):
        exp.replace(model=cudnn).validate(data_files=False)


# Rules and inputs ------------------------------------------------------------------------------
def test_seq_maps_onto_context_and_the_keys_stay_whole():
    mesh = build_mesh(MeshConfig(ici_mesh_shape=(1, 2, 1, 2, 2)))
    with jax.set_mesh(mesh), activation_rules():
        assert activation_spec(("batch", "seq", None), (4, 16, 8)) == P("data", "context", None)
        assert activation_spec(("batch", "seq", "heads", "kv"), (4, 16, 4, 8)) == P("data", "context", "tensor", None)
        assert activation_spec(("batch", "kv_seq", "kv_heads", "kv"), (4, 16, 2, 8)) == P("data", None, "tensor", None)
    check_rule_names(("kv_seq=context", "seq="), model_axes={})  # both are activation names
    # Inputs: [batch, seq] arrays split their tokens over context where it divides them; other ranks
    # keep what follows the batch whole.
    assert batch_sharding(mesh, (), 2, seq_len=16).spec == P("data", "context")
    assert batch_sharding(mesh, (), 2, seq_len=7).spec == P("data", None)
    assert batch_sharding(mesh, (), 4).spec == P("data", None, None, None)
    assert batch_sharding(mesh, (), 1).spec == P("data")


# The step: sharded == unsharded, and its memory ----------------------------------------------
def tiny_long_context(mesh: MeshConfig) -> ExperimentConfig:
    exp = registry.load_experiment("lm_long_context")
    return exp.replace(mesh=mesh, data=exp.data.replace(train=exp.data.train.replace(batch_size=2)))


def long_rows() -> dict[str, np.ndarray]:
    """Two rows of 2048 random tokens; the second packs two documents (split at 1000)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 256, (2, SEQ + 1)).astype(np.int32)
    segment_ids = np.ones((2, SEQ), np.int32)
    segment_ids[1, 1000:] = 2
    segment_pos = np.tile(np.arange(SEQ, dtype=np.int32), (2, 1))
    segment_pos[1, 1000:] -= 1000
    weights = np.ones((2, SEQ), np.float32)
    weights[1, -10:] = 0
    return {"ids": ids[:, :-1], "labels": ids[:, 1:], "weights": weights, "segment_ids": segment_ids,
            "segment_pos": segment_pos}  # fmt: skip


class Step:
    """The loss and its gradients w.r.t. the parameters (lm_long_context's model) on one mesh: the
    run's own Programs (state shardings, input placement, rules), compiled once."""

    def __init__(self, mesh: MeshConfig):
        self.exp = tiny_long_context(mesh)
        self.exp.validate(data_files=False)
        programs = Programs(build_task(self.exp), build_mesh(mesh, jax.devices()[: mesh.num_devices]), mesh.rules)
        task, state = programs.task, programs.init_state(0)

        def loss_and_grads(params, batch):
            loss = lambda p: task.forward(p, state.nt_state, batch, None, Mode.TRAIN).metrics["total_loss"].value
            return jax.value_and_grad(loss)(params)

        jitted = jax.jit(loss_and_grads, in_shardings=(programs.state_shardings.params, None))
        self.fn = UnderMesh(jitted, programs.mesh, programs.rules)
        self.params, self.batch = state.params, programs.global_batch(long_rows())
        self.compiled = self.fn.lower(self.params, self.batch).compile()
        self.loss, self.grads = self.fn(self.params, self.batch)

    @property
    def temp_bytes(self) -> int:
        return self.compiled.memory_analysis().temp_size_in_bytes


@pytest.fixture(scope="module")
def one_device() -> Step:
    return Step(MeshConfig())


@pytest.fixture(scope="module")
def context_8() -> Step:
    return Step(MeshConfig(ici_mesh_shape=(1, 1, 1, 8, 1)))


def test_context_8_equals_one_device_loss_and_gradients(one_device, context_8):
    assert context_8.batch["ids"].sharding.spec == P(None, "context")  # each device got 256 tokens a row
    assert context_8.batch["ids"].addressable_shards[0].data.shape == (2, SEQ // 8)
    assert "all-gather" in context_8.compiled.as_text()  # the keys and values, gathered
    assert_same_math(context_8.loss, one_device.loss)
    assert_same_math_tree(context_8.grads, one_device.grads)


def test_data_context_and_tensor_together_equal_one_device(one_device):
    mixed = Step(MeshConfig(ici_mesh_shape=(1, 2, 1, 2, 2)))
    assert mixed.batch["ids"].sharding.spec == P("data", "context")
    assert_same_math(mixed.loss, one_device.loss)
    assert_same_math_tree(mixed.grads, one_device.grads)


def test_activation_memory_falls_about_one_over_n_and_the_plan_follows(one_device, context_8):
    """XLA:CPU's temporaries per device of the same compiled programs: one device's over 8
    context shards' within 25% of 8 (benchmarks/context_parallel_memory.py prints N = 1, 2, 4, 8;
    docs/long_context.md has the table); the dry run's activation estimate within 25% of each."""
    ratio = one_device.temp_bytes / context_8.temp_bytes
    assert 0.75 * 8 <= ratio <= 1.25 * 8, ratio
    for step in (one_device, context_8):
        planned = MemoryModel(step.exp).bytes_for(step.exp).activations
        assert math.isclose(planned, step.temp_bytes, rel_tol=0.25), (step.exp.mesh.shape, planned, step.temp_bytes)


# The planner and the command line -----------------------------------------------------------
def test_the_dry_run_plans_the_split_sequence():
    text = plan(registry.load_experiment("lm_long_context")).text
    assert "mesh (stage, data, fsdp, context, tensor) = (1, 1, 1, 8, 1)" in text
    assert "seq 2048 (256 a device over context)" in text
    assert "attention XLA, with S / N x S scores" in text


def test_recommend_proposes_a_context_axis_for_a_long_row_and_its_dry_run_agrees():
    """One row of 32768 tokens on 8 H100s of 16 GiB: the batch cannot be split, so the devices
    split the row; the printed flags name the 5-entry mesh and their dry run fits."""
    from pax_eqx.programs.plan.recommend import recommend

    found = recommend(registry.load_experiment("lm_long_context_32k"), 8, 16.0, "h100")
    assert found.best is not None and found.best.layout.shape["context"] > 1
    flags = found.flags
    ici = flags[flags.index("--mesh.ici-mesh-shape") + 1 : flags.index("--mesh.ici-mesh-shape") + 6]
    assert len(ici) == 5 and int(ici[3]) == found.best.layout.shape["context"]


def test_lm_long_context_trains_at_2k_on_8_devices_from_the_command_line(tmp_path, capsys, entry_hooks_restored):
    """`python -m pax_eqx.train --exp lm_long_context ...`'s main, in this process (its 8 fake
    devices): three steps, every row split 8 ways, then the end-of-run eval."""
    job = tmp_path / "job"
    code = train.main(["--exp", "lm_long_context", "--job-log-dir", str(job), "--train.num-steps", "3",
                       "--train.summary-interval-steps", "1"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "mesh: context 8" in out and "2,048 tokens" in out
    records = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    train_steps = {r["step"]: r["loss"] for r in records if r["split"] == "train"}
    assert sorted(train_steps) == [1, 2, 3] and all(math.isfinite(v) for v in train_steps.values())
    assert any(r["split"] == "eval" for r in records)
