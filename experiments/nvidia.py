"""NVIDIA's Pax experiments (paxml/tasks/lm/params/nvidia.py), with Paxml 1.4.0's numbers.

The configs NVIDIA's Rosetta Pax publishes for GPUs: GPT-style models from 1.3B to 175B (SPMD,
pipelined, FSDP) and Llama 2. Every number is Paxml 1.4.0's (the PyPI wheel), resolved through
the class MRO and each `task()` (docs/pax_experiment_numbers.md section 8). Each class is a
`PaxLm` value (experiments/lm_cloud.py); a subclass is `.replace(...)`. MoELarge, NVIDIA's MoE
class, is registered in experiments/moe.py (as `moe_large`) from NVIDIA_1_3B here.

Two bases, both on lm_cloud's SyntheticDataset (every id 1):

- NVIDIA1_3B (c4.TransformerLmSpmdAdam): repeated layers with full remat (SAVE_NOTHING), the SPMD
  architecture of lm_cloud (GELU, fused QKV without bias, per-dim query scale, logit caps 50 and
  30, tied embedding x sqrt(d) with a softmax bias, LayerNorm eps 1e-6), learned positions
  (TRAINABLE_PE_MAX_SEQ_LEN = MAX_SEQ_LEN = 2048, fixed when the class is defined: the Llama
  classes' 4096 does not reach it), seq 2048, vocab 51200, bf16, projections Gaussian(0.023).
- NVIDIA5B (c4.TransformerLmSpmdPipelineAdam): the same, pipelined over a 4-D [stage, replica,
  data, mdl] mesh (our (stage, data, fsdp, tensor)), each stage a list of layers rematerialised
  per iteration with SAVE_NOTHING (PipelinedTransformer's checkpoint_policy).

Their `task()` sets, for every class here:

- the optimizer, replacing c4's: Praxis Adam b1 0.9, b2 0.95, eps 1e-8, eps_root 0, update RMS
  cap 1.0 (CLIP_THRESHOLD), weight decay 1e-3 (WEIGHT_DECAY, from TransformerLmSpmdAdafactor) on
  every parameter, gradient clip 1.0, lr 6e-4 x LinearRampupCosineDecay(0, 1, 500000, 0.1, 1.0).
  With USE_ADAFACTOR (NVIDIA175B, Llama33BProxy, NVIDIA175B_FSDP): ShardedAdafactor
  (decay_method 'adam', beta1 0.9, decay_adam 0.99, update clipping 1.0, last-two-dims
  factoring, no parameter scale, its default int8 momentum), the same weight decay, clip, lr
  and schedule;
- `train.save_interval_steps = 100000`: checkpoints every 100000 steps (the source's comment says
  "disable summary writes"; it is the checkpoint interval);
- `summary_verbosity = 0` (NVIDIA1_3B's descendants): no layer summaries, pax_eqx's default.

Pax settings with no effect, not reproduced: `softmax_init` (SOFTMAX_INIT_STD 0.023) is computed
in `task()` and never assigned, so the tied embedding keeps TransformerLmSpmdAdafactor's
Gaussian(1/sqrt(MODEL_DIMS)); ENABLE_BFLOAT16 is read by no LM base (FPROP_DTYPE is bf16 anyway);
USE_FLASH_ATTENTION / USE_TRITON_LAYER_NORM are False in every class (our attention picks cuDNN
or XLA itself: the same function). No class of Paxml 1.4.0's nvidia.py sets USE_FP8.

Llama2_7B / 13B / 70B (`Llama2_7B.task()`): SwiGLU (Praxis Swish, gated) with MLP biases,
GroupedQueryAttention with NUM_KV_HEADS key/value heads, rotary embeddings (timescales 1 to
10000) and no position table, RmsNorm (eps 1e-6, scale only, float32 intermediates) before
attention, before the MLP and at the end. GroupedQueryAttention is a fresh template, so it has
Praxis' own defaults, not the SPMD base's: **biases on q, k, v and the output projection**
(use_bias=True), no logit cap, no per-dim scale (1/sqrt(head_dim)), separate q/k/v weights. The
tied embedding, its sqrt(d) scale, its softmax bias and the output cap 30 are the base's.
`eval_skip_train = True` is what pax_eqx does anyway (it never evaluates on training batches).
Llama33BProxy is the Llama-33B *shape* on NVIDIA1_3B's GPT architecture (no Llama task).

Per-core batches below 1 (NVIDIA10B 0.25, NVIDIA175B 0.0625) give global batches of 4 and 6
on the declared meshes. Paxml 1.4.0's SyntheticDataset rounds the per-host batch,
round(PERCORE_BATCH_SIZE x local devices): whole on the 16-GPU hosts NVIDIA's docstrings name,
0 for NVIDIA175B on 8-GPU hosts (fixed after 1.4.0 with num_infeed_hosts).

Departures, besides those of experiments/lm_cloud.py: Pax's sharding annotations (GQA's dnh
weight split, the pipeline's embedding split) are left to pax_eqx's mesh rules; Adafactor keeps
its momentum in float32 (Praxis: int8) and averages the updates before the learning rate
(design.md, "Praxis conventions").
"""

