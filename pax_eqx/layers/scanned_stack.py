"""The scanned stack: StackedTransformerRepeated, one Transformer applied num_layers times by `lax.scan`.

What `StackedTransformerConfig(repeat=True)` (layers.repeats) builds, as Praxis'
StackedTransformerRepeated / `Repeat`: every array of the layer gets a leading [num_layers] axis
(built with `filter_vmap`, the equinox scan-over-layers recipe), and the forward is one
`lax.scan` whose body is traced once, rematerialised by the stack's `remat_policy`
(layers.remat) and unrolled `unroll` iterations a loop step.

Side outputs of a scanned layer come back stacked: summaries get a leading [num_layers]
axis, aux losses are summed over layers, non-trainable state is sliced per layer and
re-stacked.

With Mixture-of-Experts every moe_layer_interval > 1 layers the stack scans over *blocks* of
moe_layer_interval layers (one MoE layer followed by interval - 1 dense ones, each a module
vmapped over the num_layers / interval blocks, so its `layers` field is a tuple of them), the
body -- one whole block -- traced once and rematerialised as a whole. Its caches stay one per
layer, in layer order ([num_layers, ...]); summaries come back with one entry per layer that
records them, in layer order (a dense-and-MoE summary such as attention's [num_layers], an
MoE-only one such as `moe/expert_load_e0` [num_layers / interval]); aux losses are summed over
every layer, so the load-balancing losses of all MoE layers add up (as in Praxis: GLaM configs
divide the weight themselves if they want a mean).

The same blocks carry a local/global alternation (`global_layer_interval`, Gemma 2's): block
position j is built windowed or global by its index, and a stack with both MoE and the
alternation scans blocks of the least common multiple of the two intervals.

Pipelining (`pipeline`, layers.pipeline): the stack's layers (or blocks) are cut into stages
over the mesh's `stage` axis and the batch into microbatches; each stage scans its own layers
with the same body as the unpipelined scan, so the weights, checkpoints, summaries and aux
losses are the same arrays either way. Decoding (`decode`) runs the layers unpipelined, one
scan over caches with a leading [num_layers] axis.
"""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from pax_eqx.layers.attentions import KVCache, empty_cache, put_rows, take_rows
from pax_eqx.layers.base import Context, copy_state
from pax_eqx.layers.moe import MoEFeedForwardConfig
from pax_eqx.layers.pipeline import PipelineConfig, run_pipeline
from pax_eqx.layers.remat import remat
from pax_eqx.layers.transformers import Transformer, TransformerConfig

if TYPE_CHECKING:  # the config builds this stack (layers.repeats imports this module)
    from pax_eqx.layers.repeats import StackedTransformerConfig


