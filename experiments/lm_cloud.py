"""Pax's lm_cloud experiments (paxml/tasks/lm/params/lm_cloud.py) on synthetic data, with Pax's numbers.

Every number comes from docs/pax_experiment_numbers.md (Pax's source resolved through the class
MRO and each `task()`). This module also holds `PaxLm`, the Pax TransformerLm experiment
constants as one config (one field per class constant: NUM_LAYERS, MODEL_DIMS, ...), and
`PaxLm.experiment()`, which turns them into an ExperimentConfig; experiments/c4.py uses it too.
A Pax subclass that changes a few constants is `BASE.replace(...)` here.

Every class lm_cloud.py registers is here: the SPMD series, the pipelined ones
(LmCloudSpmdPipeline9B / 175B / Multislice2B(Circular): PaxLm with NUM_STAGES), the multislice
2B and the data-parallel LmCloudTransformerAdam series; and LargeMlp / SmallMlp, which are not
language models but Praxis' ClassificationMLPModel on the same synthetic tokens: `TokenMlpConfig`
at the end of this module, a model family of its own (pax_eqx has no token MLP), whose loss is
Pax's, the accuracy (docs/pax_experiment_numbers.md section 10).

How Pax's settings map to pax_eqx:

- mesh: Pax's `[replica, data, mdl]` axes are our `(data, fsdp, tensor)`: Pax's "data" axis
  shards weights as well as the batch (its SPMD rules are FSDP-style), which is our `fsdp`;
  `replica` only splits the batch (our `data`); `mdl` is tensor parallelism (our `tensor`).
- batch: Pax's PERCORE_BATCH_SIZE is per device; our `data.train.batch_size` is per host
  (process), so the experiments set it to the global batch, PERCORE_BATCH_SIZE x prod(ICI) x
  prod(DCN): right for one process driving every device (and for the dry run). With H hosts,
  pass `--data.train.batch-size <global / H>` (and the same for `data.eval`).
- CHECKPOINT_POLICY with USE_REPEATED_LAYER: SAVE_NOTHING is remat "full"
  (jax.checkpoint_policies.nothing_saveable), SAVE_CONTEXT_AND_OUT_PROJ (lm_cloud_spmd_32b /
  64b) is "save_context_and_out_proj", SAVE_DOT_FOR_MLPERF_200B "save_qkv_context_and_out_proj"
  (the same activation names as Praxis), SAVE_DOT_WITH_NO_BATCH_DIM (optimal_scaling)
  "dots_with_no_batch_dims_saveable" (jax's checkpoint_dots_with_no_batch_dims); without repeated
  layers Pax applies no remat.

Praxis' numerics at padded positions are Pax's here: the LM folds padding into the segment mask
(`block.attention.mask_mode="praxis"`: a padded token attends to the earlier padded tokens) and
the feed-forward zeroes padded positions (`block.ff_paddings`), so every position, padded ones
included, computes what Pax computes; LayerNorm's `1 + scale` is Praxis' default form. None of
this adds or reshapes a parameter.

Departures from Pax (nearest equivalent chosen; listed in docs/experiments.md too):

- Init: Praxis' default Xavier(1.000001) everywhere, but on the per-head attention weights
  [d, heads, head_dim] Praxis counts d as a receptive field, limit sqrt(6 / (d x (heads +
  head_dim))) (3d for the fused QKV weight), where pax_eqx uses fan-in d and fan-out heads x
  head_dim, limit sqrt(6 / (d + heads x head_dim)): attention weights start larger than Pax's
  (8.5x for d 2048, 16 x 128). MLP weights match.
- Praxis' `lookup_style`, `repeat_prefix_sep` and its sharding annotations have no
  counterpart: the mesh rules of docs/sharding.md shard the same axes.
- A skipped (non-finite) step still advances our learning-rate schedule; Pax's stands still.
"""

from __future__ import annotations

import math
from typing import Literal

from experiments.registry import register
from pax_eqx.checkpoint import CheckpointConfig
from pax_eqx.config import Config, ConfigError, config
from pax_eqx.data import DataConfig, InputConfig, JsonlSource, SentencePieceConfig, SyntheticSource
from pax_eqx.experiment import EarlyStoppingConfig, ExperimentConfig, TrainConfig
from pax_eqx.layers import (
    ActivationConfig,
    AttentionConfig,
    LayerNormConfig,
    RmsNormConfig,
    TransformerConfig,
)
from pax_eqx.layers.initializers import WeightInit, gaussian, xavier
from pax_eqx.layers.pipeline import PipelineConfig
from pax_eqx.learners import LearnerConfig, linear_rampup_exponential_decay, pax_adam
from pax_eqx.models import LanguageModelConfig
from pax_eqx.models.token_mlp import TokenMlpConfig
from pax_eqx.sharding.device_kinds import DeviceKindName
from pax_eqx.sharding.mesh import MeshConfig

