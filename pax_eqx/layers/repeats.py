"""Stacks of Transformer layers: a Python list, or weights stacked and applied with `lax.scan`.

`StackedTransformerConfig(repeat=False)` builds `StackedTransformer` (Praxis
StackedTransformer): one module per layer, traced once per layer -- compile time grows with
depth, XLA sees every layer. `repeat=True` builds `StackedTransformerRepeated` (Praxis
StackedTransformerRepeated / `Repeat`): every array gets a leading `layers` axis (built with
`filter_vmap`, the equinox scan-over-layers recipe), and the forward is one `lax.scan`
whose body is traced once. `unroll` trades compile time for speed (DESIGN.md §5: fully
unrolled was ~5 MFU points faster for GPT3-XL); `remat_policy` names a
`jax.checkpoint_policies` policy applied to each layer.

Side outputs of a scanned layer come back stacked: summaries get a leading [num_layers]
axis, aux losses are summed over layers, non-trainable state is sliced per layer and
re-stacked.

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
(Praxis' MoELarge). The scanned stack then scans over *blocks* of moe_layer_interval layers
(one MoE layer followed by interval - 1 dense ones, each a module vmapped over the
num_layers / interval blocks, so its `layers` field is a tuple of them), the body -- one whole
block -- traced once and rematerialised as a whole. Its caches stay one per layer, in layer
order ([num_layers, ...]); summaries come back with one entry per layer that records them, in
layer order (a dense-and-MoE summary such as attention's [num_layers], an MoE-only one such as
`moe/expert_load_e0` [num_layers / interval]); aux losses are summed over every layer, so the
load-balancing losses of all MoE layers add up (as in Praxis: GLaM configs divide the weight
themselves if they want a mean).

Pipelining (`pipeline`, layers.pipeline): the scanned stack's layers (or blocks) are cut into
stages over the mesh's `stage` axis and the batch into microbatches; each stage scans its own
layers with the same body as the unpipelined scan, so the weights, checkpoints, summaries and
aux losses are the same arrays either way. Decoding (`decode`) runs the layers unpipelined.
"""

from __future__ import annotations

import typing
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, check_range, config
from pax_eqx.layers.attentions import KVCache
from pax_eqx.layers.base import Context, copy_state
from pax_eqx.layers.initializers import WeightInit
from pax_eqx.layers.moe import MoEFeedForwardConfig
from pax_eqx.layers.pipeline import PipelineConfig, run_pipeline
from pax_eqx.layers.transformers import Transformer, TransformerConfig

RematPolicy = Literal[
    "none",
    "full",
    "dots_saveable",
    "dots_with_no_batch_dims_saveable",
    "dots_with_no_batch_dims_and_context",
    "save_context_and_out_proj",
    "save_qkv_context_and_out_proj",
    "everything_saveable",
]

_cp = jax.checkpoint_policies
# What each layer keeps for the backward pass; everything else is recomputed. The named ones
# use the activation names the attention layer tags (Praxis' checkpoint_policy.py):
#   save_context_and_out_proj     = Pax SAVE_CONTEXT_AND_OUT_PROJ
#   save_qkv_context_and_out_proj = Pax SAVE_DOT_FOR_MLPERF_200B
#   dots_with_no_batch_dims_and_context: every weight matmul plus the attention output, and,
#     for cuDNN's fused attention, everything its forward kernel returns (the output and the
#     softmax statistics its backward kernel reads), so that kernel never runs again in the
#     backward. Saving the named output alone is not enough: the statistics are a residual
#     of jax's custom VJP, not a named activation, and rebuilding them re-ran the kernel.


def _fused_attention_forward(prim, *_, **__) -> bool:
    """Save the outputs of jax's cuDNN attention forward primitive (output + statistics)."""
    return prim.name in ("dot_product_attention_fwd_wrapper", "dot_product_attention_fp8_fwd_wrapper")


