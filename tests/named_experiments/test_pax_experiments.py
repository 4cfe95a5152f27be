"""lm_cloud and c4 experiments: Pax's numbers (c4_test style), aliases, dry runs and parameter counts."""

from __future__ import annotations

import math
import re

import pytest
from pax_table import (
    ALL,
    C4_SPMD,
    LM_CLOUD_SPMD,
    LM_CLOUD_TRANSFORMER_ADAM,
    MODULE,
    Row,
    pax_param_count,
)

from experiments import registry
from pax_eqx.config import switch_variant
from pax_eqx.data import ByteTokenizerConfig, SyntheticSource
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.learners import AdamWConfig
from pax_eqx.programs.plan.dry_run import plan

IDS = [r.name for r in ALL]


def synthetic(exp: ExperimentConfig) -> ExperimentConfig:
    """The `--data.source synthetic --data.tokenizer byte` swap (c4 data is not on disk)."""
    data = exp.data.replace(source=switch_variant(exp.data.source, SyntheticSource), tokenizer=ByteTokenizerConfig())
    return exp.replace(data=data)


def dry_run(name: str) -> str:
    """The experiment's dry-run plan (abstract: no arrays, any mesh size)."""
    return plan(synthetic(registry.load_experiment(name))).text


def planned_params(text: str) -> int:
    return int(re.search(r"Parameters: ([\d,]+)", text).group(1).replace(",", ""))


# Shapes, batch, mesh, dtype, steps --------------------------------------------------------------
@pytest.mark.parametrize("row", ALL, ids=IDS)
def test_shape_batch_mesh_dtype_and_steps_are_paxs(row: Row):
    exp = registry.load_experiment(row.name)
    m = exp.model
    assert exp.name == row.name
    assert (m.num_layers, m.model_dims, m.hidden_dims) == (row.layers, row.dims, row.hidden)
    assert (m.num_heads, m.head_dim) == (row.heads, row.head_dim)
    assert m.vocab_size == row.vocab
    assert exp.data.seq_len == row.seq
    # One process drives every device: the per-host batch is the global batch (per-core x devices).
    assert exp.data.train.batch_size == exp.data.eval.batch_size == row.global_batch
    assert (exp.mesh.ici_mesh_shape, exp.mesh.dcn_mesh_shape) == (row.ici, row.dcn)
    assert exp.train.fprop_dtype == row.dtype
    assert m.repeat is row.repeat
    assert exp.train.num_steps == row.steps


@pytest.mark.parametrize("row", LM_CLOUD_SPMD, ids=[r.name for r in LM_CLOUD_SPMD])
def test_lm_cloud_spmd_architecture_and_optimizer(row: Row):
    exp = registry.load_experiment(row.name)
    m, block = exp.model, exp.model.block
    att = block.attention
    named = row.name in ("lm_cloud_spmd_32b", "lm_cloud_spmd_64b")  # Pax's SAVE_CONTEXT_AND_OUT_PROJ
    assert m.remat_policy == ("save_context_and_out_proj" if named else "full")  # else SAVE_NOTHING
    assert block.activation.name == "gelu" and not block.activation.gated  # Praxis GELU: tanh form
    assert (att.combine_qkv, att.use_bias, att.per_dim_scale, att.logit_cap) == (True, False, True, 50.0)
    assert (m.soft_cap_logits, m.position_embedding, m.separate_embedding) == (30.0, "sinusoidal", False)
    assert m.scale_embedding_sqrt_depth and m.softmax_bias  # softmax_tpl.scale_sqrt_depth; FullSoftmax bias
    assert block.norm.epsilon == m.final_norm.epsilon == 1e-6 and block.ff_has_bias
    assert m.embedding_init.method == "gaussian" and m.embedding_init.scale == pytest.approx(1 / math.sqrt(row.dims))
    assert (m.init.method, m.init.scale) == ("xavier", 1.000001)
    assert_set_default_adam(exp, learning_rate=2.5e-4)
    assert exp.data.source.kind == "synthetic"
    assert (exp.checkpoint.every_n_steps, exp.checkpoint.max_to_keep) == (5000, 10)
    assert (exp.train.summary_interval_steps, exp.train.eval_interval_steps) == (100, 100)


