"""Pax's C4 experiments (paxml/tasks/lm/params/c4.py), with Pax's numbers.

Every number comes from docs/pax_experiment_numbers.md (sections 2.2 and 4): Pax's source
resolved through the class MRO and each `task()`. The experiments are `PaxLm` values
(experiments/lm_cloud.py), one field per Pax class constant; a Pax subclass is `.replace(...)`.
c4.py's pipelined classes are in experiments/pipelined.py, c4_multislice.py's in
experiments/c4_multislice.py. LmCloudSpmdAdam (registered in c4.py) is the c4 recipe on
lm_cloud's synthetic data.

C4 itself cannot be downloaded at run time. The experiments read either

- a corpus prepared once (as Pax's users prepare C4 with SeqIO/TFDS on Beam):
  `python -m pax_eqx.prepare_data --input 'c4/en/c4-train.*.json.gz' --output-dir prepared/c4
  --tokenizer sentencepiece --tokenizer.vocab-size 32128 --num-shards 1024`, then the validation
  files with `--tokenizer.model-path prepared/c4/tokenizer/spm.model` into prepared/c4_validation,
  and train with `--data.source array_record --data.path prepared/c4 --data.eval-path
  prepared/c4_validation` (the prepared SentencePiece model is the experiment's tokenizer; eval is
  Pax's unpacked pretokenized split; docs/data.md, "Preparing a corpus", has the Beam-runner
  commands); or
- local JSON-lines files (one document per line, its text under "text": allenai/c4's `en` files
  once gunzipped) from `--data.path` (a file, directory or glob; `--data.eval-path` for the
  validation files, otherwise every 10th document is held out), tokenized on the fly with
  SentencePiece (trained from the data into the job dir with Pax's vocabulary size, or given with
  `--data.tokenizer.model-path`, e.g. MLPerf's c4_en_301_5Mexp2_spm.model).

Either way documents are packed into MAX_SEQ_LEN rows. Without `--data.path` a run stops before
writing anything, with an error naming data.path. For synthetic rows of the same shapes (Pax's
SyntheticLmData, ids all ones): `--data.source synthetic` or `--data.synthetic true` (samples
print with the byte tokenizer, as there is no text to train SentencePiece on; the model keeps
Pax's vocabulary size).

Departures from Pax, besides the attention init of experiments/lm_cloud.py:

- Data: Pax reads the SeqIO tasks c4_lm_v301_gpt (train2, packed) and
  c4_lm_v301_gpt_eval_tokenized (5662 pre-tokenized validation sequences, not packed); here
  eval rows are packed like training rows, and the SentencePiece model is trained locally
  unless one is given.
- GPT-3 (c4_gpt3_175b and its subclasses): Pax's EarlyStoppingFn at eval log-perplexity 2.69 is
  `train.early_stopping` (metric log_pplx, target 2.69). Its attention-projection sharding
  override (['data', 'mdl', None]) is left to the mesh rules.
"""

from __future__ import annotations

import math
from typing import Literal

from experiments.lm_cloud import PaxLm, pax_names
from experiments.registry import register
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.layers.initializers import gaussian
from pax_eqx.learners import (
    ConstantSchedule,
    LearnerConfig,
    linear_rampup_cosine_decay,
    linear_rampup_exponential_decay,
    pax_adam,
)

LrSchedule = Literal["linear_rampup_exponential_decay", "linear_rampup_cosine_decay", "constant"]


