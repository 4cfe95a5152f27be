"""Pipelined experiments: Pax's pipelined C4 runs (paxml/tasks/lm/params/c4.py) and a CPU-sized one.

Pax trains its large GPT-3 runs with the layers pipelined over a `stage` mesh axis
(TransformerLmSpmdPipelineAdam: NUM_STAGES, MICROBATCH_SIZE, a 4-D [stage, replica, data, mdl]
mesh; its README's GPT-3 XL recipe is C4SpmdPipelineGpt3SmallAdam64Replicas). Every number
here is Pax's, resolved through the class MRO (docs/pax_experiment_numbers.md §4.2); a class is
its non-pipelined sibling (experiments/c4.py) with the pipeline constants changed. Pax's
mesh [stage, replica, data, mdl] is our (stage, data, fsdp, tensor).
The GPT-3 classes stop once the eval log-perplexity reaches 2.69, as c4_gpt3_175b does
(configure_gpt3_task's EarlyStoppingFn, TARGET_LOG_PPLX).

Two of Pax's classes carry typos that change what they run, reproduced as Pax ran them:
C4SpmdPipelineGpt3AdamOrgHPBS1p5k768Replicas sets `MICROBATCH_SIAZE = 8`, so MICROBATCH_SIZE
stays 2 (768 microbatches of 2, not the 192 of its comment); C4SpmdPipelineGpt3SmallAdam64Replicas
(renamed ...8Replicas in Pax in 2023; Pax's README still names it) sets `PER_CORE_BATCH_SIZE = 8`,
which nothing reads, so its global batch is 64 (4 microbatches of 16), not the 512 of its
docstring.

Departures from Pax, besides those of experiments/c4.py:

- STREAM_IO (the MLPerf classes) streams the microbatches in stage-sharded slices; here the
  microbatch buffer is split over data x fsdp and replicated over stage. Same math.
- EMB_W_DATA_DIMS ('replica', 'data') shards the softmax weight's model dimension over both
  batch axes; here the embed rule (fsdp) applies, as in every other experiment.
- Pax's bubble iterations stop weight gradients with `stop_gradient`; ours never reach the
  output, so their gradient is zero by construction.
"""

from __future__ import annotations

from experiments.c4 import C4_GPT3_175B, C4_SPMD_ADAM, gpt3_org_hp, set_adam_and_learning_rate_schedule
from experiments.lm_cloud import PaxLm, pax_names
from experiments.registry import register
from experiments.shakespeare import shakespeare_char
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.layers.pipeline import PipelineConfig
from pax_eqx.sharding.mesh import MeshConfig


def _gpt3_mlperf_hp(spec: PaxLm) -> PaxLm:
    """C4SpmdPipelineGpt3AdamMLPerfHP: LEARNING_RATE and the cosine steps None, i.e. derived from
    the global batch (2e-5 up to 3584, else 3e-5; warmup ceil(265 x 1536 / B), decay end
    ceil(108600 x 1536 / B))."""
    return spec.replace(
        learner=set_adam_and_learning_rate_schedule(
            global_batch_size=spec.global_batch_size, learning_rate=None, weight_decay=0.1, adam_beta1=0.9,
            adam_beta2=0.95, adam_epsilon=1e-8, adam_clip_threshold=-1.0, clip_gradient_norm_to_value=1.0,
            lr_schedule="linear_rampup_cosine_decay", lr_cos_warmup=None, lr_cos_decay_start=None,
            lr_cos_decay_end=None, lr_cos_max=1.0, lr_cos_min_ratio=0.1,
        )
    )  # fmt: skip


_PIPELINE_8 = dict(ici_mesh_shape=(2, 1, 2, 2), dcn_mesh_shape=(1, 1, 1, 1), num_stages=2, microbatch_size=2)

# C4SpmdPipelineAdam: C4SpmdAdam with 2 stages of 12 layers, microbatches of 2 (4 of them); its
# SAVE_DOT_FOR_MLPERF_200B is live here (each stage iteration is rematerialised with it).
C4_SPMD_PIPELINE_ADAM = C4_SPMD_ADAM.replace(**_PIPELINE_8)

# C4SpmdPipelineGpt3AdamOrgHP (not registered in Pax): GPT-3 175B (c4_gpt3_175b), 2 stages of
# 48 layers, 4 microbatches of 2, on [2, 1, 2, 2].
C4_SPMD_PIPELINE_GPT3_ORG_HP = C4_GPT3_175B.replace(use_repeated_layer=False, **_PIPELINE_8)

