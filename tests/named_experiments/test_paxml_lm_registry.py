"""Every experiment Paxml 1.4.0 registers in paxml/tasks/lm/params/{c4, c4_multislice, lm_cloud,
nvidia, optimal_scaling}.py resolves by its class name and by Pax's `--exp` path, and plans.

The class lists are the `@experiment_registry.register` classes of the paxml-v1.4.0 files; the
numbers checked here are the ones a class gets only through its MRO and `task()` (a fractional
per-core batch, the Llama task, Adafactor, the early stop, the MLP tests' loss). Configs and dry
runs only: nothing is compiled. Every field against Pax: docs/pax_experiment_numbers.md §8-§10.
"""

from __future__ import annotations

import re

import pytest
from test_pax_experiments import synthetic

from experiments import registry
from pax_eqx.models.token_mlp import TokenMlp
from pax_eqx.programs.plan.dry_run import plan

PAXML_1_4_0 = {
    "c4": [
        "LmCloudSpmdAdam", "LmCloudSpmdAdamLimitSteps", "C4SpmdAdam", "C4SpmdGpt3AdamOrgHPBS1p5k1536Replicas",
        "C4SpmdPipelineAdam", "C4SpmdPipelineGpt3AdamOrgHPBS1p5k768Replicas",
        "C4SpmdPipelineGpt3AdamMLPerfHPBS1p5k768Replicas", "C4SpmdPipelineGpt3AdamMLPerfHPBS2k512Replicas",
        "C4SpmdPipelineGpt3AdamMLPerfHPBS3k768Replicas", "C4SpmdPipelineGpt3AdamMLPerfHPBS4k1024Replicas",
        "C4SpmdPipelineGpt3AdamMLPerfHPBS8k1024Replicas", "C4Spmd1BAdam4Replicas", "C4Spmd1BAdam4ReplicasLimitSteps",
        "C4Spmd2BAdam4Replicas", "C4Spmd16BAdam32Replicas", "C4Spmd32BAdam64Replicas", "C4SpmdGpt3L16AdamOrgHP",
        "C4SpmdPipelineGpt3SmallAdam8Replicas",
    ],
    "c4_multislice": [
        "C4Spmd22BAdamMaxText", "C4Spmd22BAdam1xv4_128", "C4Spmd22BAdam2xv4_128", "C4Spmd22BAdam4xv4_128",
        "C4Spmd22BAdam1xv4_128LimitSteps", "C4Spmd22BAdam2xv4_128LimitSteps", "C4Spmd22BAdam4xv4_128LimitSteps",
        "C4Spmd22BAdam1xv4_384", "C4Spmd22BAdam2xv4_384", "C4Spmd22BAdam1xv4_8", "C4Spmd22BAdam2xv4_8",
        "C4Spmd22BAdam4xv4_8", "C4Spmd22BAdam1xv4_8LimitSteps", "C4Spmd22BAdam2xv4_8LimitSteps",
        "C4Spmd22BAdam4xv4_8LimitSteps", "C4SpmdGpt3AdamDataParallel2x16x16", "C4Spmd32BAdam1xv5_256",
        "C4Spmd32BAdam2xv5_256",
    ],
    "lm_cloud": [
        "LargeMlp", "SmallMlp", "LmCloudTransformerAdam", "LmCloudTransformerAdamTest",
        "LmCloudTransformerAdamLimitSteps", "LmCloudSpmdTest", "LmCloudSpmd2B", "LmCloudSpmd2BLimitSteps",
        "LmCloudSpmd32B", "LmCloudSpmd64B",
        "LmCloudSpmd128B", "LmCloudSpmd256B", "LmCloudSpmd512B", "LmCloudSpmd1024B", "LmCloudSpmdPipeline9B",
        "LmCloudSpmdPipeline175B", "LmCloudSpmdMultislice2B", "LmCloudSpmdPipelineMultislice2B",
        "LmCloudSpmdPipelineMultislice2BCircular",
    ],
    "nvidia": [
        "NVIDIA1_3B", "NVIDIA5B", "NVIDIA8_3B", "NVIDIA10B", "NVIDIA40BProxy", "NVIDIA70BProxy", "NVIDIA116BProxy",
        "NVIDIA175BProxy", "NVIDIA175B", "TestSmallConfig", "Llama33BProxy", "NVIDIA175B_FSDP", "Llama2_7B",
        "Llama2_13B", "Llama2_70B", "MoELarge",
    ],
    "optimal_scaling": [
        "OptimalScaling2x2x1", "OptimalScaling2x2x2", "OptimalScaling2x2x4", "OptimalScaling2x4x4",
        "OptimalScaling4x4x4", "OptimalScaling4x4x8", "OptimalScaling4x8x8", "OptimalScaling4x8x16",
        "OptimalScaling4x16x16", "OptimalScaling4x16x32", "OptimalScaling4x24x32",
    ],
}  # fmt: skip
CLASSES = [(module, cls) for module, classes in PAXML_1_4_0.items() for cls in classes]
# Registered before issue 48, and planned by test_pax_experiments.py, test_pipelined_experiments.py
# and test_experiments_cli_and_docs.py; the dry-run test below plans the 52 others.
EARLIER = {
    "C4SpmdAdam", "C4SpmdPipelineAdam", "C4SpmdPipelineGpt3AdamOrgHPBS1p5k768Replicas",
    "C4SpmdPipelineGpt3AdamMLPerfHPBS1p5k768Replicas", "C4SpmdPipelineGpt3AdamMLPerfHPBS2k512Replicas",
    "C4SpmdPipelineGpt3AdamMLPerfHPBS3k768Replicas", "C4SpmdPipelineGpt3AdamMLPerfHPBS4k1024Replicas",
    "C4SpmdPipelineGpt3AdamMLPerfHPBS8k1024Replicas", "C4Spmd1BAdam4Replicas", "C4Spmd1BAdam4ReplicasLimitSteps",
    "C4Spmd2BAdam4Replicas", "C4Spmd16BAdam32Replicas", "C4Spmd32BAdam64Replicas",
    "C4SpmdPipelineGpt3SmallAdam8Replicas", "C4Spmd22BAdam1xv4_128", "C4Spmd22BAdam2xv4_128", "C4Spmd22BAdam4xv4_128",
    "LmCloudTransformerAdam", "LmCloudTransformerAdamTest", "LmCloudTransformerAdamLimitSteps", "LmCloudSpmdTest",
    "LmCloudSpmd2B", "LmCloudSpmd2BLimitSteps", "LmCloudSpmd32B", "LmCloudSpmd64B", "LmCloudSpmd128B",
    "LmCloudSpmd256B", "LmCloudSpmd512B", "LmCloudSpmd1024B", "MoELarge",
}  # fmt: skip
ADDED = [(module, cls) for module, cls in CLASSES if cls not in EARLIER]


