"""Stacks of Transformer layers: StackedTransformerConfig, and the list stack StackedTransformer.

`StackedTransformerConfig(repeat=False)` builds `StackedTransformer` (Praxis
StackedTransformer): one module per layer, traced once per layer -- compile time grows with
depth, XLA sees every layer. `repeat=True` builds `StackedTransformerRepeated`
(layers.scanned_stack; Praxis StackedTransformerRepeated / `Repeat`): every array gets a
leading `layers` axis and the forward is one `lax.scan` whose body is traced once. `unroll`
trades compile time for speed (DESIGN.md §5: fully unrolled was ~5 MFU points faster for
GPT3-XL); `remat_policy` names a policy of layers.remat applied to each layer.

An encoder-decoder's decoder is a stack with `cross_attention=True`: every layer also attends to
`memory` (the encoder's output), passed with `bias` (T5's relative bias, shared by every layer),
`paddings` and `memory_paddings` as keyword arguments of `__call__`; the scan closes over them
rather than slicing them per layer. For decoding, `project_memory` computes every layer's
cross-attention keys/values of the memory once, and `decode` takes them per layer beside the
self-attention caches. `select_cache` gathers batch rows of either (beam search reorders and
tiles beams with it) in this stack's layout.

Mixture-of-Experts (`moe`, `moe_layer_interval`): the layers i with i % moe_layer_interval == 0
have an MoE feed-forward (MoEFeedForward, experts `moe_hidden_dims` wide), the others the dense
one -- GLaM's convention: Praxis scans blocks of [MoE, dense] (`moe_layers=[0]` in a 2-layer
block), so with interval 2 layers 0, 2, 4, ... are MoE; interval 1 makes every layer MoE
(Praxis' MoELarge). The scanned stack then scans over blocks of moe_layer_interval layers
(layers.scanned_stack).

Pipelining (`pipeline`, layers.pipeline) cuts the scanned stack's layers into stages over the
mesh's `stage` axis (repeat=True only; layers.scanned_stack).
"""

from __future__ import annotations

import math
import typing

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, check_range, config
from pax_eqx.layers.attention_window import GlobalWindowConfig
from pax_eqx.layers.attentions import KVCache, put_rows, take_rows
from pax_eqx.layers.base import Context
from pax_eqx.layers.initializers import WeightInit
from pax_eqx.layers.moe import MoEFeedForwardConfig
from pax_eqx.layers.pipeline import PipelineConfig
from pax_eqx.layers.relative_position_bias import RelativePositionBiasConfig
from pax_eqx.layers.remat import REMAT_POLICIES, RematPolicy
from pax_eqx.layers.scanned_stack import StackedTransformerRepeated, require_cross_attention
from pax_eqx.layers.shared_stack import SharedLayerStack
from pax_eqx.layers.transformers import Transformer, TransformerConfig


