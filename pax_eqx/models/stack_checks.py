"""The checks every transformer model config shares (LanguageModelConfig, SequenceModelConfig).

Both hold the same experiment-level numbers (model_dims, num_heads, dim_per_head, num_kv_heads),
the same layer template (`block`), positions, and how their stacks are applied (repeat, unroll);
a bad combination of them is refused here once, naming `model.<field>`, the value and the fix.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pax_eqx.config import Config, ConfigError, check_range
from pax_eqx.layers.attention_config import AttentionConfig
from pax_eqx.layers.moe import MoEFeedForwardConfig
from pax_eqx.layers.transformers import TransformerConfig


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


def changed_fields(cfg: Config, default: Config, prefix: str) -> list[str]:
    """The leaf fields of `cfg` that differ from `default`'s, as 'prefix.a.b' paths."""
    out = []
    for f in dataclasses.fields(cfg):
        value, base = getattr(cfg, f.name), getattr(default, f.name)
        if isinstance(value, Config) and type(value) is type(base):
            out += changed_fields(value, base, f"{prefix}.{f.name}")
        elif value != base:
            out.append(f"{prefix}.{f.name}")
    return out


def check_moe_fields(cfg: Any, *, num_layers: int) -> None:
    """ConfigError for a Mixture-of-Experts setting that does nothing or cannot be built:
    `moe` / `moe_hidden_dims` changed in a dense model (moe_layer_interval=0), an interval
    that does not divide num_layers, or the dense feed-forward's fields changed when every
    layer is MoE (interval 1: the dense feed-forward is never built)."""
    check_range(cfg, "moe_layer_interval", prefix="model", ge=0, note="0 = dense")
    check_range(cfg, "moe_hidden_dims", prefix="model", ge=0, note="0 = hidden_dims")
    interval = cfg.moe_layer_interval
    if interval == 0:
        changed = changed_fields(cfg.moe, MoEFeedForwardConfig(), "model.moe")
        changed += ["model.moe_hidden_dims"] if cfg.moe_hidden_dims else []
        if changed:
            raise ConfigError(
                f"{', '.join(changed)} has no effect with model.moe_layer_interval=0 (a dense model); set "
                "model.moe_layer_interval (1 = every layer MoE, 2 = every other layer) or leave it at its default."
            )
        return
    if num_layers % interval:
        raise ConfigError(
            f"model.num_layers={num_layers} is not a multiple of model.moe_layer_interval={interval} (the stack "
            "is made of [MoE, dense x (interval - 1)] blocks); change either."
        )
    if interval == 1:
        default = TransformerConfig()
        changed = changed_fields(cfg.block.activation, default.activation, "model.block.activation")
        changed += ["model.block.ff_has_bias"] if cfg.block.ff_has_bias != default.ff_has_bias else []
        if changed:
            raise ConfigError(
                f"{', '.join(changed)} has no effect with model.moe_layer_interval=1: every layer is MoE, so the "
                "dense feed-forward is never built (the experts' activation is model.moe.activation; experts have "
                "no biases); leave it at its default."
            )


def check_global_layers(cfg: Any, *, num_layers: int) -> None:
    """ConfigError for a local/global alternation that does nothing or cannot be built: an
    interval with a global window (every layer is global already), one that does not divide
    num_layers, or one with shared layers (one layer has one window)."""
    check_range(cfg, "global_layer_interval", prefix="model", ge=0, note="0 = every layer uses the window")
    interval = cfg.global_layer_interval
    if not interval:
        return
    if cfg.block.attention.window.kind == "global":
        raise ConfigError(
            f"model.global_layer_interval={interval} has no effect: model.block.attention.window is global, so every "
            "layer is already; set --model.block.attention.window sliding (with its left-context) or leave the "
            "interval at 0."
        )
    if num_layers % interval:
        raise ConfigError(
            f"model.num_layers={num_layers} is not a multiple of model.global_layer_interval={interval} (the stack "
            "is made of [local x (interval - 1), global] blocks); change either."
        )
    if getattr(cfg, "share_layers", False):
        raise ConfigError(
            f"model.share_layers=True with model.global_layer_interval={interval}: one shared layer has one window; "
            "drop one of them."
        )