CheckpointPolicy = Literal[
    "SAVE_NOTHING", "SAVE_CONTEXT_AND_OUT_PROJ", "SAVE_DOT_FOR_MLPERF_200B", "SAVE_DOT_WITH_NO_BATCH_DIM"
]  # fmt: skip
Data = Literal["synthetic", "c4"]

# Pax's CHECKPOINT_POLICY -> our remat policy, when the layers are repeated (see module doc).
_REMAT = {
    "SAVE_NOTHING": "full",
    "SAVE_CONTEXT_AND_OUT_PROJ": "save_context_and_out_proj",
    "SAVE_DOT_FOR_MLPERF_200B": "save_qkv_context_and_out_proj",
    "SAVE_DOT_WITH_NO_BATCH_DIM": "dots_with_no_batch_dims_saveable",
}
# Praxis' default WeightInit.Xavier(1.000001) for every projection.
PRAXIS_DEFAULT_INIT = xavier(1.000001)
NUM_TRAIN_STEPS = 10_000_000  # tasks_lib.SingleTask.Train.num_train_steps default (1e7)


def set_default_adam(learning_rate: float, weight_decay: float, *, decay_end: int = 300_000) -> LearnerConfig:
    """model_params.set_default_adam: Praxis Adam(0.9, 0.99, eps 1e-6, RMS cap 1.0), wd on every
    parameter, grad clip 5.0, lr x LinearRampupExponentialDecay(4000, 4001, decay_end, 0.1, 1.0)."""
    return pax_adam(
        learning_rate=learning_rate,
        schedule=linear_rampup_exponential_decay(
            warmup_steps=4000, decay_start=4001, decay_end=decay_end, min_ratio=0.1, max=1.0
        ),
        beta1=0.9,
        beta2=0.99,
        epsilon=1e-6,
        epsilon_root=0.0,
        clip_threshold=1.0,
        weight_decay=weight_decay,
        clip_gradient_norm_to_value=5.0,
    )


