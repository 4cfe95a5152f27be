"""Mixture-of-Experts language models: `shakespeare_moe` (CPU-sized) and Pax's MoE LM classes.

shakespeare_moe: `shakespeare_char` (experiments/shakespeare.py) with 8 experts in every other
layer (layers 0 and 2 of 4: GLaM's [MoE, dense] blocks), GShard top-2 routing, capacity factor
2.0, the GLaM load-balancing weight 0.01 (summed over the 2 MoE layers). Each expert is
hidden_dims / 2 = 256 wide, so a token's two experts hold as many weights as the dense layer's
512-wide feed-forward: the same active parameters per token (plus the 128 x 8 router), 4x the
feed-forward parameters in an MoE layer. The experts use the dense layers' exact GELU, no biases
(Praxis' experts have none; the dense default has none either).

Pax's classes, paxml/tasks/lm/params/nvidia.py (@ google/paxml), on its NVIDIA1_3B base
(experiments/nvidia.py: PERCORE batch 4, seq 2048, vocab 51200, GELU not gated, trainable
positions, Gaussian init 0.023 for the projections (the tied softmax keeps Gaussian(1/sqrt(d)):
Pax computes SOFTMAX_INIT_STD's init and never assigns it), bf16, repeated layers, checkpoints
every 100000 steps; Adam b1 0.9, b2 0.95, eps 1e-8, eps_root 0, gradient clip-norm 1.0, update
clip 1.0, lr 6e-4 x LinearRampupCosineDecay(warmup 0, decay_start 1, decay_end 500000,
min_ratio 0.1), weight decay 1e-3):

- MoELarge: 12 layers, d 4096, ffn 16384, 32 heads x 128, 16 experts in every layer
  (moe_layers = all), NUM_GROUPS 16, capacity factor 2.0, load-balance weight 1.0
  (maybe_setup_moe_params), experts GELU not gated (the dense template's), ICI [1, 16, 1] DCN
  [1, 2, 1] = our (data, fsdp, tensor) as lm_cloud.py documents: 32 devices, global batch
  4 x 32 = 128.
- GLaM64B64EProxy_EP (a class of nvidia.py after Paxml 1.4.0, whose GLaM64B64EProxy is not
  registered): 8 layers, d 8192, ffn = expert hidden 32768, 64 heads x 128, 8 experts,
  GLaM blocks [MoE, dense] (moe_layer_interval 2), NUM_GROUPS 128, capacity 2.0, load-balance
  weight 0.01, RMSNorm; Pax's z-loss 1e-4 is on the output logits (GShardSharedEmbeddingSoftmax),
  not the router, and our softmax has none: not reproduced (the router z-loss stays 0);
  Praxis' glam.py builds the dense feed-forward gated GELU but the MoE experts plain ReLU
  (use_gated_activation reaches only the dense layers: a quirk kept here). Its ICI
  [1, 16, 8, 1] over (replica, data, data_expert, mdl) has an extra expert axis; we have none,
  so data x data_expert = 128 is our fsdp axis, on which the experts (and Pax's "data"-sharded
  weights) live: (1, 128, 1), global batch 4 x 128 = 512.
  Departure: GlamUniTransformerLm uses T5-style relative position biases, which our
  LanguageModel does not have; rotary embeddings are the nearest relative-position scheme we
  have (not the same function: a learned bias per bucket vs. a fixed rotation). Its attention
  extra logit is 0 (off) here as in Pax.

Both: NUM_GROUPS tokens groups route on their own (our num_groups, a divisor of batch x seq).
"""

from __future__ import annotations

from experiments.lm_cloud import pax_names
from experiments.nvidia import NVIDIA_1_3B
from experiments.registry import register
from experiments.shakespeare import shakespeare_char
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.layers import ActivationConfig, MoEFeedForwardConfig, RmsNormConfig


@register("shakespeare_moe", aliases=("ShakespeareMoE",))
def shakespeare_moe() -> ExperimentConfig:
    """shakespeare_char with 8 top-2 experts (hidden 256) in layers 0 and 2: its active parameters."""
    exp = shakespeare_char()
    moe = MoEFeedForwardConfig(
        num_experts=8, top_k=2, capacity_factor=2.0, load_balance_loss_weight=0.01,
        activation=ActivationConfig(name="gelu_exact"),
    )  # fmt: skip
    model = exp.model.replace(moe_layer_interval=2, moe=moe, moe_hidden_dims=exp.model.hidden_dims // 2)
    return exp.replace(name="shakespeare_moe", model=model)


MOE_LARGE = NVIDIA_1_3B.replace(
    num_layers=12, num_heads=32, model_dims=4096, hidden_dims=16384, dims_per_head=128,
    ici_mesh_shape=(1, 16, 1), dcn_mesh_shape=(1, 2, 1),
)  # fmt: skip

GLAM_64B_64E_PROXY_EP = NVIDIA_1_3B.replace(
    num_layers=8, num_heads=64, model_dims=8192, hidden_dims=32768, dims_per_head=128, ici_mesh_shape=(1, 128, 1)
)


@register("moe_large", aliases=pax_names("nvidia", "MoELarge"))
def moe_large() -> ExperimentConfig:
    """nvidia.MoELarge: 12 layers, every one with 16 GELU experts (26.8B parameters)."""
    exp = MOE_LARGE.experiment("moe_large")
    m = exp.model
    moe = MoEFeedForwardConfig(
        num_experts=16, num_groups=16, top_k=2, capacity_factor=2.0, load_balance_loss_weight=1.0,
        activation=ActivationConfig(name="gelu"),
    )  # fmt: skip
    # Every layer is MoE, so the dense feed-forward's activation (moved to the experts) stays default.
    block = m.block.replace(activation=ActivationConfig())
    return exp.replace(model=m.replace(block=block, moe_layer_interval=1, moe=moe))


@register("glam_64b_64e_proxy_ep", aliases=pax_names("nvidia", "GLaM64B64EProxy_EP"))
def glam_64b_64e_proxy_ep() -> ExperimentConfig:
    """nvidia.GLaM64B64EProxy_EP: 8 layers of GLaM [MoE, dense] blocks, 8 ReLU experts, RMSNorm."""
    exp = GLAM_64B_64E_PROXY_EP.experiment("glam_64b_64e_proxy_ep")
    m = exp.model
    rms = RmsNormConfig(epsilon=1e-6)
    moe = MoEFeedForwardConfig(
        num_experts=8, num_groups=128, top_k=2, capacity_factor=2.0, load_balance_loss_weight=0.01,
        activation=ActivationConfig(name="relu"),
    )  # fmt: skip
    block = m.block.replace(norm=rms, activation=ActivationConfig(name="gelu", gated=True))
    model = m.replace(
        block=block, final_norm=rms, position_embedding="rotary", max_seq_len=2048, moe_layer_interval=2, moe=moe,
    )  # fmt: skip
    return exp.replace(model=model)