from __future__ import annotations

from experiments.lm_cloud import PaxLm, pax_names
from experiments.registry import register
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.layers.initializers import gaussian
from pax_eqx.learners import AdafactorConfig, LearnerConfig, linear_rampup_cosine_decay, pax_adam

NVIDIA_SCHEDULE = linear_rampup_cosine_decay(warmup_steps=0, decay_start=1, decay_end=500_000, min_ratio=0.1, max=1.0)

# NVIDIA1_3B.task(), USE_ADAFACTOR False: Praxis Adam with the class's constants.
NVIDIA_ADAM = pax_adam(
    learning_rate=6e-4,
    schedule=NVIDIA_SCHEDULE,
    beta1=0.9,
    beta2=0.95,
    epsilon=1e-8,
    epsilon_root=0.0,
    clip_threshold=1.0,
    weight_decay=1e-3,
    clip_gradient_norm_to_value=1.0,
)

# USE_ADAFACTOR True: ShardedAdafactor(decay_method='adam', beta1=ADAM_BETA1, decay_adam=0.99,
# weight_decay=WEIGHT_DECAY, clip_gradient_norm_to_value=1.0), lr and schedule as Adam's.
NVIDIA_ADAFACTOR = LearnerConfig(
    optimizer=AdafactorConfig(
        decay_method="adam",
        decay_rate=0.99,
        beta1=0.9,
        multiply_by_parameter_scale=False,
        factored_dims="last",
        momentum_dtype="int8",
    ),
    learning_rate=6e-4,
    schedule=NVIDIA_SCHEDULE,
    weight_decay=1e-3,
    weight_decay_mask="all",
    clip_grad_norm=1.0,
    skip_nonfinite=True,
)

NVIDIA_1_3B = PaxLm(
    device_kind="h100",  # NVIDIA's Rosetta Pax publishes these configs' H100 results
    num_layers=24,
    model_dims=2048,
    hidden_dims=8192,
    num_heads=32,
    dims_per_head=64,
    vocab_size=51200,
    max_seq_len=2048,
    percore_batch_size=4,
    ici_mesh_shape=(16, 1, 1),
    dcn_mesh_shape=(1, 1, 1),
    fprop_dtype="bfloat16",
    use_repeated_layer=True,
    checkpoint_policy="SAVE_NOTHING",
    activation="gelu",
    trainable_position_emb=True,
    trainable_pe_max_seq_len=2048,
    params_init=gaussian(0.023),
    softmax_init_std=0.0,  # 1/sqrt(MODEL_DIMS): SOFTMAX_INIT_STD's init is never assigned
    learner=NVIDIA_ADAM,
    checkpoint_every_n_steps=100_000,
)

NVIDIA_5B = NVIDIA_1_3B.replace(
    num_layers=24, num_heads=32, dims_per_head=128, model_dims=4096, hidden_dims=16384, percore_batch_size=1,
    ici_mesh_shape=(4, 2, 1, 2), dcn_mesh_shape=(1, 1, 1, 1), num_stages=4, microbatch_size=2,
    use_repeated_layer=False,
)  # fmt: skip