def set_adam_and_learning_rate_schedule(
    *,
    global_batch_size: int,
    learning_rate: float | None = 1e-3,
    adam_beta1: float = 0.9,
    adam_beta2: float = 0.99,
    weight_decay: float = 1e-3,
    adam_epsilon: float = 1e-6,
    adam_epsilon_root: float = 0.0,
    clip_gradient_norm_to_value: float = 5.0,
    adam_clip_threshold: float = 1.0,
    lr_schedule: LrSchedule = "linear_rampup_exponential_decay",
    lr_lred_warmup: int = 4000,
    lr_lred_decay_start: int = 4001,
    lr_lred_decay_end: int = 300000,
    lr_lred_min_ratio: float = 0.1,
    lr_lred_max: float = 1.0,
    lr_cos_warmup: int | None = 4000,
    lr_cos_decay_start: int | None = 4001,
    lr_cos_decay_end: int | None = 300000,
    lr_cos_min_ratio: float = 0.1,
    lr_cos_max: float = 1.0,
) -> LearnerConfig:
    """c4.set_adam_and_learning_rate_schedule, with c4.TransformerLmSpmdAdam's constants as defaults.

    learning_rate None: 2e-5 for global batches up to 3584, else 3e-5. Cosine steps None:
    warmup ceil(265 x 1536 / batch), decay_start warmup + 1, decay_end ceil(108600 x 1536 / batch).
    """
    if global_batch_size > 8192:
        raise ValueError(f"c4: the global batch {global_batch_size} is over Pax's limit of 8192.")
    if learning_rate is None:
        learning_rate = 2e-5 if global_batch_size <= 3584 else 3e-5
    if lr_schedule == "linear_rampup_exponential_decay":
        schedule = linear_rampup_exponential_decay(
            warmup_steps=lr_lred_warmup, decay_start=lr_lred_decay_start, decay_end=lr_lred_decay_end,
            min_ratio=lr_lred_min_ratio, max=lr_lred_max,
        )  # fmt: skip
    elif lr_schedule == "linear_rampup_cosine_decay":
        warmup = lr_cos_warmup if lr_cos_warmup is not None else math.ceil(265 * 1536 / global_batch_size)
        start = lr_cos_decay_start if lr_cos_decay_start is not None else warmup + 1
        end = lr_cos_decay_end if lr_cos_decay_end is not None else math.ceil(108600 * 1536 / global_batch_size)
        schedule = linear_rampup_cosine_decay(
            warmup_steps=warmup, decay_start=start, decay_end=end, min_ratio=lr_cos_min_ratio, max=lr_cos_max
        )
    else:
        schedule = ConstantSchedule()
    return pax_adam(
        learning_rate=learning_rate,
        schedule=schedule,
        beta1=adam_beta1,
        beta2=adam_beta2,
        epsilon=adam_epsilon,
        epsilon_root=adam_epsilon_root,
        clip_threshold=adam_clip_threshold,
        weight_decay=weight_decay,
        clip_gradient_norm_to_value=clip_gradient_norm_to_value,
    )


def c4_recipe(spec: PaxLm) -> PaxLm:
    """The spec with the c4 non-GPT-3 recipe for its global batch (C4SpmdAdam.task())."""
    return spec.replace(learner=set_adam_and_learning_rate_schedule(global_batch_size=spec.global_batch_size))


# c4.TransformerLmSpmdAdam + C4UnsupervisedDataset + C4SpmdAdam (registered in Pax).
C4_SPMD_ADAM = c4_recipe(
    PaxLm(
        num_layers=24,
        model_dims=2048,
        hidden_dims=8192,
        num_heads=32,
        dims_per_head=0,
        vocab_size=32128,
        max_seq_len=1024,
        percore_batch_size=1,
        ici_mesh_shape=(1, 4, 2),
        fprop_dtype="float32",
        use_repeated_layer=False,
        checkpoint_policy="SAVE_DOT_FOR_MLPERF_200B",  # inert: the layers are not repeated
        checkpoint_every_n_steps=1000,
        data="c4",
    )
)


def _sized(layers: int, dims: int, heads: int, percore: int, ici: tuple[int, int, int]) -> PaxLm:
    """C4Spmd{1B,2B,16B,32B}: bf16, repeated layers, SAVE_NOTHING, summaries every 10 steps."""
    return c4_recipe(
        C4_SPMD_ADAM.replace(
            num_layers=layers, model_dims=dims, hidden_dims=4 * dims, num_heads=heads, dims_per_head=128,
            vocab_size=32000, percore_batch_size=percore, ici_mesh_shape=ici, fprop_dtype="bfloat16",
            use_repeated_layer=True, checkpoint_policy="SAVE_NOTHING", summary_interval_steps=10,
        )
    )  # fmt: skip


C4_SPMD_1B = _sized(13, 2560, 20, 32, (1, 4, 1))
C4_SPMD_2B = _sized(18, 3072, 24, 32, (1, 4, 1))
C4_SPMD_16B = _sized(36, 6144, 48, 16, (1, 16, 2))
C4_SPMD_32B = _sized(40, 8192, 64, 8, (1, 16, 4))

