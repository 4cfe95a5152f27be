"""Pax's pipelined C4 experiments carry Pax's numbers (docs/pax_experiment_numbers.md §4.2,
resolved through paxml's c4.py class MRO), and plan with the pipeline the dry run prints."""

import pytest

from experiments import registry
from pax_eqx.programs.plan.dry_run import plan

# name: (Pax class, layers, dims, heads, vocab, global batch, ICI [stage, replica, data, mdl], stages,
#        microbatches, dtype, learning rate, cosine warmup / decay end (None: exponential), eval, ckpt, summary)
PAX = {
    "c4_spmd_pipeline_adam": ("C4SpmdPipelineAdam", 24, 2048, 32, 32128, 8, (2, 1, 2, 2), 2, 4, "float32", 1e-3,
                              None, 100, 1000, 100),
    "c4_spmd_pipeline_gpt3_adam_org_hp": ("C4SpmdPipelineGpt3AdamOrgHP", 96, 12288, 96, 50257, 8, (2, 1, 2, 2), 2, 4,
                                          "float32", 6e-5, (265, 108600), 100, 100, 10),
    "c4_spmd_pipeline_gpt3_adam_org_hp_bs1p5k_768replicas": (
        "C4SpmdPipelineGpt3AdamOrgHPBS1p5k768Replicas", 96, 12288, 96, 51200, 1536, (8, 1, 8, 12), 8, 768, "float32",
        6e-5, (265, 108600), 25, 50, 1),
    "c4_spmd_pipeline_gpt3_adam_mlperf_hp_bs1p5k_768replicas": (
        "C4SpmdPipelineGpt3AdamMLPerfHPBS1p5k768Replicas", 96, 12288, 96, 51200, 1536, (8, 1, 8, 12), 8, 192,
        "float32", 2e-5, (265, 108600), 16, 32, 1),
    "c4_spmd_pipeline_gpt3_adam_mlperf_hp_bs2k_512replicas": (
        "C4SpmdPipelineGpt3AdamMLPerfHPBS2k512Replicas", 96, 12288, 96, 51200, 2048, (8, 1, 8, 8), 8, 256, "float32",
        2e-5, (199, 81450), 12, 24, 1),
    "c4_spmd_pipeline_gpt3_adam_mlperf_hp_bs3k_768replicas": (
        "C4SpmdPipelineGpt3AdamMLPerfHPBS3k768Replicas", 96, 12288, 96, 51200, 3072, (4, 1, 16, 12), 4, 192,
        "float32", 2e-5, (133, 54300), 8, 16, 1),
    "c4_spmd_pipeline_gpt3_adam_mlperf_hp_bs4k_1024replicas": (
        "C4SpmdPipelineGpt3AdamMLPerfHPBS4k1024Replicas", 96, 12288, 96, 51200, 4096, (8, 1, 8, 16), 8, 512,
        "float32", 3e-5, (100, 40725), 6, 12, 1),
    "c4_spmd_pipeline_gpt3_adam_mlperf_hp_bs8k_1024replicas": (
        "C4SpmdPipelineGpt3AdamMLPerfHPBS8k1024Replicas", 96, 12288, 96, 51200, 8192, (4, 1, 16, 16), 4, 512,
        "float32", 3e-5, (50, 20363), 3, 6, 1),
    "c4_spmd_pipeline_gpt3_small_adam_8replicas": (
        "C4SpmdPipelineGpt3SmallAdam8Replicas", 24, 3072, 24, 51200, 512, (2, 1, 2, 2), 2, 64, "bfloat16", 2e-4,
        (265, 108600), 10, 200, 5),
    "c4_spmd_pipeline_gpt3_small_adam_64replicas": (
        "C4SpmdPipelineGpt3SmallAdam64Replicas", 24, 3072, 24, 50257, 64, (4, 1, 4, 4), 4, 4, "bfloat16", 2e-4,
        (265, 108600), 100, 200, 1),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PAX))
def test_pipelined_experiment_has_paxs_numbers(name):
    cls, layers, dims, heads, vocab, batch, ici, stages, micro, dtype, lr, cosine, eval_, ckpt, summary = PAX[name]
    exp = registry.load_experiment(name)
    assert registry.load_experiment(cls) == exp == registry.load_experiment(f"tasks.lm.params.c4.{cls}")
    m = exp.model
    assert (m.num_layers, m.model_dims, m.num_heads, m.vocab_size) == (layers, dims, heads, vocab)
    assert (
        exp.data.train.batch_size == batch
        and exp.mesh.ici_mesh_shape == ici
        and exp.mesh.num_devices == batch // (batch // exp.mesh.num_devices)
    )
    assert (m.pipeline.num_stages, m.pipeline.num_microbatches, m.pipeline.circular_repeat) == (stages, micro, 1)
    assert m.repeat and m.pipeline.remat_stage  # Pax remats each stage iteration with CHECKPOINT_POLICY
    assert exp.train.fprop_dtype == dtype and exp.learner.learning_rate == pytest.approx(lr)
    schedule = exp.learner.schedule
    if cosine is None:
        assert schedule.kind == "exponential"
    else:
        assert schedule.kind == "cosine" and (schedule.warmup_steps, schedule.decay_end) == cosine
    assert (exp.train.eval_interval_steps, exp.checkpoint.every_n_steps) == (eval_, ckpt)
    assert exp.train.summary_interval_steps == summary


def test_the_readme_gpt3_xl_recipe_plans_its_pipeline():
    text = plan(registry.load_experiment("C4SpmdPipelineGpt3SmallAdam64Replicas")).text
    assert "mesh (stage, data, fsdp, tensor) = (4, 1, 4, 4)" in text
    assert "Pipeline: 4 stages x 6 layers" in text and "4 microbatches of 16 rows (4 per device)" in text
    assert "bubble (S - 1) / (M x R + S - 1) = 42.9%" in text
    assert "Parameters: 2,923,594,752" in text