@config
class PaxLm(Config):
    """A Pax TransformerLm experiment, one field per Pax class constant (model_params.py).

    num_heads / dims_per_head: Pax's NUM_HEADS / DIMS_PER_HEAD, 0 for Pax's None: heads =
      model_dims // dims_per_head when num_heads is 0, else head dim = model_dims // num_heads.
    percore_batch_size: per device; the global batch is it x prod(ici) x prod(dcn), which must
      come out whole (below 1, e.g. NVIDIA10B's 0.25, devices share a row).
    ici_mesh_shape / dcn_mesh_shape: Pax's [replica, data, mdl] = our (data, fsdp, tensor); a
      pipelined experiment's [stage, replica, data, mdl] = our (stage, data, fsdp, tensor).
    use_repeated_layer / checkpoint_policy: scan over layers with that remat policy.
    num_stages / num_microbatches / microbatch_size / circular_repeat: Pax's pipeline constants
      (NUM_STAGES > 1 pipelines the layers; one of NUM_MICROBATCHES / MICROBATCH_SIZE, 0 for
      None). Pipelined, CHECKPOINT_POLICY remats each stage's iteration (Pax's
      PipelinedTransformer) and the layers are stacked whatever USE_REPEATED_LAYER says: a
      stage is a slice of the [num_layers, ...] weights, which computes what Pax's per-stage
      StackedTransformer does.
    activation / use_gated_activation: "gelu" (Praxis GELU, tanh approximation), "relu" or
      "swish" (Praxis Swish, x sigmoid(x)); gated: act(x W_gate) * (x W) (Pax's
      USE_GATED_ACTIVATION; Llama's SwiGLU is swish, gated).
    norm: every norm's kind: "layer_norm" (Praxis LayerNorm, scale and bias) or "rms_norm"
      (Praxis RmsNorm, scale only, computed in float32: what NVIDIA's Llama task sets).
    num_kv_heads: key/value heads of grouped-query attention (Pax's NUM_KV_HEADS; 0 = one per
      query head).
    combine_qkv / attention_bias / per_dim_scale / atten_logit_cap: the attention layer
      (atten_logit_cap 0 = Pax's -1.0, off).
    softmax_cap_logits: tanh cap on the output logits (0 = off).
    scale_embedding_sqrt_depth / softmax_bias: the tied embedding times sqrt(model_dims) on
      lookup (Pax's `softmax_tpl.scale_sqrt_depth = True`) and the softmax's `[vocab]` bias
      (Praxis' SharedEmbeddingSoftmax has one); GPT-3 turns both off.
    trainable_position_emb / trainable_pe_max_seq_len: a learned position table of that many
      rows (Pax's TrainablePositionalEmbedding), else Pax's sinusoidal PositionalEmbedding.
    rotary_position_emb: no position table; rotary embeddings on the queries and keys, timescales
      1 to 10000 (NVIDIA's Llama task: `position_emb_tpl = None` and GroupedQueryAttention's
      `rope_min_max_timescales = [1, 10000]`).
    layernorm_epsilon: every norm's epsilon.
    params_init / softmax_init_std: projections' init; the tied embedding's Gaussian std
      (0 = 1/sqrt(model_dims), Pax's WeightInit.Gaussian(1/sqrt(MODEL_DIMS))).
    learner: the optimizer and schedule (set_default_adam, c4's set_adam_and_learning_rate_schedule).
    num_train_steps / checkpoint_every_n_steps / checkpoint_max_to_keep / summary_interval_steps /
      eval_interval_steps: Pax's train settings.
    data: "synthetic" (lm_cloud's SyntheticDataset) or "c4" (C4UnsupervisedDataset, local files).
    training_seed: the c4 training input's seed (Pax's TRAINING_SEED).
    target_log_pplx: Pax's TARGET_LOG_PPLX, which configure_gpt3_task's EarlyStoppingFn reads:
      stop once the eval log-perplexity reaches it (train.early_stopping; 0 = no early stopping).
    """

    num_layers: int
    model_dims: int
    hidden_dims: int
    num_heads: int = 0
    dims_per_head: int = 128
    vocab_size: int = 32000
    max_seq_len: int = 1024
    percore_batch_size: float = 16
    ici_mesh_shape: tuple[int, ...] = (1, 1, 1)
    dcn_mesh_shape: tuple[int, ...] = (1, 1, 1)
    device_kind: DeviceKindName = "tpu_v4"  # what the mesh was written for: Pax's TPU v4 pods unless said
    num_stages: int = 1
    num_microbatches: int = 0
    microbatch_size: int = 0
    circular_repeat: int = 1
    fprop_dtype: Literal["float32", "bfloat16"] = "bfloat16"
    use_repeated_layer: bool = True
    checkpoint_policy: CheckpointPolicy = "SAVE_NOTHING"
    activation: Literal["gelu", "relu", "swish"] = "gelu"
    use_gated_activation: bool = False
    norm: Literal["layer_norm", "rms_norm"] = "layer_norm"
    num_kv_heads: int = 0
    combine_qkv: bool = True
    attention_bias: bool = False
    per_dim_scale: bool = True
    atten_logit_cap: float = 50.0
    softmax_cap_logits: float = 30.0
    scale_embedding_sqrt_depth: bool = True
    softmax_bias: bool = True
    trainable_position_emb: bool = False
    trainable_pe_max_seq_len: int = 16384
    rotary_position_emb: bool = False
    layernorm_epsilon: float = 1e-6
    params_init: WeightInit = PRAXIS_DEFAULT_INIT
    softmax_init_std: float = 0.0
    learner: LearnerConfig = set_default_adam(2.5e-4, 1e-3)
    num_train_steps: int = NUM_TRAIN_STEPS
    checkpoint_every_n_steps: int = 5000
    checkpoint_max_to_keep: int = 10
    summary_interval_steps: int = 100
    eval_interval_steps: int = 100
    data: Data = "synthetic"
    training_seed: int = 9876
    target_log_pplx: float = 0.0

    @property
    def heads(self) -> int:
        """TransformerLmSpmdAdafactor.task(): MODEL_DIMS // DIMS_PER_HEAD when NUM_HEADS is None."""
        return self.num_heads or self.model_dims // self.dims_per_head

    @property
    def head_dim(self) -> int:
        return self.dims_per_head or self.model_dims // self.num_heads

    @property
    def num_devices(self) -> int:
        return math.prod(self.ici_mesh_shape) * math.prod(self.dcn_mesh_shape)

    @property
    def global_batch_size(self) -> int:
        return round(self.percore_batch_size * self.num_devices)

    def check(self) -> None:
        """Pax's own assertion: MODEL_DIMS == NUM_HEADS x DIMS_PER_HEAD when both are set."""
        if self.num_heads and self.dims_per_head and self.model_dims != self.num_heads * self.dims_per_head:
            raise ConfigError(
                f"PaxLm: model_dims={self.model_dims} != num_heads={self.num_heads} x dims_per_head="
                f"{self.dims_per_head}; set dims_per_head=0 (Pax's None) or matching sizes."
            )
        if not (self.num_heads or self.dims_per_head):
            raise ConfigError("PaxLm: set num_heads or dims_per_head (Pax needs one of them).")
        batch = self.percore_batch_size * self.num_devices
        if batch < 1 or abs(batch - round(batch)) > 1e-6:
            raise ConfigError(
                f"PaxLm: percore_batch_size={self.percore_batch_size} x {self.num_devices} devices = {batch:g} rows, "
                "not a whole global batch."
            )
        if self.rotary_position_emb and self.trainable_position_emb:
            raise ConfigError("PaxLm: rotary_position_emb has no position table; set trainable_position_emb=False.")
        if self.num_stages > 1:
            # TransformerLmSpmdPipelineAdafactor.task()'s assertions.
            mesh_stages = self.ici_mesh_shape[0] * self.dcn_mesh_shape[0]
            if len(self.ici_mesh_shape) != 4 or len(self.dcn_mesh_shape) != 4 or mesh_stages != self.num_stages:
                raise ConfigError(
                    f"PaxLm: num_stages={self.num_stages} needs 4-entry [stage, replica, data, mdl] meshes whose "
                    f"stage sizes multiply to it, got ICI {self.ici_mesh_shape} x DCN {self.dcn_mesh_shape}."
                )
            if bool(self.num_microbatches) == bool(self.microbatch_size):
                raise ConfigError(
                    f"PaxLm: set exactly one of num_microbatches={self.num_microbatches} and microbatch_size="
                    f"{self.microbatch_size} (0 = Pax's None) for a pipelined experiment."
                )

    @property
    def pipeline(self) -> PipelineConfig:
        """The pipeline of NUM_STAGES, NUM_MICROBATCHES (or global batch / MICROBATCH_SIZE), CIRCULAR_REPEAT."""
        if self.num_stages == 1:
            return PipelineConfig()
        microbatches = self.num_microbatches or self.global_batch_size // self.microbatch_size
        return PipelineConfig(
            num_stages=self.num_stages,
            num_microbatches=microbatches,
            circular_repeat=self.circular_repeat,
            remat_stage=True,
        )

    def model(self) -> LanguageModelConfig:
        self.check()
        if self.norm == "rms_norm":
            norm = RmsNormConfig(epsilon=self.layernorm_epsilon)
        else:
            norm = LayerNormConfig(epsilon=self.layernorm_epsilon, use_scale=True, use_bias=True)
        block = TransformerConfig(
            norm_policy="pre",
            norm=norm,
            attention=AttentionConfig(
                combine_qkv=self.combine_qkv,
                use_bias=self.attention_bias,
                per_dim_scale=self.per_dim_scale,
                logit_cap=self.atten_logit_cap,
                mask_mode="praxis",  # TransformerLm: padding folded into the segment mask
            ),
            activation=ActivationConfig(name=self.activation, gated=self.use_gated_activation),
            ff_has_bias=True,
            ff_paddings=True,  # TransformerFeedForward zeroes padded positions
        )
        trainable = self.trainable_position_emb
        position = "rotary" if self.rotary_position_emb else "trainable" if trainable else "sinusoidal"
        return LanguageModelConfig(
            vocab_size=self.vocab_size,
            # A trainable table has Pax's TRAINABLE_PE_MAX_SEQ_LEN rows (sequences stay MAX_SEQ_LEN).
            max_seq_len=self.trainable_pe_max_seq_len if trainable else self.max_seq_len,
            num_layers=self.num_layers,
            model_dims=self.model_dims,
            hidden_dims=self.hidden_dims,
            num_heads=self.heads,
            dim_per_head=self.head_dim,
            num_kv_heads=self.num_kv_heads,
            position_embedding=position,
            separate_embedding=False,
            repeat=self.use_repeated_layer or self.num_stages > 1,
            remat_policy=_REMAT[self.checkpoint_policy] if self.use_repeated_layer or self.num_stages > 1 else "none",
            pipeline=self.pipeline,
            block=block,
            final_norm=norm,
            soft_cap_logits=self.softmax_cap_logits,
            scale_embedding_sqrt_depth=self.scale_embedding_sqrt_depth,
            softmax_bias=self.softmax_bias,
            init=self.params_init,
            embedding_init=gaussian(self.softmax_init_std or 1.0 / math.sqrt(self.model_dims)),
        )

    def data_config(self) -> DataConfig:
        batch = self.global_batch_size
        if self.data == "synthetic":
            # SyntheticDataset: SyntheticLmData rows of ones, the same for train and eval; Pax's
            # BaseInput eval defaults (reset_for_eval False, eval_loop_num_batches 1).
            return DataConfig(
                source=SyntheticSource(num_synthetic_examples=batch),
                seq_len=self.max_seq_len,
                train=InputConfig(batch_size=batch, shuffle=False),
                eval=InputConfig(
                    batch_size=batch, shuffle=False, repeat=True, reset_for_eval=False, eval_loop_num_batches=1
                ),
            )
        # C4UnsupervisedDataset: documents packed into MAX_SEQ_LEN rows, SentencePiece tokens,
        # shuffled and repeated for training (TRAINING_SEED); eval = one full pass (seed 4321).
        return DataConfig(
            source=JsonlSource(path="", jsonl_text_key="text", layout="packed"),
            seq_len=self.max_seq_len,
            tokenizer=SentencePieceConfig(vocab_size=self.vocab_size),
            train=InputConfig(batch_size=batch, input_random_seed=self.training_seed, shuffle=True, repeat=True),
            eval=InputConfig(
                batch_size=batch,
                input_random_seed=4321,
                shuffle=False,
                repeat=False,
                reset_for_eval=True,
                eval_loop_num_batches=0,
                metrics=("bits_per_byte",),
            ),
        )

    def experiment(self, name: str) -> ExperimentConfig:
        return ExperimentConfig(
            name=name,
            model=self.model(),
            learner=self.learner,
            data=self.data_config(),
            train=TrainConfig(
                num_steps=self.num_train_steps,
                eval_interval_steps=self.eval_interval_steps,
                summary_interval_steps=self.summary_interval_steps,
                fprop_dtype=self.fprop_dtype,
                sample_at_end=False,
                early_stopping=(
                    EarlyStoppingConfig(metric="log_pplx", target=self.target_log_pplx)
                    if self.target_log_pplx
                    else EarlyStoppingConfig()
                ),
            ),
            checkpoint=CheckpointConfig(
                every_n_steps=self.checkpoint_every_n_steps, max_to_keep=self.checkpoint_max_to_keep
            ),
            mesh=MeshConfig(
                ici_mesh_shape=self.ici_mesh_shape, dcn_mesh_shape=self.dcn_mesh_shape, device_kind=self.device_kind
            ),
        )