_POLICIES = {
    "full": _cp.nothing_saveable,
    "dots_saveable": _cp.dots_saveable,
    "dots_with_no_batch_dims_saveable": _cp.dots_with_no_batch_dims_saveable,
    "dots_with_no_batch_dims_and_context": _cp.save_from_both_policies(
        _cp.save_from_both_policies(_cp.dots_with_no_batch_dims_saveable, _cp.save_only_these_names("context")),
        _fused_attention_forward,
    ),
    "save_context_and_out_proj": _cp.save_only_these_names("context", "out_proj"),
    "save_qkv_context_and_out_proj": _cp.save_only_these_names(
        "combined_qkv_proj", "query_proj", "key_proj", "value_proj", "context", "out_proj"
    ),
    "everything_saveable": _cp.everything_saveable,
}


@config
class StackedTransformerConfig(Config):
    """num_layers copies of `block`, the layer template, built at the sizes given here.

    A stack is built directly (by a model, or by a user composing layers), never held as another
    config's template, so its sizes are its own fields and it passes them to `block.build`.

    model_dims / hidden_dims / num_heads: each layer's width, feed-forward width and query heads.
    dim_per_head: 0 = model_dims // num_heads. num_kv_heads: 0 = num_heads (see AttentionConfig.build).
    use_rotary: rotary position embedding in every attention layer.
    cross_attention: every layer also attends to a `memory` (an encoder-decoder's decoder).
    init: every projection's weight init.
    repeat: stack weights on a leading `layers` axis and scan (True) or keep a list (False).
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
    """

    num_layers: int
    model_dims: int
    hidden_dims: int
    num_heads: int
    dim_per_head: int = 0
    num_kv_heads: int = 0
    use_rotary: bool = False
    cross_attention: bool = False
    init: WeightInit = WeightInit()
    block: TransformerConfig = TransformerConfig()
    repeat: bool = True
    remat_policy: RematPolicy = "none"
    unroll: int = 1
    moe: MoEFeedForwardConfig | None = None
    moe_layer_interval: int = 1
    moe_hidden_dims: int = 0
    pipeline: PipelineConfig = PipelineConfig()
    fold_padding_with_segment_mask: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix (the attention's head
        arithmetic is checked where it is used, by AttentionConfig.build)."""
        check_range(self, ("num_layers", "model_dims", "hidden_dims", "num_heads"), ge=1)
        check_range(self, ("dim_per_head", "num_kv_heads"), ge=0, note="0 = its default")
        check_range(self, "unroll", ge=1)
        if self.remat_policy != "none" and self.remat_policy not in _POLICIES:
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

        if self.pipeline.enabled:
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

    @property
    def block_size(self) -> int:
        """Layers per scanned block: moe_layer_interval with MoE, else 1."""
        return 1 if self.moe is None else self.moe_layer_interval

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer i has the MoE feed-forward (i % moe_layer_interval == 0)."""
        return self.moe is not None and i % self.moe_layer_interval == 0

    def build(self, key: PRNGKeyArray) -> StackedTransformer | StackedTransformerRepeated:
        cls = StackedTransformerRepeated if self.repeat else StackedTransformer
        return cls(self, key=key)

    def build_layer(self, key: PRNGKeyArray, moe: bool = False) -> Transformer:
        """One layer of the stack, with the stack's sizes and init; moe: with the MoE feed-forward."""
        hidden = (self.moe_hidden_dims or self.hidden_dims) if moe else self.hidden_dims
        return self.block.build(
            key, model_dims=self.model_dims, hidden_dims=hidden, num_heads=self.num_heads,
            dim_per_head=self.dim_per_head, num_kv_heads=self.num_kv_heads, init=self.init,
            use_rotary=self.use_rotary, cross_attention=self.cross_attention, moe=self.moe if moe else None,
            fold_padding_with_segment_mask=self.fold_padding_with_segment_mask,
        )  # fmt: skip


def _needs_key(block: TransformerConfig, moe: MoEFeedForwardConfig | None = None) -> bool:
    moe_random = moe is not None and (moe.jitter_eps > 0 or moe.second_expert_policy == "sampling")
    return moe_random or max(block.residual_dropout_prob, block.relu_dropout_prob, block.attention.dropout_prob) > 0


def _remat(fn, policy: str, prevent_cse: bool = True):
    return fn if policy == "none" else jax.checkpoint(fn, policy=_POLICIES[policy], prevent_cse=prevent_cse)