# C4SpmdGpt3AdamOrgHP (not registered in Pax) = C4SpmdAdam.task() + configure_gpt3_task().
_GPT3_SHAPE = C4_SPMD_ADAM.replace(
    max_seq_len=2048,
    num_layers=96,
    num_heads=96,
    model_dims=12288,
    hidden_dims=49152,
    dims_per_head=0,
    vocab_size=50257,
    use_repeated_layer=True,
    checkpoint_policy="SAVE_NOTHING",
    # configure_gpt3_task: Gaussian(0.006) everywhere, attention biases, no per-dim scale, no
    # logit caps, no softmax bias, learned positions (16384 rows), LayerNorm eps 1e-5.
    params_init=gaussian(0.006),
    softmax_init_std=0.006,
    attention_bias=True,
    per_dim_scale=False,
    atten_logit_cap=0.0,
    softmax_cap_logits=0.0,
    scale_embedding_sqrt_depth=False,
    softmax_bias=False,
    trainable_position_emb=True,
    trainable_pe_max_seq_len=16384,
    layernorm_epsilon=1e-5,
    eval_interval_steps=100,
    summary_interval_steps=10,
    checkpoint_every_n_steps=100,
    checkpoint_max_to_keep=10,
    target_log_pplx=2.69,  # TARGET_LOG_PPLX, configure_gpt3_task's EarlyStoppingFn
)


def gpt3_org_hp(spec: PaxLm, learning_rate: float = 6e-5) -> PaxLm:
    """C4SpmdGpt3AdamOrgHP's optimizer (set_adam_and_learning_rate_schedule with its constants)
    for the spec's global batch: Adam 0.9 / 0.95, eps 1e-8, no update cap, weight decay 0.1,
    clip 1.0, lr x LinearRampupCosineDecay(265, 266, 108600, 0.1, 1.0)."""
    return spec.replace(
        learner=set_adam_and_learning_rate_schedule(
            global_batch_size=spec.global_batch_size, learning_rate=learning_rate, weight_decay=0.1,
            adam_beta1=0.9, adam_beta2=0.95, adam_epsilon=1e-8, adam_clip_threshold=-1.0,
            clip_gradient_norm_to_value=1.0, lr_schedule="linear_rampup_cosine_decay", lr_cos_warmup=265,
            lr_cos_decay_start=266, lr_cos_decay_end=108600, lr_cos_max=1.0, lr_cos_min_ratio=0.1,
        )
    )  # fmt: skip


C4_GPT3_175B = gpt3_org_hp(_GPT3_SHAPE)
# C4SpmdGpt3AdamOrgHPBS1p5k1536Replicas: vocab padded to 51200, fp32, 1536 chips.
C4_GPT3_BS1P5K_1536 = gpt3_org_hp(
    C4_GPT3_175B.replace(
        vocab_size=51200, percore_batch_size=1, ici_mesh_shape=(1, 64, 24), fprop_dtype="float32",
        checkpoint_max_to_keep=100, eval_interval_steps=25, summary_interval_steps=1,
    )
)  # fmt: skip
# C4SpmdGpt3L16AdamOrgHP: 16 layers, bf16, per-core 3 on (1, 16, 4).
C4_GPT3_L16 = gpt3_org_hp(
    C4_GPT3_175B.replace(
        num_layers=16, fprop_dtype="bfloat16", percore_batch_size=3, eval_interval_steps=25000,
        ici_mesh_shape=(1, 16, 4),
    )
)  # fmt: skip

# c4.LmCloudSpmdAdam (TransformerLmSpmdAdam + lm_cloud.SyntheticDataset): the c4 recipe on
# synthetic data, 2 layers, 16 heads of 128 (NUM_HEADS from TransformerLmSpmdAdam, DIMS_PER_HEAD
# from the SPMD base), float32, not repeated, per-core 16 on (1, 4, 2).
LM_CLOUD_SPMD_ADAM = c4_recipe(
    PaxLm(
        num_layers=2, model_dims=2048, hidden_dims=8192, num_heads=16, dims_per_head=128, vocab_size=32000,
        max_seq_len=1024, percore_batch_size=16, ici_mesh_shape=(1, 4, 2), fprop_dtype="float32",
        use_repeated_layer=False, checkpoint_policy="SAVE_NOTHING",
    )
)  # fmt: skip


@register("c4_spmd_adam", aliases=pax_names("c4", "C4SpmdAdam"))
def c4_spmd_adam() -> ExperimentConfig:
    """1.27B C4 base: 24 layers, d 2048, 32 heads of 64, vocab 32128, float32, batch 1/device on (1, 4, 2)."""
    return C4_SPMD_ADAM.experiment("c4_spmd_adam")


@register("c4_spmd_1b_adam_4replicas", aliases=pax_names("c4", "C4Spmd1BAdam4Replicas"))
def c4_spmd_1b_adam_4replicas() -> ExperimentConfig:
    """1.1B: 13 layers, d 2560, 20 heads of 128, vocab 32000, bf16, per-core 32 on (1, 4, 1): batch 128."""
    return C4_SPMD_1B.experiment("c4_spmd_1b_adam_4replicas")