def pax_names(module: str, cls: str) -> tuple[str, str]:
    """The class name and Pax's `--exp` spelling (`tasks.lm.params.<module>.<Class>`)."""
    return (cls, f"tasks.lm.params.{module}.{cls}")


# model_params.TransformerLmSpmdAdafactor + lm_cloud.LmCloudSpmd (not registered in Pax).
LM_CLOUD_SPMD = PaxLm(
    num_layers=10,
    model_dims=2048,
    hidden_dims=8192,
    dims_per_head=128,
    percore_batch_size=16,
    use_repeated_layer=True,
    checkpoint_policy="SAVE_NOTHING",
    learner=set_default_adam(2.5e-4, 1e-3),  # decay_end 300000: DECAY_END=100000 only reached Adafactor
)


def _spmd(layers: int, dims: int, percore: int, ici: tuple[int, int, int], policy: CheckpointPolicy) -> PaxLm:
    return LM_CLOUD_SPMD.replace(
        num_layers=layers, model_dims=dims, hidden_dims=4 * dims, percore_batch_size=percore,
        ici_mesh_shape=ici, checkpoint_policy=policy,
    )  # fmt: skip


LM_CLOUD_SPMD_TEST = LM_CLOUD_SPMD.replace(
    num_layers=2, model_dims=64, hidden_dims=256, dims_per_head=8, percore_batch_size=4, ici_mesh_shape=(1, 1, 1)
)
LM_CLOUD_SPMD_2B = _spmd(18, 3072, 8, (1, 4, 1), "SAVE_NOTHING")
LM_CLOUD_SPMD_32B = _spmd(40, 8192, 8, (1, 16, 4), "SAVE_CONTEXT_AND_OUT_PROJ")
LM_CLOUD_SPMD_64B = _spmd(51, 10240, 4, (1, 16, 8), "SAVE_CONTEXT_AND_OUT_PROJ")
LM_CLOUD_SPMD_128B = _spmd(71, 12288, 4, (1, 64, 4), "SAVE_NOTHING")
LM_CLOUD_SPMD_256B = _spmd(80, 16384, 4, (1, 64, 8), "SAVE_NOTHING")
LM_CLOUD_SPMD_512B = _spmd(102, 20480, 4, (1, 64, 16), "SAVE_NOTHING")
LM_CLOUD_SPMD_1024B = _spmd(142, 24576, 2, (1, 256, 8), "SAVE_NOTHING")