class StackedTransformer(eqx.Module):
    """A tuple of independent Transformer layers, applied in order. Caches (and memory keys and
    values) are tuples with one entry per layer."""

    layers: tuple[Transformer, ...]
    remat_policy: str = eqx.field(static=True)

    def __init__(self, cfg: StackedTransformerConfig, *, key: PRNGKeyArray):
        keys = jax.random.split(key, cfg.num_layers)
        self.layers = tuple(cfg.build_layer(k, cfg.is_moe_layer(i)) for i, k in enumerate(keys))
        self.remat_policy = cfg.remat_policy

    def __call__(self, x: Float[Array, "batch time embed"], ctx: Context, **kwargs) -> tuple[Array, Context]:
        """Every layer in turn; `kwargs` (segment_ids, segment_pos, paddings, bias, memory,
        memory_paddings) go to each as Transformer.__call__'s."""
        for i, layer in enumerate(self.layers):
            fn = lambda layer, x, ctx: layer(x, ctx, **kwargs)
            if self.remat_policy != "none":
                fn = eqx.filter_checkpoint(fn, policy=_POLICIES[self.remat_policy])
            x, ctx = fn(layer, x, ctx.push(f"x_layers_{i}"))
            ctx = ctx.pop()
        return x, ctx

    def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> tuple[KVCache, ...]:
        return tuple(layer.attention.init_cache(batch, max_len, dtype) for layer in self.layers)

    def decode(
        self,
        x: Float[Array, "batch new embed"],
        caches: tuple[KVCache, ...],
        start: Int[Array, ""],
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
        _require_cross_attention(self.layers[0])
        return tuple(layer.cross_attention.project_memory(memory) for layer in self.layers)

    def select_cache(self, cache: typing.Any, rows: Int[Array, " n"]) -> typing.Any:
        """The batch rows `rows` of a cache in this stack's layout (a tuple per layer, batch
        first): self-attention caches and memory keys/values alike."""
        return jax.tree.map(lambda a: jnp.take(a, rows, axis=0), cache)


class StackedTransformerRepeated(eqx.Module):
    """One Transformer whose arrays all carry a leading [num_layers] axis, applied by scan; with
    MoE every moe_layer_interval > 1 layers, a tuple of moe_layer_interval such Transformers (the
    block's MoE layer, then its dense ones) with a leading [num_layers / interval] axis."""

    layers: typing.Any  # Transformer, or a tuple of them (MoE blocks)
    num_layers: int = eqx.field(static=True)
    remat_policy: str = eqx.field(static=True)
    unroll: int = eqx.field(static=True)
    needs_key: bool = eqx.field(static=True)
    pipeline: PipelineConfig = eqx.field(static=True)
    # The logical-axis walker (pax_eqx.sharding.logical) prepends "layers" below this field.
    stacked_field = "layers"

    def __init__(self, cfg: StackedTransformerConfig, *, key: PRNGKeyArray):
        keys = jax.random.split(key, cfg.num_layers)
        k = cfg.block_size
        if k == 1:
            self.layers = eqx.filter_vmap(lambda layer_key: cfg.build_layer(layer_key, cfg.moe is not None))(keys)
        else:
            # Layer i = block i // k, position i % k: the same keys as the list stack's layers.
            keys = keys.reshape(cfg.num_layers // k, k, *keys.shape[1:])  # typed or raw uint32 keys
            self.layers = tuple(
                eqx.filter_vmap(lambda layer_key, j=j: cfg.build_layer(layer_key, cfg.is_moe_layer(j)))(keys[:, j])
                for j in range(k)
            )
        self.num_layers = cfg.num_layers
        self.remat_policy = cfg.remat_policy
        self.unroll = cfg.unroll
        self.needs_key = _needs_key(cfg.block, cfg.moe)
        self.pipeline = cfg.pipeline

    @property
    def block(self) -> tuple:
        """The scanned block's layers (one, or moe_layer_interval), each with a leading axis."""
        return self.layers if isinstance(self.layers, tuple) else (self.layers,)

    @property
    def num_blocks(self) -> int:
        return self.num_layers // len(self.block)

    def __call__(self, x: Float[Array, "batch time embed"], ctx: Context, **kwargs) -> tuple[Array, Context]:
        """One scan over the layers (or blocks), or the pipeline's schedule of them; `kwargs`
        (segment_ids, segment_pos, paddings, bias, memory, memory_paddings) are the same for
        every layer, so the body closes over them."""
        params, static = eqx.partition(self.layers, eqx.is_array)
        state = None if ctx.state is None else ctx.state.substate(self.layers)
        key = None
        if self.needs_key and ctx.is_training:
            key, ctx = ctx.next_key()
        if self.pipeline.enabled:
            x, summaries, aux = self._pipelined(params, static, x, key, state, ctx, kwargs)
        else:
            keys = None if key is None else jax.random.split(key, self.num_blocks)
            body = self._body(static, ctx, kwargs)
            # Inside a rolled scan XLA cannot CSE the recomputation into the forward, so jax's
            # CSE barriers would only block fusion (measurably slower on GPU); a fully unrolled
            # scan has no loop to protect it, so there they stay.
            body = _remat(body, self.remat_policy, prevent_cse=self.unroll >= self.num_blocks)
            x, (state, summaries, aux) = jax.lax.scan(body, x, (params, keys, state), unroll=self.unroll)
            aux = {name: jnp.sum(value) for name, value in aux.items()}
            if state is not None:
                ctx = ctx._replace(state=copy_state(ctx.state).update(state))
        if len(self.block) > 1:  # [blocks, layers of the block that record it, ...] -> one entry per layer
            summaries = {n: v.reshape(-1, *v.shape[2:]) for n, v in summaries.items()}
        ctx = ctx.push("repeat")
        for name, value in summaries.items():
            ctx = ctx.add_summary(name, value, verbosity=0)  # filtered inside the body already
        for name, value in aux.items():
            ctx = ctx.add_aux_loss(name, value)
        return x, ctx.pop()

    def _body(self, static: typing.Any, outer: Context, kwargs: dict) -> typing.Callable:
        """The scan body over blocks: (h, (block params, key, state)) -> (h, (state, summaries,
        aux losses)), each layer run in a fresh Context of `outer`'s mode and dtype."""
        k = len(self.block)

        def run(layer, h, key, layer_state):
            inner = Context(
                key=key, state=layer_state, mode=outer.mode, dtype=outer.dtype,
                summary_verbosity=outer.summary_verbosity,
            )  # fmt: skip
            h, inner = layer(h, inner, **kwargs)
            return h, inner

        def body(h, xs):
            layer_params, key, layer_state = xs
            layers = eqx.combine(layer_params, static)
            if k == 1:
                h, inner = run(layers, h, key, layer_state)
                return h, (inner.state, inner.summaries, inner.aux_losses)
            sub_keys = (None,) * k if key is None else tuple(jax.random.split(key, k))
            summaries, aux = {}, {}
            for layer, sub_key in zip(layers, sub_keys, strict=True):
                h, inner = run(layer, h, sub_key, layer_state)
                layer_state = inner.state
                for name, value in inner.summaries.items():
                    summaries.setdefault(name, []).append(value)
                for name, value in inner.aux_losses.items():
                    aux[name] = aux[name] + value if name in aux else value
            return h, (layer_state, {n: jnp.stack(v) for n, v in summaries.items()}, aux)

        return body

    def _pipelined(self, params, static, x, key, state, ctx: Context, kwargs: dict):
        """The layers as `self.pipeline` schedules them (layers.pipeline): each stage scans its
        own blocks with the same body; per-example kwargs travel with their microbatch."""
        if state is not None and jax.tree.leaves(state):
            raise ValueError("a pipelined stack cannot carry non-trainable state (its layers have none today).")
        shared = {n: kwargs[n] for n in ("bias", "memory", "memory_paddings") if kwargs.get(n) is not None}
        if shared:
            raise ValueError(
                f"a pipelined stack takes no {sorted(shared)}: only decoder-only language models are pipelined."
            )
        per_example = {n: v for n, v in kwargs.items() if v is not None}

        # The remat policy applies to each layer, or (remat_stage) to each stage's iteration whole.
        per_stage = self.pipeline.remat_stage
        layer_policy, stage_policy = ("none", self.remat_policy) if per_stage else (self.remat_policy, "none")

        def stage(stage_params, h, stage_inputs, stage_key):
            n = jax.tree.leaves(stage_params)[0].shape[0]
            keys = None if stage_key is None else jax.random.split(stage_key, n)
            body = _remat(self._body(static, ctx, stage_inputs), layer_policy, prevent_cse=False)
            h, (_, summaries, aux) = jax.lax.scan(body, h, (stage_params, keys, None), unroll=self.unroll)
            return h, summaries, {name: jnp.sum(value) for name, value in aux.items()}

        return run_pipeline(_remat(stage, stage_policy, prevent_cse=False), params, x, per_example, key, self.pipeline)

    def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> KVCache:
        attention = self.block[0].attention
        shape = (self.num_layers, batch, max_len, attention.num_kv_heads, attention.head_dim)
        return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    def decode(
        self,
        x: Float[Array, "batch new embed"],
        caches: KVCache,
        start: Int[Array, ""],
        positions: Int[Array, "batch new"],
        key_valid: Bool[Array, "batch max_len"],
        *,
        bias: Float[Array, "#batch #heads new max_len"] | None = None,
        memory_kv: KVCache | None = None,
        memory_valid: Bool[Array, "batch memory"] | None = None,
    ) -> tuple[Float[Array, "batch new embed"], KVCache]:
        """Every layer's Transformer.decode, by scan: the caches and memory_kv (`project_memory`'s)
        have a leading [num_layers] axis and are sliced per layer (per block of layers with MoE
        every moe_layer_interval > 1 layers); bias and memory_valid are shared."""
        params, static = eqx.partition(self.layers, eqx.is_array)
        k = len(self.block)

        def decode_one(layer, h, cache, layer_memory):
            return layer.decode(
                h, cache, start, positions, key_valid, bias=bias, memory_kv=layer_memory, memory_valid=memory_valid
            )

        if k == 1:

            def body(h, xs):
                layer_params, cache, layer_memory = xs
                return decode_one(eqx.combine(layer_params, static), h, cache, layer_memory)

            return jax.lax.scan(body, x, (params, caches, memory_kv))

        def body(h, xs):
            block_params, block_caches, block_memory = xs
            new = []
            for j, layer in enumerate(eqx.combine(block_params, static)):
                take = lambda tree, j=j: None if tree is None else jax.tree.map(lambda a: a[j], tree)
                h, cache = decode_one(layer, h, take(block_caches), take(block_memory))
                new.append(cache)
            return h, jax.tree.map(lambda *a: jnp.stack(a), *new)

        x, caches = jax.lax.scan(body, x, (params, self._to_blocks(caches), self._to_blocks(memory_kv)))
        return x, jax.tree.map(lambda a: a.reshape(self.num_layers, *a.shape[2:]), caches)

    def _to_blocks(self, tree: typing.Any) -> typing.Any:
        """[num_layers, ...] leaves -> [num_blocks, layers per block, ...] (layer order kept)."""
        k = len(self.block)
        return None if tree is None else jax.tree.map(lambda a: a.reshape(self.num_blocks, k, *a.shape[1:]), tree)

    def project_memory(self, memory: Float[Array, "batch memory embed"]) -> KVCache:
        """Every layer's cross-attention keys/values of `memory`, [num_layers, B, S, kv_heads,
        head_dim] each, computed once for decoding (one batched matmul over the layers)."""
        _require_cross_attention(self.block[0])
        project = lambda layer: eqx.filter_vmap(lambda a: a.project_memory(memory))(layer.cross_attention)
        per_position = [project(layer) for layer in self.block]
        if len(per_position) == 1:
            return per_position[0]
        stacked = jax.tree.map(lambda *a: jnp.stack(a, axis=1), *per_position)  # [blocks, k, ...]
        return jax.tree.map(lambda a: a.reshape(self.num_layers, *a.shape[2:]), stacked)

    def select_cache(self, cache: typing.Any, rows: Int[Array, " n"]) -> typing.Any:
        """The batch rows `rows` of a cache in this stack's layout (batch on axis 1, under the
        layers axis): self-attention caches and memory keys/values alike."""
        return jax.tree.map(lambda a: jnp.take(a, rows, axis=1), cache)


def _require_cross_attention(layer: Transformer) -> None:
    if layer.cross_attention is None:
        raise ValueError(
            "project_memory: this stack's layers have no cross-attention; build it with "
            "StackedTransformerConfig(cross_attention=True)."
        )