def test_the_five_lm_modules_register_82_classes():
    assert len(CLASSES) == len(set(CLASSES)) == 82 and len(ADDED) == 52


@pytest.mark.parametrize("module, cls", CLASSES, ids=[c for _, c in CLASSES])
def test_class_resolves_by_name_and_by_paxs_path(module, cls):
    exp = registry.load_experiment(cls)
    assert registry.load_experiment(f"tasks.lm.params.{module}.{cls}") == exp


@pytest.mark.parametrize("module, cls", ADDED, ids=[c for _, c in ADDED])
def test_added_class_plans(module, cls):
    exp = registry.load_experiment(cls)
    text = plan(synthetic(exp)).text
    assert f"Dry run of {exp.name}:" in text and re.search(r"Parameters: [\d,]+", text)


def params(name: str) -> int:
    text = plan(synthetic(registry.load_experiment(name))).text
    return int(re.search(r"Parameters: ([\d,]+)", text).group(1).replace(",", ""))


def test_parameter_counts_are_paxs_architecture():
    """Written out from Praxis' layers (docs/pax_experiment_numbers.md §8-§10)."""
    d, h, v = 2048, 8192, 51200  # NVIDIA1_3B: GPT layer with per-dim scale, learned positions
    assert params("NVIDIA1_3B") == 24 * (4 * d * d + 64 + 2 * d * h + h + d + 4 * d) + v * d + v + 2048 * d + 2 * d
    d, h, n = 4096, 11008, 32  # Llama2_7B: biased GQA, gated MLP with biases, RmsNorm, no position table
    layer = 2 * (d * n * 128) + n * 128 + d + 2 * (d * n * 128 + n * 128) + 3 * d * h + 2 * h + d + 2 * d
    assert params("Llama2_7B") == 32 * layer + v * d + v + d
    d, kv = 8192, 8  # Llama2_70B: 8 key/value heads
    layer = 2 * (d * 64 * 128) + 64 * 128 + d + 2 * (d * kv * 128 + kv * 128) + 3 * d * 28672 + 2 * 28672 + d + 2 * d
    assert params("Llama2_70B") == 80 * layer + v * d + v + d
    d, h = 4096, 7168  # LargeMlp: tied table with bias, 8 biased FeedForwards
    assert params("LargeMlp") == d * d + d + (d * h + h) + 6 * (h * h + h) + (h * d + d)