# lm_cloud.LmCloudSpmdMultislice2B: the 2B shape, per-core 16 on ICI (1, 4, 1) x DCN (2, 1, 1).
LM_CLOUD_SPMD_MULTISLICE_2B = LM_CLOUD_SPMD_2B.replace(percore_batch_size=16, dcn_mesh_shape=(2, 1, 1))


def _pipeline(
    layers: int,
    dims: int,
    percore: float,
    stages: int,
    microbatch: int,
    ici: tuple[int, ...],
    dcn: tuple[int, ...] = (1, 1, 1, 1),
    **more: object,
) -> PaxLm:
    """lm_cloud.LmCloudSpmdPipeline (not registered): TransformerLmSpmdPipelineAdafactor with
    LmCloudSpmd's GELU, SAVE_NOTHING and set_default_adam(2.5e-4, 1e-3), the layers pipelined over
    `stages` (USE_REPEATED_LAYER False), microbatches of `microbatch` rows, 4-D meshes."""
    return LM_CLOUD_SPMD.replace(
        num_layers=layers, model_dims=dims, hidden_dims=4 * dims, percore_batch_size=percore, num_stages=stages,
        microbatch_size=microbatch, ici_mesh_shape=ici, dcn_mesh_shape=dcn, use_repeated_layer=False, **more,
    )  # fmt: skip