@register("c4_spmd_1b_adam_4replicas_limit_steps", aliases=pax_names("c4", "C4Spmd1BAdam4ReplicasLimitSteps"))
def c4_spmd_1b_adam_4replicas_limit_steps() -> ExperimentConfig:
    """c4_spmd_1b_adam_4replicas for 15000 steps."""
    return C4_SPMD_1B.replace(num_train_steps=15000).experiment("c4_spmd_1b_adam_4replicas_limit_steps")


@register("c4_spmd_2b", aliases=pax_names("c4", "C4Spmd2BAdam4Replicas"))
def c4_spmd_2b() -> ExperimentConfig:
    """2.1B: 18 layers, d 3072, 24 heads of 128, bf16, per-core 32 on (1, 4, 1): batch 128."""
    return C4_SPMD_2B.experiment("c4_spmd_2b")


@register("c4_spmd_16b_adam_32replicas", aliases=pax_names("c4", "C4Spmd16BAdam32Replicas"))
def c4_spmd_16b_adam_32replicas() -> ExperimentConfig:
    """16.5B: 36 layers, d 6144, 48 heads of 128, bf16, per-core 16 on (1, 16, 2): batch 512."""
    return C4_SPMD_16B.experiment("c4_spmd_16b_adam_32replicas")


@register("c4_spmd_32b", aliases=pax_names("c4", "C4Spmd32BAdam64Replicas"))
def c4_spmd_32b() -> ExperimentConfig:
    """32.5B: 40 layers, d 8192, 64 heads of 128, bf16, per-core 8 on (1, 16, 4): batch 512."""
    return C4_SPMD_32B.experiment("c4_spmd_32b")


@register("c4_gpt3_175b", aliases=pax_names("c4", "C4SpmdGpt3AdamOrgHP"))
def c4_gpt3_175b() -> ExperimentConfig:
    """GPT-3 175B with the paper's hyperparameters: 96 layers, d 12288, 96 heads, seq 2048, vocab 50257.

    Pax's `C4SpmdGpt3AdamOrgHP`, which Pax does not register: it is the base of its registered
    C4SpmdGpt3AdamOrgHPBS1p5k1536Replicas (vocab 51200, ICI (1, 64, 24)). As the base, it runs
    float32 with per-core batch 1 on ICI (1, 4, 2) (global batch 8). Optimizer: Adam 0.9/0.95,
    eps 1e-8, no update RMS cap, weight decay 0.1 on every parameter, gradient clip 1.0, lr 6e-5
    x LinearRampupCosineDecay(265, 266, 108600, min 0.1). Stops early once the eval log-perplexity
    reaches Pax's TARGET_LOG_PPLX 2.69.
    """
    return C4_GPT3_175B.experiment("c4_gpt3_175b")


@register("c4_gpt3_175b_bs1p5k_1536replicas", aliases=pax_names("c4", "C4SpmdGpt3AdamOrgHPBS1p5k1536Replicas"))
def c4_gpt3_175b_bs1p5k_1536replicas() -> ExperimentConfig:
    """GPT-3 175B, Pax's registered OrgHP run: vocab padded to 51200, float32, per-core 1 on ICI (1, 64, 24):
    batch 1536; evals every 25 steps, summaries every step, keeps 100 checkpoints (every 100 steps)."""
    return C4_GPT3_BS1P5K_1536.experiment("c4_gpt3_175b_bs1p5k_1536replicas")


@register("c4_gpt3_l16", aliases=pax_names("c4", "C4SpmdGpt3L16AdamOrgHP"))
def c4_gpt3_l16() -> ExperimentConfig:
    """GPT-3 175B's layer with 16 layers (29.8B), bf16, per-core 3 on ICI (1, 16, 4): batch 192; evals
    every 25000 steps."""
    return C4_GPT3_L16.experiment("c4_gpt3_l16")


@register("lm_cloud_spmd_adam", aliases=pax_names("c4", "LmCloudSpmdAdam"))
def lm_cloud_spmd_adam() -> ExperimentConfig:
    """c4's recipe (lr 1e-3) on synthetic data: 2 layers, d 2048, 16 heads of 128, float32, per-core 16 on
    (1, 4, 2): batch 128."""
    return LM_CLOUD_SPMD_ADAM.experiment("lm_cloud_spmd_adam")


@register("lm_cloud_spmd_adam_limit_steps", aliases=pax_names("c4", "LmCloudSpmdAdamLimitSteps"))
def lm_cloud_spmd_adam_limit_steps() -> ExperimentConfig:
    """lm_cloud_spmd_adam for 4000 steps."""
    return LM_CLOUD_SPMD_ADAM.replace(num_train_steps=4000).experiment("lm_cloud_spmd_adam_limit_steps")