@pytest.mark.parametrize(
    "cls, batch, microbatches",
    [("NVIDIA10B", 4, 1), ("NVIDIA175B", 6, 6), ("LmCloudSpmdPipeline175B", 96, 48),
     ("C4SpmdGpt3AdamDataParallel2x16x16", 256, 1), ("LmCloudSpmdPipelineMultislice2BCircular", 128, 16)],
)  # fmt: skip
def test_fractional_per_core_batches_and_microbatches(cls, batch, microbatches):
    exp = registry.load_experiment(cls)
    assert exp.data.train.batch_size == exp.data.eval.batch_size == batch
    assert exp.model.pipeline.num_microbatches == microbatches


def test_llama_task_is_praxis_grouped_query_attention_swiglu_rmsnorm_rotary():
    m = registry.load_experiment("Llama2_70B").model
    att = m.block.attention
    assert (m.num_heads, m.num_kv_heads, m.position_embedding, m.max_seq_len) == (64, 8, "rotary", 4096)
    assert (att.use_bias, att.combine_qkv, att.per_dim_scale, att.logit_cap) == (True, False, False, 0.0)
    assert (m.block.activation.name, m.block.activation.gated, m.block.ff_has_bias) == ("swish", True, True)
    assert m.block.norm.kind == m.final_norm.kind == "rms_norm" and m.block.norm.epsilon == 1e-6
    # The base's tied softmax stays: sqrt(d) scale, bias, cap 30.
    assert (m.scale_embedding_sqrt_depth, m.softmax_bias, m.soft_cap_logits) == (True, True, 30.0)


def test_nvidia_optimizers_checkpoints_and_softmax_init():
    adam, ada = registry.load_experiment("NVIDIA5B"), registry.load_experiment("NVIDIA175B_FSDP")
    assert adam.learner.optimizer.kind == "adamw" and (adam.learner.optimizer.b2, adam.learner.clip_update_rms) == (
        0.95, 1.0,
    )  # fmt: skip
    opt = ada.learner.optimizer
    assert (opt.kind, opt.decay_method, opt.decay_rate, opt.beta1, opt.factored_dims) == (
        "adafactor", "adam", 0.99, 0.9, "last",
    )  # fmt: skip
    for exp in (adam, ada):
        s = exp.learner.schedule
        assert (exp.learner.learning_rate, s.kind, s.warmup_steps, s.decay_start, s.decay_end) == (
            6e-4, "cosine", 0, 1, 500_000,
        )  # fmt: skip
        assert (exp.learner.weight_decay, exp.learner.clip_grad_norm, exp.checkpoint.every_n_steps) == (
            1e-3, 1.0, 100_000,
        )  # fmt: skip
    # SOFTMAX_INIT_STD's init is computed and never assigned: the tied table keeps 1/sqrt(d).
    assert adam.model.embedding_init.scale == pytest.approx(1 / 4096**0.5)
    assert adam.model.init.method == "gaussian" and adam.model.init.scale == 0.023


def test_gpt3_classes_stop_early_and_optimal_scaling_remats_dots():
    for cls in ("C4SpmdGpt3L16AdamOrgHP", "C4SpmdGpt3AdamDataParallel2x16x16", "C4SpmdPipelineGpt3SmallAdam8Replicas"):
        stop = registry.load_experiment(cls).train.early_stopping
        assert (stop.metric, stop.target) == ("log_pplx", 2.69)
    assert registry.load_experiment("C4SpmdAdam").train.early_stopping.metric == ""
    m = registry.load_experiment("OptimalScaling4x4x4").model
    assert (m.num_layers, m.model_dims, m.num_heads) == (45, 5760, 45)
    assert m.remat_policy == "dots_with_no_batch_dims_saveable"


def test_mlp_tests_are_classification_model_adam():
    exp = registry.load_experiment("SmallMlp")
    assert type(exp.model).__name__ == "TokenMlpConfig" and TokenMlp.loss_name == "total_loss"  # Pax's accuracy
    assert (exp.train.num_steps, exp.checkpoint.every_n_steps, exp.mesh.ici_mesh_shape) == (10, 5, (8, 1, 1))
    assert (exp.learner.learning_rate, exp.learner.weight_decay, exp.data.train.batch_size) == (1e-3, 1e-3, 128)