LM_CLOUD_SPMD_PIPELINE_9B = _pipeline(48, 4096, 8, 16, 4, (16, 4, 1, 1), fprop_dtype="float32")
LM_CLOUD_SPMD_PIPELINE_175B = _pipeline(
    96, 12288, 0.75, 8, 2, (1, 1, 1, 16), (8, 1, 1, 1), num_heads=96, dims_per_head=128, max_seq_len=2048
).replace(device_kind="a100")  # its docstring: "This config works on 8 hosts * 16 A100s."
LM_CLOUD_SPMD_PIPELINE_MULTISLICE_2B = _pipeline(18, 3072, 16, 2, 4, (1, 4, 1, 1), (2, 1, 1, 1))
LM_CLOUD_SPMD_PIPELINE_MULTISLICE_2B_CIRCULAR = LM_CLOUD_SPMD_PIPELINE_MULTISLICE_2B.replace(
    microbatch_size=8, circular_repeat=3
)

# model_params.TransformerLmPmapAdam + lm_cloud.LmCloudTransformerAdam: data parallel.
LM_CLOUD_TRANSFORMER_ADAM = PaxLm(
    num_layers=32,
    model_dims=1024,
    hidden_dims=4096,
    num_heads=16,
    dims_per_head=0,
    percore_batch_size=16,
    ici_mesh_shape=(1, 1, 1),
    fprop_dtype="float32",
    use_repeated_layer=False,
    activation="relu",
    combine_qkv=False,
    softmax_cap_logits=0.0,
    learner=set_default_adam(1e-3, 1e-3),
)


@register("lm_cloud_spmd_test", aliases=pax_names("lm_cloud", "LmCloudSpmdTest"))
def lm_cloud_spmd_test() -> ExperimentConfig:
    """2 layers, d 64, 8 heads of 8, batch 4 on 1 device: Pax's local CPU test of the SPMD family."""
    return LM_CLOUD_SPMD_TEST.experiment("lm_cloud_spmd_test")


@register("lm_cloud_spmd_2b", aliases=pax_names("lm_cloud", "LmCloudSpmd2B"))
def lm_cloud_spmd_2b() -> ExperimentConfig:
    """2.1B: 18 layers, d 3072, 24 heads of 128, per-core batch 8 on ICI (1, 4, 1): global batch 32.

    Pax's docstring says "Global batch size = 2 * 2 * 1 * 32 = 128", which is 16 devices; on
    the declared 4-device mesh it is 32.
    """
    return LM_CLOUD_SPMD_2B.experiment("lm_cloud_spmd_2b")


@register("lm_cloud_spmd_2b_limit_steps", aliases=pax_names("lm_cloud", "LmCloudSpmd2BLimitSteps"))
def lm_cloud_spmd_2b_limit_steps() -> ExperimentConfig:
    """lm_cloud_spmd_2b for 300 steps (Pax's README quick start)."""
    return LM_CLOUD_SPMD_2B.replace(num_train_steps=300).experiment("lm_cloud_spmd_2b_limit_steps")


