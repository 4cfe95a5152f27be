"""AttentionConfig: what a user chooses about dot-product attention, checked when it is made.

The layer it builds is `layers.attentions.Attention`; the sizes (input_dims, num_heads,
dim_per_head, num_kv_heads), the weight init and whether rotary positions are used belong to the
layer that owns the attention, so they are arguments of `build`, which checks their arithmetic
(the kv heads divide the query heads, an even head dim for rotary positions, a fused QKV weight
only for multi-head attention) before any weight is made. Validation names the field, the value
and the fix, including the choices the cuDNN kernel cannot honour (a logit cap, probability
dropout). The config sits above the layer: it imports `Attention` to build it, and the layer
knows the config only as the type of its constructor's argument.
"""

from __future__ import annotations

import typing
from typing import Literal

from jaxtyping import PRNGKeyArray

from pax_eqx.config import Config, ConfigError, check_range, config
from pax_eqx.layers import attention_kernels as kernels
from pax_eqx.layers.attention_position_bias import NoPositionBiasConfig, PositionBiasConfig
from pax_eqx.layers.attention_window import AttentionWindowConfig, GlobalWindowConfig
from pax_eqx.layers.attentions import Attention
from pax_eqx.layers.initializers import WeightInit
from pax_eqx.layers.relative_position_bias import RelativePositionBiasConfig
from pax_eqx.layers.rotary_scaling import NoRotaryScalingConfig, RotaryScalingConfig

_DEFAULT_ROTARY_MAX_TIMESCALE = 10_000.0

MaskMode = Literal["pax_eqx", "praxis"]