NVIDIA_8_3B = NVIDIA_1_3B.replace(
    ici_mesh_shape=(4, 1, 4), percore_batch_size=4, num_layers=40, num_heads=64, dims_per_head=64, model_dims=4096,
    hidden_dims=4 * 4096,
)  # fmt: skip
NVIDIA_10B = NVIDIA_1_3B.replace(
    ici_mesh_shape=(2, 1, 8), percore_batch_size=0.25, num_layers=32, num_heads=40, dims_per_head=128,
    model_dims=5120, hidden_dims=4 * 5120,
)  # fmt: skip
NVIDIA_40B_PROXY = NVIDIA_5B.replace(
    ici_mesh_shape=(2, 2, 1, 4), num_stages=2, microbatch_size=4, percore_batch_size=16, num_layers=12, num_heads=64,
    dims_per_head=128, model_dims=8192, hidden_dims=4 * 8192,
)  # fmt: skip
NVIDIA_70B_PROXY = NVIDIA_40B_PROXY.replace(percore_batch_size=8, num_layers=20)
NVIDIA_116B_PROXY = NVIDIA_5B.replace(
    ici_mesh_shape=(4, 1, 1, 4), num_stages=4, microbatch_size=2, percore_batch_size=6, num_layers=16, num_heads=96,
    dims_per_head=128, model_dims=12288, hidden_dims=4 * 12288,
)  # fmt: skip
NVIDIA_175B_PROXY = NVIDIA_116B_PROXY.replace(microbatch_size=1, num_layers=24)
NVIDIA_175B = NVIDIA_175B_PROXY.replace(
    dcn_mesh_shape=(6, 1, 1, 1), ici_mesh_shape=(1, 1, 1, 16), num_layers=96, num_stages=6, microbatch_size=1,
    percore_batch_size=0.0625, learner=NVIDIA_ADAFACTOR,
)  # fmt: skip
TEST_SMALL_CONFIG = NVIDIA_5B.replace(
    ici_mesh_shape=(2, 2, 1, 4), num_stages=2, microbatch_size=2, percore_batch_size=2, num_layers=16, num_heads=32,
    dims_per_head=128, model_dims=4096, hidden_dims=4 * 4096,
)  # fmt: skip
LLAMA_33B_PROXY = NVIDIA_1_3B.replace(
    ici_mesh_shape=(1, 16, 1), percore_batch_size=1, num_layers=60, vocab_size=32000, dims_per_head=128,
    num_heads=52, model_dims=6656, hidden_dims=17920, learner=NVIDIA_ADAFACTOR,
)  # fmt: skip
NVIDIA_175B_FSDP = NVIDIA_1_3B.replace(
    ici_mesh_shape=(1, 16, 1), dcn_mesh_shape=(1, 8, 1), percore_batch_size=1, learner=NVIDIA_ADAFACTOR,
    num_layers=96, num_heads=96, dims_per_head=128, model_dims=12288, hidden_dims=4 * 12288,
)  # fmt: skip

# Llama2_7B: its constants, then its task(): SwiGLU, GroupedQueryAttention (Praxis' defaults:
# biases, no caps, no per-dim scale, separate q/k/v) with rotary positions, RmsNorm everywhere.
LLAMA2_7B = NVIDIA_1_3B.replace(
    num_layers=32, model_dims=4096, hidden_dims=11008, num_heads=32, dims_per_head=128, max_seq_len=4096,
    percore_batch_size=1, dcn_mesh_shape=(1, 1, 1), ici_mesh_shape=(1, 16, 1), num_kv_heads=32,
    activation="swish", use_gated_activation=True, norm="rms_norm", trainable_position_emb=False,
    rotary_position_emb=True, combine_qkv=False, attention_bias=True, per_dim_scale=False, atten_logit_cap=0.0,
)  # fmt: skip
LLAMA2_13B = LLAMA2_7B.replace(num_layers=40, model_dims=5120, hidden_dims=13824, num_heads=40, num_kv_heads=40)
LLAMA2_70B = LLAMA2_7B.replace(
    num_layers=80, model_dims=8192, hidden_dims=28672, num_heads=64, num_kv_heads=8, dcn_mesh_shape=(1, 4, 1)
)