@config
class StackedTransformerConfig(Config):
    """num_layers copies of `block`, the layer template, built at the sizes given here.

    A stack is built directly (by a model, or by a user composing layers), never held as another
    config's template, so its sizes are its own fields and it passes them to `block.build`.

    model_dims / hidden_dims / num_heads: each layer's width, feed-forward width and query heads.
    dim_per_head: 0 = model_dims // num_heads. num_kv_heads: 0 = num_heads (see AttentionConfig.build).
    use_rotary: rotary position embedding in every attention layer.
    relative_bias: every layer's self-attention gets a relative position bias table of its own
      (Praxis' relative_bias_tpl, a decoder-only LM's position_embedding='relative_bias'); None:
      none (T5 shares one per stack, passed as `bias` instead).
    cross_attention: every layer also attends to a `memory` (an encoder-decoder's decoder).
    init: every projection's weight init.
    repeat: stack weights on a leading `layers` axis and scan (True) or keep a list (False).
    share_layers: one layer's weights for every layer (ALBERT's cross-layer sharing,
      layers.shared_stack): stored, optimised, sharded and counted once, its gradient summed
      over the layers; repeat then says scan (True) or Python loop (False).
    remat_policy: "none" (keep all activations) or a jax.checkpoint policy name.
    unroll: scan iterations per loop step (1 = rolled; num_layers = fully unrolled); repeat=True
      only. An iteration is one layer, or one block of moe_layer_interval layers with MoE.
    moe: the Mixture-of-Experts feed-forward template of the MoE layers; None: every layer dense.
    moe_layer_interval: every moe_layer_interval-th layer is MoE, starting with layer 0 (GLaM's
      [MoE, dense] blocks: 2; every layer: 1). num_layers must be a multiple of it.
    moe_hidden_dims: each expert's feed-forward width; 0 = hidden_dims (Praxis' MoE layers use
      the dense width).
    pipeline: pipeline parallelism over the mesh's `stage` axis (layers.pipeline); repeat=True
      only. unroll then applies to each stage's scan over its own layers.
    fold_padding_with_segment_mask: the layers' self-attention sees padding as a segment of its
      own rather than as masked keys (Praxis' StackedTransformer attribute, which its
      TransformerLm sets; see layers.transformers).
    global_layer_interval: 0 = every layer uses block.attention's window; n > 0: layers n - 1,
      2n - 1, ... attend globally and the others through the (sliding) window, Gemma 2's
      alternation (n = 2: local, global, local, ...) and Gemma 3's (n = 6). num_layers must be a
      multiple of it; the scanned stack then scans blocks of n layers (with MoE, of the least
      common multiple of the two intervals).

    `block.residual_droppath_prob` is the top of the stack's stochastic-depth schedule
    (`droppath_schedule`).
    """

    num_layers: int
    model_dims: int
    hidden_dims: int
    num_heads: int
    dim_per_head: int = 0
    num_kv_heads: int = 0
    use_rotary: bool = False
    relative_bias: RelativePositionBiasConfig | None = None
    cross_attention: bool = False
    init: WeightInit = WeightInit()
    block: TransformerConfig = TransformerConfig()
    repeat: bool = True
    share_layers: bool = False
    remat_policy: RematPolicy = "none"
    unroll: int = 1
    moe: MoEFeedForwardConfig | None = None
    moe_layer_interval: int = 1
    moe_hidden_dims: int = 0
    pipeline: PipelineConfig = PipelineConfig()
    fold_padding_with_segment_mask: bool = False
    global_layer_interval: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix (the attention's head
        arithmetic is checked where it is used, by AttentionConfig.build)."""
        check_range(self, ("num_layers", "model_dims", "hidden_dims", "num_heads"), ge=1)
        check_range(self, ("dim_per_head", "num_kv_heads"), ge=0, note="0 = its default")
        check_range(self, "unroll", ge=1)
        if self.remat_policy != "none" and self.remat_policy not in REMAT_POLICIES:
            raise ConfigError(
                f"StackedTransformerConfig.remat_policy={self.remat_policy!r} is not one of "
                f"{typing.get_args(RematPolicy)}."
            )
        if not self.repeat and self.unroll != 1:
            raise ConfigError(
                f"StackedTransformerConfig.unroll={self.unroll} has no effect with repeat=False (there is no scan "
                "to unroll: every layer is traced on its own); set repeat=True or leave unroll at 1."
            )
        if not 1 <= self.unroll <= self.num_layers:
            raise ConfigError(
                f"StackedTransformerConfig.unroll must be in [1, num_layers={self.num_layers}], got {self.unroll}."
            )
        if self.num_layers == 1 and self.block.residual_droppath_prob > 0:
            raise ConfigError(
                f"StackedTransformerConfig.block.residual_droppath_prob={self.block.residual_droppath_prob} has no "
                "effect with num_layers=1: layer i of L drops with probability p * i / L, so the only layer never "
                "does; set it to 0 or use more layers."
            )
        if self.share_layers and (self.moe is not None or self.pipeline.enabled):
            what = (
                "moe (its blocks are distinct layers)"
                if self.moe is not None
                else "pipeline (its stages are distinct layers)"
            )
            raise ConfigError(
                f"StackedTransformerConfig.share_layers=True cannot be combined with {what}; turn one of them off."
            )
        check_range(self, ("moe_layer_interval",), ge=1)
        check_range(self, "moe_hidden_dims", ge=0, note="0 = hidden_dims")
        if self.moe is None and (self.moe_layer_interval != 1 or self.moe_hidden_dims):
            raise ConfigError(
                f"StackedTransformerConfig.moe_layer_interval={self.moe_layer_interval} / moe_hidden_dims="
                f"{self.moe_hidden_dims} have no effect without moe (every layer is dense); set moe or leave them "
                "at 1 / 0."
            )
        if self.moe is not None and self.num_layers % self.moe_layer_interval:
            raise ConfigError(
                f"StackedTransformerConfig.num_layers={self.num_layers} is not a multiple of moe_layer_interval="
                f"{self.moe_layer_interval}: the stack is made of [MoE, dense x (interval - 1)] blocks; change "
                "either."
            )

        check_range(self, "global_layer_interval", ge=0, note="0 = every layer uses the attention's window")
        if self.global_layer_interval:
            if self.block.attention.window.kind == "global":
                raise ConfigError(
                    f"StackedTransformerConfig.global_layer_interval={self.global_layer_interval} has no effect: "
                    "block.attention.window is global already, so every layer is; choose window sliding or set it "
                    "to 0."
                )
            if self.num_layers % self.global_layer_interval:
                raise ConfigError(
                    f"StackedTransformerConfig.num_layers={self.num_layers} is not a multiple of "
                    f"global_layer_interval={self.global_layer_interval}: the stack is made of [local x (interval - "
                    "1), global] blocks; change either."
                )
            if self.share_layers:
                raise ConfigError(
                    f"StackedTransformerConfig.share_layers=True cannot be combined with global_layer_interval="
                    f"{self.global_layer_interval} (one shared layer has one window); turn one of them off."
                )
        if self.num_layers % self.block_size:
            raise ConfigError(
                f"StackedTransformerConfig.num_layers={self.num_layers} is not a multiple of {self.block_size}, the "
                f"least common multiple of moe_layer_interval={self.moe_layer_interval} and global_layer_interval="
                f"{self.global_layer_interval} (the scanned block); change num_layers or an interval."
            )

        if self.pipeline.enabled:
            if self.block.residual_droppath_prob > 0:
                raise ConfigError(
                    f"StackedTransformerConfig.block.residual_droppath_prob={self.block.residual_droppath_prob} is not "
                    "supported with pipeline (its stages do not carry the per-layer schedule); set it to 0 or turn "
                    "the pipeline off."
                )
            if not self.repeat:
                raise ConfigError(
                    "StackedTransformerConfig.pipeline needs repeat=True: the stages are slices of the stacked "
                    "[num_layers, ...] weights."
                )
            if self.pipeline.remat_stage and self.remat_policy == "none":
                raise ConfigError(
                    "StackedTransformerConfig.pipeline.remat_stage=True has no effect with remat_policy='none' "
                    "(nothing is rematerialised); choose a remat_policy or set remat_stage=False."
                )
            num_blocks = self.num_layers // self.block_size
            self.pipeline.check(num_units=num_blocks, prefix="StackedTransformerConfig.pipeline")
            per_stage = num_blocks // self.pipeline.num_chunks
            if self.unroll > per_stage:
                raise ConfigError(
                    f"StackedTransformerConfig.unroll={self.unroll} is more than the {per_stage} layers each pipeline "
                    f"stage scans (num_layers={self.num_layers} / (pipeline.num_stages={self.pipeline.num_stages} x "
                    f"circular_repeat={self.pipeline.circular_repeat})); lower unroll."
                )

    def droppath_schedule(self) -> tuple[float, ...]:
        """Each layer's drop-path probability: block.residual_droppath_prob * i / num_layers for
        layer i, Praxis' StackedTransformer schedule (deeper layers are dropped more often)."""
        p = self.block.residual_droppath_prob
        return tuple(p * i / self.num_layers for i in range(self.num_layers))

    @property
    def block_size(self) -> int:
        """Layers per scanned block: the least common multiple of moe_layer_interval (with MoE)
        and global_layer_interval (when set); 1 when every layer is alike."""
        return math.lcm(1 if self.moe is None else self.moe_layer_interval, self.global_layer_interval or 1)

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer i has the MoE feed-forward (i % moe_layer_interval == 0)."""
        return self.moe is not None and i % self.moe_layer_interval == 0

    def is_global_layer(self, i: int) -> bool:
        """Whether layer i attends globally whatever block.attention's window ((i + 1) %
        global_layer_interval == 0; every layer's window is the block's when the interval is 0)."""
        return self.global_layer_interval > 0 and (i + 1) % self.global_layer_interval == 0

    def build(self, key: PRNGKeyArray) -> StackedTransformer | StackedTransformerRepeated | SharedLayerStack:
        if self.share_layers:
            return SharedLayerStack(self, key=key)
        cls = StackedTransformerRepeated if self.repeat else StackedTransformer
        return cls(self, key=key)

    def build_layer(self, key: PRNGKeyArray, index: int = 0) -> Transformer:
        """Layer `index` of the stack (or of any block: the pattern repeats every block_size
        layers), with the stack's sizes and init: MoE or dense, windowed or global by its index."""
        moe = self.is_moe_layer(index)
        hidden = (self.moe_hidden_dims or self.hidden_dims) if moe else self.hidden_dims
        block = self.block
        if self.is_global_layer(index):
            block = block.replace(attention=block.attention.replace(window=GlobalWindowConfig()))
        return block.build(
            key, model_dims=self.model_dims, hidden_dims=hidden, num_heads=self.num_heads,
            dim_per_head=self.dim_per_head, num_kv_heads=self.num_kv_heads, init=self.init,
            use_rotary=self.use_rotary, cross_attention=self.cross_attention, moe=self.moe if moe else None,
            fold_padding_with_segment_mask=self.fold_padding_with_segment_mask, relative_bias=self.relative_bias,
        )  # fmt: skip