@config
class AttentionConfig(Config):
    """Dot-product attention: what a user chooses about it. The sizes (input_dims, num_heads,
    dim_per_head, num_kv_heads), the weight init and whether rotary positions are used are decided
    by the layer that owns the attention, so they are arguments of `build`, not fields.

    combine_qkv: one fused QKV weight (multi-head only).
    use_bias: biases on the q/k/v and output projections.
    qkv_bias: biases on the q/k/v projections only, none on the output (Qwen2's); use_bias has
      them all already.
    causal: each position attends only to itself and earlier positions.
    rotary_max_timescale: the longest rotary wavelength (only with rotary positions).
    rotary_scaling: how the rotary frequencies are scaled: none, or llama3 (Llama 3.1's;
      layers.rotary_scaling). Only with rotary positions.
    per_dim_scale: Praxis PerDimScale, a learned per-dimension query scale.
    logit_cap: 0 = off, else logits = cap * tanh(logits / cap).
    dropout_prob: dropout on attention probabilities (TRAIN mode only).
    implementation: "auto" (cuDNN on GPU when it qualifies, else XLA), "xla" or "cudnn" (which
      has neither a logit cap nor probability dropout).
    mask_mode: what self-attention's paddings mask: "pax_eqx" (padded keys) or "praxis" (also
      padded query rows, Praxis' merge_masks: a uniform softmax there); see layers.attentions.
    window: which keys self-attention sees by distance: global, or sliding (local attention,
      Praxis' LocalSelfAttention; layers.attention_window). Cross-attention is always global.
    query_scale_dims: the logits are q.k / sqrt(query_scale_dims); 0 = the head dim (the usual
      1 / sqrt(head_dim)). Gemma 2's `query_pre_attn_scalar` (its 27B scales by model_dims /
      heads, not the head dim). Not with per_dim_scale, which is a learned scale instead.
    position_bias: a relative position term of self-attention's logits: none, alibi (Praxis'
      LocalSelfAttentionAlibi) or xl (Transformer-XL's, Praxis' DotProductAttentionXL /
      LocalSelfAttentionXL); layers.attention_position_bias. With a sliding window it is Praxis'
      local form of the same class. A language model using one usually sets
      position_embedding='none'.
    """

    combine_qkv: bool = False
    use_bias: bool = False
    qkv_bias: bool = False
    causal: bool = True
    rotary_max_timescale: float = _DEFAULT_ROTARY_MAX_TIMESCALE
    rotary_scaling: RotaryScalingConfig = NoRotaryScalingConfig()
    per_dim_scale: bool = False
    logit_cap: float = 0.0
    dropout_prob: float = 0.0
    implementation: kernels.Implementation = "auto"
    mask_mode: MaskMode = "pax_eqx"
    window: AttentionWindowConfig = GlobalWindowConfig()
    query_scale_dims: float = 0.0
    position_bias: PositionBiasConfig = NoPositionBiasConfig()

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        choices = typing.get_args(kernels.Implementation)
        if self.implementation not in choices:
            raise ConfigError(f"AttentionConfig.implementation={self.implementation!r} is not one of {choices}.")
        if self.mask_mode not in typing.get_args(MaskMode):
            raise ConfigError(
                f"AttentionConfig.mask_mode={self.mask_mode!r} is not one of {typing.get_args(MaskMode)}."
            )
        check_range(self, "logit_cap", ge=0, note="0 = off")
        check_range(self, "dropout_prob", ge=0, lt=1)
        check_range(self, "rotary_max_timescale", gt=0)
        self.window.check_direction(self.causal)
        check_range(self, "query_scale_dims", ge=0, note="0 = the head dim")
        if self.query_scale_dims and self.per_dim_scale:
            raise ConfigError(
                f"AttentionConfig.query_scale_dims={self.query_scale_dims} has no effect with per_dim_scale=True "
                "(the learned per-dimension scale replaces 1/sqrt(dims)); set one of them."
            )
        if self.qkv_bias and self.use_bias:
            raise ConfigError(
                "AttentionConfig.qkv_bias=True has no effect with use_bias=True (which puts biases on q, k, v and the "
                "output already); set one of them."
            )
        if self.implementation == "cudnn" and self.logit_cap > 0.0:
            raise ConfigError(
                f"AttentionConfig.logit_cap={self.logit_cap} with implementation='cudnn': cuDNN's kernel has no "
                "logit cap; use implementation='auto' (XLA when a cap is set) or logit_cap=0."
            )
        if self.implementation == "cudnn" and self.dropout_prob > 0.0:
            raise ConfigError(
                f"AttentionConfig.dropout_prob={self.dropout_prob} with implementation='cudnn': cuDNN's kernel "
                "here has no probability dropout; use implementation='auto' (XLA when dropout is on) or dropout_prob=0."
            )

    def build(
        self,
        key: PRNGKeyArray,
        *,
        input_dims: int,
        num_heads: int,
        dim_per_head: int = 0,
        num_kv_heads: int = 0,
        init: WeightInit = WeightInit(),
        use_rotary: bool = False,
        fp8: bool = False,
        relative_bias: RelativePositionBiasConfig | None = None,
    ) -> Attention:
        """The layer for a model of width `input_dims`.

        num_heads: query heads; dim_per_head: 0 = input_dims // num_heads; num_kv_heads: 0 =
        num_heads (multi-head), 1 = multi-query, otherwise grouped-query (must divide num_heads).
        init: the projections' init. use_rotary: rotary position embedding on q and k.
        fp8: the projections' matmuls in fp8 with delayed scaling (`layers.fp8`); the owner's choice
        (TransformerConfig.fp8), as for its feed-forward.
        relative_bias: a relative position bias of the layer's own on its self-attention logits
        (Praxis' DotProductAttention.relative_bias_tpl; a language model's
        position_embedding='relative_bias'), causal (one direction) when the layer is.
        """
        head_dim = dim_per_head or input_dims // max(num_heads, 1)
        kv_heads = num_kv_heads or num_heads
        if input_dims <= 0 or num_heads <= 0 or head_dim <= 0 or dim_per_head < 0 or num_kv_heads < 0:
            raise ConfigError(
                f"AttentionConfig.build needs input_dims, num_heads and the head dim > 0 (dim_per_head, "
                f"num_kv_heads >= 0); got input_dims={input_dims}, num_heads={num_heads}, "
                f"dim_per_head={dim_per_head}, num_kv_heads={num_kv_heads}."
            )
        if num_heads % kv_heads:
            raise ConfigError(f"AttentionConfig.build: num_kv_heads={kv_heads} must divide num_heads={num_heads}.")
        if self.combine_qkv and kv_heads != num_heads:
            raise ConfigError(
                f"AttentionConfig.combine_qkv needs num_kv_heads == num_heads (got {kv_heads} vs {num_heads}); "
                "set combine_qkv=False for multi-query or grouped-query attention."
            )
        if use_rotary and head_dim % 2:
            raise ConfigError(f"AttentionConfig.build: rotary positions need an even head dim, got {head_dim}.")
        if not use_rotary and self.rotary_max_timescale != _DEFAULT_ROTARY_MAX_TIMESCALE:
            raise ConfigError(
                f"AttentionConfig.rotary_max_timescale={self.rotary_max_timescale} has no effect without rotary "
                "positions; build with use_rotary=True (a language model: position_embedding='rotary') or leave "
                "it at its default."
            )
        if not use_rotary and self.rotary_scaling.kind != "none":
            raise ConfigError(
                f"AttentionConfig.rotary_scaling={self.rotary_scaling.kind!r}: {self.rotary_scaling.describe()} has no "
                "effect without rotary positions; "
                "build with use_rotary=True (a language model: position_embedding='rotary') or use rotary_scaling none."
            )
        if use_rotary and self.rotary_scaling.kind != "none":
            self.rotary_scaling.check_effect(head_dim, self.rotary_max_timescale)
        return Attention(
            self, key=key, input_dims=input_dims, num_heads=num_heads, head_dim=head_dim, num_kv_heads=kv_heads,
            init=init, use_rotary=use_rotary, fp8=fp8, relative_bias=relative_bias,
        )  # fmt: skip