def _register(name: str, cls: str, spec: PaxLm, doc: str) -> None:
    def build() -> ExperimentConfig:
        return spec.experiment(name)

    build.__name__ = name
    build.__doc__ = doc
    register(name, aliases=pax_names("nvidia", cls))(build)


for _name, _cls, _spec, _doc in [
    ("nvidia_1_3b", "NVIDIA1_3B", NVIDIA_1_3B,
     "1.3B GPT: 24 layers, d 2048, 32 heads of 64, seq 2048, vocab 51200, per-core 4 on (16, 1, 1): batch 64."),
    ("nvidia_5b", "NVIDIA5B", NVIDIA_5B,
     "5B GPT pipelined: 24 layers in 4 stages, d 4096, 32x128, batch 16 on (4, 2, 1, 2), 8 microbatches of 2."),
    ("nvidia_8_3b", "NVIDIA8_3B", NVIDIA_8_3B,
     "8.3B GPT: 40 layers, d 4096, 64 heads of 64, per-core 4 on (4, 1, 4): batch 64."),
    ("nvidia_10b", "NVIDIA10B", NVIDIA_10B,
     "10B GPT: 32 layers, d 5120, 40x128, per-core 0.25 on (2, 1, 8): batch 4."),
    ("nvidia_40b_proxy", "NVIDIA40BProxy", NVIDIA_40B_PROXY,
     "40B's layer shape, 12 layers in 2 stages, d 8192, 64x128, batch 256 on (2, 2, 1, 4), 64 microbatches of 4."),
    ("nvidia_70b_proxy", "NVIDIA70BProxy", NVIDIA_70B_PROXY,
     "70B's layer shape, 20 layers in 2 stages, d 8192, 64x128, batch 128 on (2, 2, 1, 4), 32 microbatches of 4."),
    ("nvidia_116b_proxy", "NVIDIA116BProxy", NVIDIA_116B_PROXY,
     "116B's layer shape, 16 layers in 4 stages, d 12288, 96x128, batch 96 on (4, 1, 1, 4), 48 microbatches of 2."),
    ("nvidia_175b_proxy", "NVIDIA175BProxy", NVIDIA_175B_PROXY,
     "175B's layer shape, 24 layers in 4 stages, d 12288, 96x128, batch 96 on (4, 1, 1, 4), 96 microbatches of 1."),
    ("nvidia_175b", "NVIDIA175B", NVIDIA_175B,
     "GPT-3 175B: 96 layers in 6 stages (DCN), d 12288, 96x128, tensor 16, batch 6 in 6 microbatches; Adafactor."),
    ("nvidia_test_small_config", "TestSmallConfig", TEST_SMALL_CONFIG,
     "NVIDIA's test config: 16 layers in 2 stages, d 4096, 32x128, batch 32 on (2, 2, 1, 4), 16 microbatches of 2."),
    ("llama_33b_proxy", "Llama33BProxy", LLAMA_33B_PROXY,
     "Llama-33B's shape (60 layers, d 6656, 52x128, MLP 17920, vocab 32000) on NVIDIA1_3B's GPT blocks; "
     "batch 16 on (1, 16, 1); Adafactor."),
    ("nvidia_175b_fsdp", "NVIDIA175B_FSDP", NVIDIA_175B_FSDP,
     "GPT-3 175B fully sharded: 96 layers, d 12288, 96x128, batch 128 on (1, 16, 1) x (1, 8, 1); Adafactor."),
    ("llama2_7b", "Llama2_7B", LLAMA2_7B,
     "Llama 2 7B: 32 layers, d 4096, 32x128, SwiGLU 11008, rotary, RmsNorm, seq 4096, vocab 51200, batch 16."),
    ("llama2_13b", "Llama2_13B", LLAMA2_13B,
     "Llama 2 13B: 40 layers, d 5120, 40x128, SwiGLU 13824, rotary, RmsNorm, seq 4096, batch 16 on (1, 16, 1)."),
    ("llama2_70b", "Llama2_70B", LLAMA2_70B,
     "Llama 2 70B: 80 layers, d 8192, 64 query heads and 8 key/value heads of 128, SwiGLU 28672, seq 4096, "
     "batch 64 on (1, 16, 1) x (1, 4, 1)."),
]:  # fmt: skip
    _register(_name, _cls, _spec, _doc)