class StackedTransformer(eqx.Module):
    """A tuple of independent Transformer layers, applied in order. Caches (and memory keys and
    values) are tuples with one entry per layer."""

    layers: tuple[Transformer, ...]
    remat_policy: str = eqx.field(static=True)
    droppath_schedule: tuple[float, ...] = eqx.field(static=True)

    def __init__(self, cfg: StackedTransformerConfig, *, key: PRNGKeyArray):
        keys = jax.random.split(key, cfg.num_layers)
        self.layers = tuple(cfg.build_layer(k, i) for i, k in enumerate(keys))
        self.remat_policy = cfg.remat_policy
        self.droppath_schedule = cfg.droppath_schedule()

    def __call__(self, x: Float[Array, "batch time embed"], ctx: Context, **kwargs) -> tuple[Array, Context]:
        """Every layer in turn; `kwargs` (segment_ids, segment_pos, paddings, bias, memory,
        memory_paddings) go to each as Transformer.__call__'s."""
        for i, layer in enumerate(self.layers):
            extra = {"droppath_prob": self.droppath_schedule[i]} if any(self.droppath_schedule) else {}
            fn = lambda layer, x, ctx, extra=extra: layer(x, ctx, **extra, **kwargs)
            if self.remat_policy != "none":
                fn = eqx.filter_checkpoint(fn, policy=REMAT_POLICIES[self.remat_policy])
            x, ctx = fn(layer, x, ctx.push(f"x_layers_{i}"))
            ctx = ctx.pop()
        return x, ctx

    def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> tuple[KVCache, ...]:
        return tuple(layer.attention.init_cache(batch, max_len, dtype) for layer in self.layers)

    def decode(
        self,
        x: Float[Array, "batch new embed"],
        caches: tuple[KVCache, ...],
        start: Int[Array, ""] | Int[Array, " batch"],
        positions: Int[Array, "batch new"],
        key_valid: Bool[Array, "batch max_len"],
        *,
        bias: Float[Array, "#batch #heads new max_len"] | None = None,
        memory_kv: tuple[KVCache, ...] | None = None,
        memory_valid: Bool[Array, "batch memory"] | None = None,
    ) -> tuple[Float[Array, "batch new embed"], tuple[KVCache, ...]]:
        """Every layer's Transformer.decode; memory_kv: `project_memory`'s, one per layer."""
        new = []
        memory_kv = (None,) * len(self.layers) if memory_kv is None else memory_kv
        for layer, cache, layer_memory in zip(self.layers, caches, memory_kv, strict=True):
            x, cache = layer.decode(
                x, cache, start, positions, key_valid, bias=bias, memory_kv=layer_memory, memory_valid=memory_valid
            )
            new.append(cache)
        return x, tuple(new)

    def project_memory(self, memory: Float[Array, "batch memory embed"]) -> tuple[KVCache, ...]:
        """Each layer's cross-attention keys/values of `memory`, computed once for decoding."""
        require_cross_attention(self.layers[0])
        return tuple(layer.cross_attention.project_memory(memory) for layer in self.layers)

    def select_cache(self, cache: typing.Any, rows: Int[Array, " n"]) -> typing.Any:
        """The batch rows `rows` of a cache in this stack's layout (a tuple per layer, batch
        first): self-attention caches and memory keys/values alike."""
        return take_rows(cache, rows, axis=0)

    def write_cache_rows(self, cache: typing.Any, rows: Int[Array, " n"], values: typing.Any) -> typing.Any:
        """`cache` with batch rows `rows` replaced by `values` (`select_cache`'s layout): a
        request prefilled alone, written into its decode slot of a server's cache."""
        return put_rows(cache, rows, values, axis=0)