C4_SPMD_PIPELINE_GPT3_ORG_HP_BS1P5K_768 = gpt3_org_hp(
    C4_SPMD_PIPELINE_GPT3_ORG_HP.replace(
        vocab_size=51200, percore_batch_size=2, num_stages=8, ici_mesh_shape=(8, 1, 8, 12), microbatch_size=2,
        eval_interval_steps=25, summary_interval_steps=1, checkpoint_every_n_steps=50, checkpoint_max_to_keep=100,
    )
)  # fmt: skip

# C4SpmdPipelineGpt3AdamMLPerfHP (not registered in Pax: "subclass must set the eval and the
# checkpoint intervals") and its registered batch sizes.
_MLPERF_HP = C4_SPMD_PIPELINE_GPT3_ORG_HP.replace(
    vocab_size=51200, summary_interval_steps=1, checkpoint_max_to_keep=100
)


def _mlperf(percore: int, stages: int, ici: tuple[int, ...], microbatch: int, eval_every: int) -> PaxLm:
    """An MLPerf batch size: its per-core batch, stages, ICI mesh, microbatch, eval interval
    (checkpoints every 2 evals)."""
    return _gpt3_mlperf_hp(
        _MLPERF_HP.replace(
            percore_batch_size=percore, num_stages=stages, ici_mesh_shape=ici, microbatch_size=microbatch,
            eval_interval_steps=eval_every, checkpoint_every_n_steps=2 * eval_every,
        )
    )  # fmt: skip


C4_PIPELINE_MLPERF_BS1P5K_768 = _mlperf(2, 8, (8, 1, 8, 12), 8, 16)
C4_PIPELINE_MLPERF_BS2K_512 = _mlperf(4, 8, (8, 1, 8, 8), 8, 12)
C4_PIPELINE_MLPERF_BS3K_768 = _mlperf(4, 4, (4, 1, 16, 12), 16, 8)
C4_PIPELINE_MLPERF_BS4K_1024 = _mlperf(4, 8, (8, 1, 8, 16), 8, 6)
C4_PIPELINE_MLPERF_BS8K_1024 = _mlperf(8, 4, (4, 1, 16, 16), 16, 3)

# C4SpmdPipelineGpt3SmallAdam8Replicas: "GPT-3 XL" of the paper's table (1.3B there; 24 layers,
# d 3072 here), bf16, lr 2e-4, per-core 64 on [2, 1, 2, 2] (global 512), 64 microbatches of 8.
_GPT3_SMALL = C4_SPMD_PIPELINE_GPT3_ORG_HP.replace(
    num_layers=24, num_heads=24, model_dims=3072, hidden_dims=12288, dims_per_head=128, fprop_dtype="bfloat16"
)
C4_PIPELINE_GPT3_SMALL_8 = gpt3_org_hp(
    _GPT3_SMALL.replace(
        vocab_size=51200, percore_batch_size=64, microbatch_size=8, eval_interval_steps=10,
        summary_interval_steps=5, checkpoint_every_n_steps=200, checkpoint_max_to_keep=1000,
    ),
    learning_rate=2e-4,
)  # fmt: skip
# ...Adam64Replicas, as it was (paxml 9b56820..b96c1e9^): 4 stages on [4, 1, 4, 4] (64 chips),
# vocab 50257, per-core batch 1 (the PER_CORE_BATCH_SIZE typo), microbatches of 16.
C4_PIPELINE_GPT3_SMALL_64 = gpt3_org_hp(
    _GPT3_SMALL.replace(
        num_stages=4, ici_mesh_shape=(4, 1, 4, 4), percore_batch_size=1, microbatch_size=16,
        eval_interval_steps=100, summary_interval_steps=1, checkpoint_every_n_steps=200, checkpoint_max_to_keep=1000,
    ),
    learning_rate=2e-4,
)  # fmt: skip


@register("c4_spmd_pipeline_adam", aliases=pax_names("c4", "C4SpmdPipelineAdam"))
def c4_spmd_pipeline_adam() -> ExperimentConfig:
    """c4_spmd_adam (1.27B, float32, batch 8) pipelined: 2 stages x 12 layers, 4 microbatches of 2,
    mesh (stage 2, data 1, fsdp 2, tensor 2)."""
    return C4_SPMD_PIPELINE_ADAM.experiment("c4_spmd_pipeline_adam")


@register("c4_spmd_pipeline_gpt3_adam_org_hp", aliases=pax_names("c4", "C4SpmdPipelineGpt3AdamOrgHP"))
def c4_spmd_pipeline_gpt3_adam_org_hp() -> ExperimentConfig:
    """c4_gpt3_175b pipelined: 2 stages x 48 layers, 4 microbatches of 2 on (2, 1, 2, 2), float32.

    Pax's base of the pipelined GPT-3 classes, which Pax does not register."""
    return C4_SPMD_PIPELINE_GPT3_ORG_HP.experiment("c4_spmd_pipeline_gpt3_adam_org_hp")


