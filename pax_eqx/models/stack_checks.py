"""The checks every transformer model config shares (LanguageModelConfig, SequenceModelConfig).

Both hold the same experiment-level numbers (model_dims, num_heads, dim_per_head, num_kv_heads),
the same layer template (`block`), positions, and how their stacks are applied (repeat, unroll);
a bad combination of them is refused here once, naming `model.<field>`, the value and the fix.
"""

from __future__ import annotations

from typing import Any

from pax_eqx.config import ConfigError
from pax_eqx.layers.attentions import AttentionConfig


def check_stack_fields(cfg: Any, *, num_layers: int) -> None:
    """ConfigError for the shared fields of `cfg`; `num_layers`: the shallowest stack's depth
    (the most layers one scan iteration may unroll)."""
    for name in ("dim_per_head", "num_kv_heads"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"model.{name} must be >= 0 (0 = its default), got {getattr(cfg, name)}.")
    if cfg.dim_per_head == 0 and cfg.model_dims % cfg.num_heads:
        raise ConfigError(
            f"model.model_dims={cfg.model_dims} is not divisible by model.num_heads={cfg.num_heads}; "
            "set model.dim_per_head explicitly."
        )
    kv_heads = cfg.num_kv_heads or cfg.num_heads
    if cfg.num_heads % kv_heads:
        raise ConfigError(
            f"model.num_kv_heads={cfg.num_kv_heads} does not divide model.num_heads={cfg.num_heads}; "
            "grouped-query attention shares each kv head among num_heads / num_kv_heads query heads."
        )
    if cfg.block.attention.combine_qkv and kv_heads != cfg.num_heads:
        raise ConfigError(
            f"model.num_kv_heads={cfg.num_kv_heads} with model.block.attention.combine_qkv=True: the fused "
            "QKV weight needs as many kv heads as query heads; set combine_qkv=False or num_kv_heads=0."
        )
    rotary = cfg.position_embedding == "rotary"
    head_dim = cfg.dim_per_head or cfg.model_dims // cfg.num_heads
    if rotary and head_dim % 2:
        raise ConfigError(
            f"model.position_embedding='rotary' needs an even head dim, got {head_dim} (model.dim_per_head="
            f"{cfg.dim_per_head}, model.model_dims={cfg.model_dims}, model.num_heads={cfg.num_heads})."
        )
    timescale = cfg.block.attention.rotary_max_timescale
    if not rotary and timescale != AttentionConfig().rotary_max_timescale:
        raise ConfigError(
            f"model.block.attention.rotary_max_timescale={timescale} has no effect with "
            f"model.position_embedding={cfg.position_embedding!r}; set position_embedding='rotary' or leave "
            "rotary_max_timescale at its default."
        )
    if not cfg.repeat and cfg.unroll != 1:
        raise ConfigError(
            f"model.unroll={cfg.unroll} has no effect with model.repeat=False (no scan over layers to "
            "unroll); set model.repeat=True or leave model.unroll at 1."
        )
    if not 1 <= cfg.unroll <= num_layers:
        raise ConfigError(f"model.unroll must be in [1, {num_layers}] (layers per stack), got {cfg.unroll}.")
    if not 0.0 <= cfg.label_smoothing_prob < 1.0:
        raise ConfigError(f"model.label_smoothing_prob must be in [0, 1), got {cfg.label_smoothing_prob}.")