def draws_randomness(block: TransformerConfig, moe: MoEFeedForwardConfig | None = None) -> bool:
    moe_random = moe is not None and (moe.jitter_eps > 0 or moe.second_expert_policy == "sampling")
    probs = block.residual_dropout_prob, block.relu_dropout_prob, block.attention.dropout_prob
    return moe_random or max(*probs, block.residual_droppath_prob) > 0


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
    droppath_schedule: tuple[float, ...] = eqx.field(static=True)  # all 0.0: no stochastic depth
    # The logical-axis walker (pax_eqx.sharding.logical) prepends "layers" below this field.
    stacked_field = "layers"

    def __init__(self, cfg: StackedTransformerConfig, *, key: PRNGKeyArray):
        keys = jax.random.split(key, cfg.num_layers)
        k = cfg.block_size
        if k == 1:
            self.layers = eqx.filter_vmap(lambda layer_key: cfg.build_layer(layer_key, 0))(keys)
        else:
            # Layer i = block i // k, position i % k: the same keys as the list stack's layers.
            keys = keys.reshape(cfg.num_layers // k, k, *keys.shape[1:])  # typed or raw uint32 keys
            self.layers = tuple(
                eqx.filter_vmap(lambda layer_key, j=j: cfg.build_layer(layer_key, j))(keys[:, j]) for j in range(k)
            )
        self.num_layers = cfg.num_layers
        self.remat_policy = cfg.remat_policy
        self.unroll = cfg.unroll
        self.needs_key = draws_randomness(cfg.block, cfg.moe)
        self.pipeline = cfg.pipeline
        self.droppath_schedule = cfg.droppath_schedule()

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
            droppath = None  # or each layer's probability, [blocks, layers of a block]
            if any(self.droppath_schedule):
                droppath = jnp.asarray(self.droppath_schedule, jnp.float32).reshape(self.num_blocks, -1)
            body = self._body(static, ctx, kwargs)
            # Inside a rolled scan XLA cannot CSE the recomputation into the forward, so jax's
            # CSE barriers would only block fusion (measurably slower on GPU); a fully unrolled
            # scan has no loop to protect it, so there they stay.
            body = remat(body, self.remat_policy, prevent_cse=self.unroll >= self.num_blocks)
            x, (state, summaries, aux) = jax.lax.scan(body, x, (params, keys, state, droppath), unroll=self.unroll)
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
        """The scan body over blocks: (h, (block params, key, state, drop-path probabilities or
        None)) -> (h, (state, summaries, aux losses)), each layer run in a fresh Context of
        `outer`'s mode and dtype."""
        k = len(self.block)
        run = lambda layer, h, key, state, droppath: run_layer(layer, h, outer, key, state, droppath, kwargs)

        def body(h, xs):
            layer_params, key, layer_state, droppath = xs
            droppath = (None,) * k if droppath is None else tuple(droppath[j] for j in range(k))
            layers = eqx.combine(layer_params, static)
            if k == 1:
                h, inner = run(layers, h, key, layer_state, droppath[0])
                return h, (inner.state, inner.summaries, inner.aux_losses)
            sub_keys = (None,) * k if key is None else tuple(jax.random.split(key, k))
            summaries, aux = {}, {}
            for layer, sub_key, layer_droppath in zip(layers, sub_keys, droppath, strict=True):
                h, inner = run(layer, h, sub_key, layer_state, layer_droppath)
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

        def stage(stage_params, round_, h, stage_inputs, stage_key):
            """stage_params: the stage's chunks [R, n, ...]; round_: the chunk this iteration runs."""
            n = jax.tree.leaves(stage_params)[0].shape[1]
            keys = None if stage_key is None else jax.random.split(stage_key, n)
            body = self._body(static, ctx, stage_inputs)
            if isinstance(round_, int):  # GPipe: one chunk, loop-invariant, scanned as the stack scans
                chunk = jax.tree.map(lambda a: a[round_], stage_params)
                scanned = remat(body, layer_policy, prevent_cse=False)
                h, (_, summaries, aux) = jax.lax.scan(scanned, h, (chunk, keys, None, None), unroll=self.unroll)
            else:  # circular: each layer slices its weights from the round's chunk inside its remat

                def from_round(h, xs):
                    j, key = xs
                    layer = jax.tree.map(lambda a: a[round_, j], stage_params)
                    return body(h, (layer, key, None, None))

                scanned = remat(from_round, layer_policy, prevent_cse=False)
                h, (_, summaries, aux) = jax.lax.scan(scanned, h, (jnp.arange(n), keys), unroll=self.unroll)
            return h, summaries, {name: jnp.sum(value) for name, value in aux.items()}

        return run_pipeline(remat(stage, stage_policy, prevent_cse=False), params, x, per_example, key, self.pipeline)

    def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> KVCache:
        """Every layer's cache, [num_layers, batch, slots, kv_heads, head_dim]: rolling, of the
        window's slots, when every layer has the same sliding window shorter than max_len
        (`attentions.empty_cache`); a stack alternating windowed and global layers keeps every
        layer's whole sequence (one array holds them all), its windowed layers masking by distance."""
        attention = self.block[0].attention
        windows = {layer.attention.window for layer in self.block}
        window = attention.window if len(windows) == 1 else (0, 0)
        lead = (self.num_layers,)
        return empty_cache(lead, batch, max_len, attention.num_kv_heads, attention.head_dim, dtype, window)

    def decode(
        self,
        x: Float[Array, "batch new embed"],
        caches: KVCache,
        start: Int[Array, ""] | Int[Array, " batch"],
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
        require_cross_attention(self.block[0])
        project = lambda layer: eqx.filter_vmap(lambda a: a.project_memory(memory))(layer.cross_attention)
        per_position = [project(layer) for layer in self.block]
        if len(per_position) == 1:
            return per_position[0]
        stacked = jax.tree.map(lambda *a: jnp.stack(a, axis=1), *per_position)  # [blocks, k, ...]
        return jax.tree.map(lambda a: a.reshape(self.num_layers, *a.shape[2:]), stacked)

    def select_cache(self, cache: typing.Any, rows: Int[Array, " n"]) -> typing.Any:
        """The batch rows `rows` of a cache in this stack's layout (batch on axis 1, under the
        layers axis): self-attention caches and memory keys/values alike."""
        return take_rows(cache, rows, axis=1)

    def write_cache_rows(self, cache: typing.Any, rows: Int[Array, " n"], values: typing.Any) -> typing.Any:
        """`cache` with batch rows `rows` replaced by `values` (`select_cache`'s layout): a
        request prefilled alone, written into its decode slot of a server's cache."""
        return put_rows(cache, rows, values, axis=1)


def run_layer(
    layer: eqx.Module,
    h: Float[Array, "batch time embed"],
    outer: Context,
    key: PRNGKeyArray | None,
    state: typing.Any,
    droppath: float | Array | None,
    kwargs: dict,
) -> tuple[Float[Array, "batch time embed"], Context]:
    """One layer of a scanned stack in a fresh Context of `outer`'s mode, dtype and verbosity
    (its key, state, drop-path probability its own): what a scan body runs per layer. droppath
    None: the stack has no stochastic depth, and the layer (any block a user stacks, not only a
    Transformer) is called without it."""
    inner = Context(
        key=key, state=state, mode=outer.mode, dtype=outer.dtype, summary_verbosity=outer.summary_verbosity
    )  # fmt: skip
    if droppath is not None:
        kwargs = {**kwargs, "droppath_prob": droppath}
    return layer(h, inner, **kwargs)


def require_cross_attention(layer: Transformer) -> None:
    """Either stack's `project_memory` check: its layers were built with cross-attention."""
    if layer.cross_attention is None:
        raise ValueError(
            "project_memory: this stack's layers have no cross-attention; build it with "
            "StackedTransformerConfig(cross_attention=True)."
        )