@register(
    "c4_spmd_pipeline_gpt3_adam_org_hp_bs1p5k_768replicas",
    aliases=pax_names("c4", "C4SpmdPipelineGpt3AdamOrgHPBS1p5k768Replicas"),
)
def c4_spmd_pipeline_gpt3_adam_org_hp_bs1p5k_768replicas() -> ExperimentConfig:
    """GPT-3 175B, batch 1536 on (8, 1, 8, 12) = 768 chips: 8 stages x 12 layers, 768 microbatches of 2
    (Pax's MICROBATCH_SIAZE typo), vocab 51200, lr 6e-5."""
    return C4_SPMD_PIPELINE_GPT3_ORG_HP_BS1P5K_768.experiment("c4_spmd_pipeline_gpt3_adam_org_hp_bs1p5k_768replicas")


def _register_mlperf(name: str, cls: str, spec: PaxLm, doc: str) -> None:
    def build() -> ExperimentConfig:
        return spec.experiment(name)

    build.__doc__ = doc
    register(name, aliases=pax_names("c4", cls))(build)


for _name, _cls, _spec in [
    ("bs1p5k_768replicas", "BS1p5k768Replicas", C4_PIPELINE_MLPERF_BS1P5K_768),
    ("bs2k_512replicas", "BS2k512Replicas", C4_PIPELINE_MLPERF_BS2K_512),
    ("bs3k_768replicas", "BS3k768Replicas", C4_PIPELINE_MLPERF_BS3K_768),
    ("bs4k_1024replicas", "BS4k1024Replicas", C4_PIPELINE_MLPERF_BS4K_1024),
    ("bs8k_1024replicas", "BS8k1024Replicas", C4_PIPELINE_MLPERF_BS8K_1024),
]:
    _p = _spec.pipeline
    _register_mlperf(
        f"c4_spmd_pipeline_gpt3_adam_mlperf_hp_{_name}",
        f"C4SpmdPipelineGpt3AdamMLPerfHP{_cls}",
        _spec,
        f"GPT-3 175B, MLPerf hyperparameters for batch {_spec.global_batch_size}: {_p.num_stages} stages x "
        f"{_spec.num_layers // _p.num_stages} layers, {_p.num_microbatches} microbatches on {_spec.ici_mesh_shape}, "
        f"lr {_spec.learner.learning_rate:g}.",
    )


@register("c4_spmd_pipeline_gpt3_small_adam_8replicas", aliases=pax_names("c4", "C4SpmdPipelineGpt3SmallAdam8Replicas"))
def c4_spmd_pipeline_gpt3_small_adam_8replicas() -> ExperimentConfig:
    """24 layers, d 3072, 24 heads of 128, vocab 51200, bf16, batch 512 on (2, 1, 2, 2): 2 stages x 12
    layers, 64 microbatches of 8, lr 2e-4."""
    return C4_PIPELINE_GPT3_SMALL_8.experiment("c4_spmd_pipeline_gpt3_small_adam_8replicas")


@register(
    "c4_spmd_pipeline_gpt3_small_adam_64replicas", aliases=pax_names("c4", "C4SpmdPipelineGpt3SmallAdam64Replicas")
)
def c4_spmd_pipeline_gpt3_small_adam_64replicas() -> ExperimentConfig:
    """Pax README's GPT-3 XL recipe: 24 layers, d 3072, bf16 on (4, 1, 4, 4) = 64 chips: 4 stages x 6 layers,
    batch 64 (Pax's PER_CORE_BATCH_SIZE typo) in 4 microbatches of 16, vocab 50257, lr 2e-4."""
    return C4_PIPELINE_GPT3_SMALL_64.experiment("c4_spmd_pipeline_gpt3_small_adam_64replicas")


@register("shakespeare_pipelined", aliases=("ShakespearePipelined",))
def shakespeare_pipelined() -> ExperimentConfig:
    """shakespeare_char (4 layers, d 128, batch 12) pipelined: 2 stages x 2 layers, 4 microbatches of 3,
    on 2 devices (stage 2). On one CPU: XLA_FLAGS=--xla_force_host_platform_device_count=2."""
    exp = shakespeare_char()
    return exp.replace(
        name="shakespeare_pipelined",
        # A pipeline's stages are slices of stacked layers: repeat=True (shakespeare_char unrolls its list).
        model=exp.model.replace(repeat=True, pipeline=PipelineConfig(num_stages=2, num_microbatches=4)),
        mesh=MeshConfig(ici_mesh_shape=(2, 1, 1, 1)),
    )