@register("lm_cloud_spmd_32b", aliases=pax_names("lm_cloud", "LmCloudSpmd32B"))
def lm_cloud_spmd_32b() -> ExperimentConfig:
    """32B: 40 layers, d 8192, 64 heads, per-core 8 on ICI (1, 16, 4): global batch 512."""
    return LM_CLOUD_SPMD_32B.experiment("lm_cloud_spmd_32b")


@register("lm_cloud_spmd_64b", aliases=pax_names("lm_cloud", "LmCloudSpmd64B"))
def lm_cloud_spmd_64b() -> ExperimentConfig:
    """64B: 51 layers, d 10240, 80 heads, per-core 4 on ICI (1, 16, 8): global batch 512."""
    return LM_CLOUD_SPMD_64B.experiment("lm_cloud_spmd_64b")


@register("lm_cloud_spmd_128b", aliases=pax_names("lm_cloud", "LmCloudSpmd128B"))
def lm_cloud_spmd_128b() -> ExperimentConfig:
    """128B: 71 layers, d 12288, 96 heads, per-core 4 on ICI (1, 64, 4): global batch 1024."""
    return LM_CLOUD_SPMD_128B.experiment("lm_cloud_spmd_128b")


@register("lm_cloud_spmd_256b", aliases=pax_names("lm_cloud", "LmCloudSpmd256B"))
def lm_cloud_spmd_256b() -> ExperimentConfig:
    """256B: 80 layers, d 16384, 128 heads, per-core 4 on ICI (1, 64, 8): global batch 2048."""
    return LM_CLOUD_SPMD_256B.experiment("lm_cloud_spmd_256b")


@register("lm_cloud_spmd_512b", aliases=pax_names("lm_cloud", "LmCloudSpmd512B"))
def lm_cloud_spmd_512b() -> ExperimentConfig:
    """512B: 102 layers, d 20480, 160 heads, per-core 4 on ICI (1, 64, 16): global batch 4096."""
    return LM_CLOUD_SPMD_512B.experiment("lm_cloud_spmd_512b")


@register("lm_cloud_spmd_1024b", aliases=pax_names("lm_cloud", "LmCloudSpmd1024B"))
def lm_cloud_spmd_1024b() -> ExperimentConfig:
    """1T: 142 layers, d 24576, 192 heads, per-core 2 on ICI (1, 256, 8): global batch 4096."""
    return LM_CLOUD_SPMD_1024B.experiment("lm_cloud_spmd_1024b")


@register("lm_cloud_transformer_adam", aliases=pax_names("lm_cloud", "LmCloudTransformerAdam"))
def lm_cloud_transformer_adam() -> ExperimentConfig:
    """0.44B data-parallel LM: 32 layers, d 1024, 16 heads, ReLU, separate Q/K/V, float32, batch 16/device.

    Pax runs it with pmap over every device (per-core batch 16); here the mesh is one device.
    On N devices: `--mesh.ici-mesh-shape N 1 1 --data.train.batch-size 16N --data.eval.batch-size 16N`.
    """
    return LM_CLOUD_TRANSFORMER_ADAM.experiment("lm_cloud_transformer_adam")


@register("lm_cloud_transformer_adam_test", aliases=pax_names("lm_cloud", "LmCloudTransformerAdamTest"))
def lm_cloud_transformer_adam_test() -> ExperimentConfig:
    """lm_cloud_transformer_adam with 2 layers (58M parameters)."""
    return LM_CLOUD_TRANSFORMER_ADAM.replace(num_layers=2).experiment("lm_cloud_transformer_adam_test")


@register("lm_cloud_transformer_adam_limit_steps", aliases=pax_names("lm_cloud", "LmCloudTransformerAdamLimitSteps"))
def lm_cloud_transformer_adam_limit_steps() -> ExperimentConfig:
    """lm_cloud_transformer_adam with 10 layers (Pax changes the depth too) for 2000 steps."""
    return LM_CLOUD_TRANSFORMER_ADAM.replace(num_layers=10, num_train_steps=2000).experiment(
        "lm_cloud_transformer_adam_limit_steps"
    )


@register("lm_cloud_spmd_multislice_2b", aliases=pax_names("lm_cloud", "LmCloudSpmdMultislice2B"))
def lm_cloud_spmd_multislice_2b() -> ExperimentConfig:
    """lm_cloud_spmd_2b on two slices: per-core 16 on ICI (1, 4, 1) x DCN (2, 1, 1), global batch 128."""
    return LM_CLOUD_SPMD_MULTISLICE_2B.experiment("lm_cloud_spmd_multislice_2b")