@pytest.mark.parametrize("row", LM_CLOUD_TRANSFORMER_ADAM, ids=[r.name for r in LM_CLOUD_TRANSFORMER_ADAM])
def test_lm_cloud_transformer_adam_is_data_parallel_relu_separate_qkv_float32(row: Row):
    exp = registry.load_experiment(row.name)
    m, att = exp.model, exp.model.block.attention
    assert exp.model.block.activation.name == "relu"
    assert (att.combine_qkv, att.use_bias, att.per_dim_scale, att.logit_cap) == (False, False, True, 50.0)
    assert (m.soft_cap_logits, m.position_embedding, m.remat_policy) == (0.0, "sinusoidal", "none")
    assert_set_default_adam(exp, learning_rate=1e-3)
    assert exp.data.source.kind == "synthetic"


def assert_set_default_adam(exp: ExperimentConfig, learning_rate: float) -> None:
    """model_params.set_default_adam: Adam 0.9/0.99, eps 1e-6, cap 1.0, wd 1e-3 on all, clip 5,
    LinearRampupExponentialDecay(4000, 4001, 300000, 0.1, 1.0)."""
    ln, s = exp.learner, exp.learner.schedule
    assert (ln.optimizer, ln.learning_rate) == (AdamWConfig(b1=0.9, b2=0.99, eps=1e-6, eps_root=0.0), learning_rate)
    assert (ln.weight_decay, ln.weight_decay_mask, ln.clip_grad_norm, ln.clip_update_rms) == (1e-3, "all", 5.0, 1.0)
    assert (s.kind, s.warmup_steps, s.decay_start, s.decay_end, s.min_ratio, s.max) == (
        "exponential", 4000, 4001, 300000, 0.1, 1.0,
    )  # fmt: skip
    assert ln.skip_nonfinite  # Paxml's Learner.check_valid_step


@pytest.mark.parametrize("row", C4_SPMD, ids=[r.name for r in C4_SPMD])
def test_c4_spmd_recipe(row: Row):
    exp = registry.load_experiment(row.name)
    m, att = exp.model, exp.model.block.attention
    assert m.remat_policy == ("full" if row.repeat else "none")
    assert (att.combine_qkv, att.use_bias, att.per_dim_scale, att.logit_cap, m.soft_cap_logits) == (
        True, False, True, 50.0, 30.0,
    )  # fmt: skip
    assert m.position_embedding == "sinusoidal" and exp.model.block.activation.name == "gelu"
    assert_set_default_adam(exp, learning_rate=1e-3)  # the c4 non-GPT-3 recipe is the same Adam
    assert exp.checkpoint.every_n_steps == 1000
    assert exp.train.summary_interval_steps == (100 if row.name == "c4_spmd_adam" else 10)
    data = exp.data
    source = data.source
    assert (source.kind, source.path, source.layout, data.tokenizer.kind) == ("jsonl", "", "packed", "sentencepiece")
    assert data.tokenizer.vocab_size == row.vocab
    assert (data.train.input_random_seed, data.eval.input_random_seed) == (9876, 4321)
    assert data.eval.reset_for_eval and not data.eval.repeat and data.train.repeat