@register("lm_cloud_spmd_pipeline_9b", aliases=pax_names("lm_cloud", "LmCloudSpmdPipeline9B"))
def lm_cloud_spmd_pipeline_9b() -> ExperimentConfig:
    """9.7B: 48 layers in 16 stages, d 4096, 32 heads of 128, float32, per-core 8 on (16, 4, 1, 1):
    batch 512 in 128 microbatches of 4."""
    return LM_CLOUD_SPMD_PIPELINE_9B.experiment("lm_cloud_spmd_pipeline_9b")


@register("lm_cloud_spmd_pipeline_175b", aliases=pax_names("lm_cloud", "LmCloudSpmdPipeline175B"))
def lm_cloud_spmd_pipeline_175b() -> ExperimentConfig:
    """GPT-3 175B's shape on lm_cloud's recipe: 96 layers in 8 stages (DCN), d 12288, 96x128, seq 2048, bf16,
    tensor 16, per-core 0.75 on (1, 1, 1, 16) x (8, 1, 1, 1): batch 96 in 48 microbatches of 2."""
    return LM_CLOUD_SPMD_PIPELINE_175B.experiment("lm_cloud_spmd_pipeline_175b")


@register("lm_cloud_spmd_pipeline_multislice_2b", aliases=pax_names("lm_cloud", "LmCloudSpmdPipelineMultislice2B"))
def lm_cloud_spmd_pipeline_multislice_2b() -> ExperimentConfig:
    """lm_cloud_spmd_2b pipelined across two slices: 2 stages (DCN) x 9 layers, per-core 16 on (1, 4, 1, 1) x
    (2, 1, 1, 1): batch 128 in 32 microbatches of 4.

    Pax's STREAM_IO and EMB_W_DATA_DIMS ('replica', 'data') are layouts of the same computation; here
    the mesh rules lay it out (see experiments/pipelined.py)."""
    return LM_CLOUD_SPMD_PIPELINE_MULTISLICE_2B.experiment("lm_cloud_spmd_pipeline_multislice_2b")


@register(
    "lm_cloud_spmd_pipeline_multislice_2b_circular",
    aliases=pax_names("lm_cloud", "LmCloudSpmdPipelineMultislice2BCircular"),
)
def lm_cloud_spmd_pipeline_multislice_2b_circular() -> ExperimentConfig:
    """lm_cloud_spmd_pipeline_multislice_2b with a circular pipeline: 2 stages x 3 repeats of 3 layers,
    16 microbatches of 8."""
    return LM_CLOUD_SPMD_PIPELINE_MULTISLICE_2B_CIRCULAR.experiment("lm_cloud_spmd_pipeline_multislice_2b_circular")


# lm_cloud.LargeMlp / SmallMlp: model_params.ClassificationModelAdam + SyntheticDataset ------------
def classification_model_adam(name: str, input_dim: int, hidden_dim: int) -> ExperimentConfig:
    """model_params.ClassificationModelAdam (NUM_LAYER 8, OUTPUT_DIM = INPUT_DIM, lr 1e-3, wd 1e-3,
    checkpoints and summaries every 5 steps, 10 steps) with lm_cloud's SyntheticDataset (per-core
    16, seq 1024) on MESH_SHAPE [8, 1, 1] with replicated weights: 8-way data parallel, float32."""
    spec = LM_CLOUD_SPMD.replace(percore_batch_size=16, ici_mesh_shape=(8, 1, 1))
    return ExperimentConfig(
        name=name,
        model=TokenMlpConfig(input_dims=input_dim, hidden_dims=hidden_dim, num_layers=8),
        learner=set_default_adam(1e-3, 1e-3),
        data=spec.data_config(),
        train=TrainConfig(
            num_steps=10, eval_interval_steps=100, summary_interval_steps=5, fprop_dtype="float32", sample_at_end=False
        ),
        checkpoint=CheckpointConfig(every_n_steps=5, max_to_keep=10),
        mesh=MeshConfig(ici_mesh_shape=(8, 1, 1), device_kind="tpu_v4"),
    )


@register("large_mlp", aliases=pax_names("lm_cloud", "LargeMlp"))
def large_mlp() -> ExperimentConfig:
    """An 8-layer token MLP, 4096 -> 7168 (x7) -> 4096, on 4096 classes: batch 128 x 1024 tokens on 8 devices."""
    return classification_model_adam("large_mlp", 4096, 7168)


@register("small_mlp", aliases=pax_names("lm_cloud", "SmallMlp"))
def small_mlp() -> ExperimentConfig:
    """An 8-layer token MLP, 1024 wide, on 1024 classes: batch 128 x 1024 tokens on 8 devices."""
    return classification_model_adam("small_mlp", 1024, 1024)