def test_c4_gpt3_175b_is_paxs_orghp_base():
    exp = registry.load_experiment("c4_gpt3_175b")
    m, att = exp.model, exp.model.block.attention
    assert (att.combine_qkv, att.use_bias, att.per_dim_scale, att.logit_cap) == (True, True, False, 0.0)
    assert (m.soft_cap_logits, m.position_embedding, m.max_seq_len) == (0.0, "trainable", 16384)
    assert not m.scale_embedding_sqrt_depth and not m.softmax_bias
    assert m.block.norm.epsilon == m.final_norm.epsilon == 1e-5
    assert (m.init.method, m.init.scale, m.embedding_init.scale) == ("gaussian", 0.006, 0.006)
    assert m.remat_policy == "full"
    ln, s = exp.learner, exp.learner.schedule
    assert (ln.learning_rate, ln.optimizer) == (6e-5, AdamWConfig(b1=0.9, b2=0.95, eps=1e-8, eps_root=0.0))
    assert (ln.weight_decay, ln.weight_decay_mask, ln.clip_grad_norm, ln.clip_update_rms) == (0.1, "all", 1.0, 0.0)
    assert (s.kind, s.warmup_steps, s.decay_start, s.decay_end, s.min_ratio, s.max) == (
        "cosine", 265, 266, 108600, 0.1, 1.0,
    )  # fmt: skip
    assert (exp.train.eval_interval_steps, exp.train.summary_interval_steps) == (100, 10)
    assert (exp.checkpoint.every_n_steps, exp.checkpoint.max_to_keep) == (100, 10)
    assert exp.data.tokenizer.vocab_size == 50257


def test_the_c4_learning_rate_rule_when_pax_leaves_it_unset():
    """set_adam_and_learning_rate_schedule with LEARNING_RATE / cosine steps None (MLPerf HP classes)."""
    from experiments.c4 import set_adam_and_learning_rate_schedule

    small = set_adam_and_learning_rate_schedule(
        global_batch_size=1536, learning_rate=None, lr_schedule="linear_rampup_cosine_decay",
        lr_cos_warmup=None, lr_cos_decay_start=None, lr_cos_decay_end=None,
    )  # fmt: skip
    assert small.learning_rate == 2e-5
    assert (small.schedule.warmup_steps, small.schedule.decay_start, small.schedule.decay_end) == (265, 266, 108600)
    big = set_adam_and_learning_rate_schedule(
        global_batch_size=4096, learning_rate=None, lr_schedule="linear_rampup_cosine_decay",
        lr_cos_warmup=None, lr_cos_decay_start=None, lr_cos_decay_end=None,
    )  # fmt: skip
    assert big.learning_rate == 3e-5
    assert (big.schedule.warmup_steps, big.schedule.decay_end) == (math.ceil(265 * 1536 / 4096), 40725)
    with pytest.raises(ValueError, match="8192"):
        set_adam_and_learning_rate_schedule(global_batch_size=16384)


# Names and aliases ----------------------------------------------------------------------------
def test_every_registered_name_and_alias_loads():
    for name in registry.names():
        assert isinstance(registry.load_experiment(name), ExperimentConfig), name
    for alias, name in registry.aliases().items():
        assert registry.load_experiment(alias) == registry.load_experiment(name), alias


@pytest.mark.parametrize("row", ALL, ids=IDS)
def test_pax_class_name_and_pax_exp_path_are_aliases(row: Row):
    want = registry.load_experiment(row.name)
    assert registry.load_experiment(row.pax_class) == want
    assert registry.load_experiment(f"tasks.lm.params.{MODULE[row.name]}.{row.pax_class}") == want


@pytest.mark.parametrize("row", ALL, ids=IDS)
def test_config_round_trips_through_json(row: Row):
    exp = registry.load_experiment(row.name)
    assert ExperimentConfig.from_json(exp.to_json()) == exp


# Dry runs and parameter counts ------------------------------------------------------------------
@pytest.mark.parametrize("row", ALL, ids=IDS)
def test_dry_run_builds_with_paxs_parameter_count(row: Row):
    """The planned count is Pax's exact count, and within 1% of the doc's derived count."""
    text = dry_run(row.name)
    assert planned_params(text) == pax_param_count(row)
    assert planned_params(text) == pytest.approx(row.pax_params, rel=0.01)
    mesh = f"({', '.join(str(i * d) for i, d in zip(row.ici, row.dcn))})"
    assert f"mesh (data, fsdp, tensor) = {mesh}" in text
