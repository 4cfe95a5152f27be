"""The shared stack: one Transformer's weights applied num_layers times (ALBERT's cross-layer
parameter sharing; what `StackedTransformerConfig(share_layers=True)` builds).

The layer appears once in the model's pytree, so everything that walks the tree sees it once:
the checkpoint stores it once (`stack.layer.attention.w_q`, no layers axis), the optimizer
keeps one set of moments, the sharding rules place it once and the dry run counts it once.
Applying it num_layers times is ordinary function reuse, so its gradient is the sum of the
num_layers applications' gradients (what autodiff gives any closed-over array).

Rejected: `eqx.nn.Shared`. It ties leaves of *different* modules that exist separately in the
tree (one is replaced by the other at call time), which suits two modules with their own
structure sharing one array (an embedding and a softmax); here there is only one module. And
the alternative of broadcasting one layer's weights to a stacked [num_layers, ...] copy for
the repeated stack's scan would hold num_layers copies of the weights in the step's
temporaries; the scan body here closes over the one copy.

repeat=True applies the layer by `lax.scan` (its body traced once, rematerialised by
`remat_policy`, unrolled `unroll` iterations a loop step); repeat=False by a Python loop, each
application under its own scope `x_layers_<i>` as the list stack's. Every application has its
own key, drop-path probability (the stack's schedule) and KV cache: the caches keep a leading
[num_layers] axis, as the scanned stack's do, and so do the cross-attention memory keys and
values (the same arrays for every application, broadcast, so `select_cache` treats both
alike). No Mixture-of-Experts (a block of distinct layers) and no pipeline (stages of
distinct layers): the config refuses both.
"""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from pax_eqx.layers.attentions import KVCache, empty_cache, put_rows, take_rows
from pax_eqx.layers.base import Context
from pax_eqx.layers.remat import REMAT_POLICIES, remat
from pax_eqx.layers.scanned_stack import draws_randomness, require_cross_attention, run_layer
from pax_eqx.layers.transformers import Transformer

if TYPE_CHECKING:  # the config builds this stack (layers.repeats imports this module)
    from pax_eqx.layers.repeats import StackedTransformerConfig


class SharedLayerStack(eqx.Module):
    """`layer` applied `num_layers` times; see the module docstring."""

    layer: Transformer
    num_layers: int = eqx.field(static=True)
    scan: bool = eqx.field(static=True)
    remat_policy: str = eqx.field(static=True)
    unroll: int = eqx.field(static=True)
    needs_key: bool = eqx.field(static=True)
    droppath_schedule: tuple[float, ...] = eqx.field(static=True)

    def __init__(self, cfg: StackedTransformerConfig, *, key: PRNGKeyArray):
        # The unshared stacks' first layer, from the same key.
        self.layer = cfg.build_layer(jax.random.split(key, cfg.num_layers)[0])
        self.num_layers = cfg.num_layers
        self.scan = cfg.repeat
        self.remat_policy = cfg.remat_policy
        self.unroll = cfg.unroll
        self.needs_key = draws_randomness(cfg.block)
        self.droppath_schedule = cfg.droppath_schedule()

    def __call__(self, x: Float[Array, "batch time embed"], ctx: Context, **kwargs) -> tuple[Array, Context]:
        """The layer num_layers times; `kwargs` (segment_ids, segment_pos, paddings, bias, memory,
        memory_paddings) go to every application."""
        if not self.scan:
            return self._loop(x, ctx, kwargs)
        params, static = eqx.partition(self.layer, eqx.is_array)
        keys = None
        if self.needs_key and ctx.is_training:
            key, ctx = ctx.next_key()
            keys = jax.random.split(key, self.num_layers)
        droppath = jnp.asarray(self.droppath_schedule, jnp.float32) if any(self.droppath_schedule) else None

        def body(h, xs):
            key, p = xs
            layer = eqx.combine(params, static)  # the one copy, closed over
            h, inner = run_layer(layer, h, ctx, key, None, p, kwargs)
            return h, (inner.summaries, inner.aux_losses)

        body = remat(body, self.remat_policy, prevent_cse=self.unroll >= self.num_layers)
        x, (summaries, aux) = jax.lax.scan(body, x, (keys, droppath), length=self.num_layers, unroll=self.unroll)
        ctx = ctx.push("repeat")
        for name, value in summaries.items():
            ctx = ctx.add_summary(name, value, verbosity=0)  # filtered inside the body already
        for name, value in aux.items():
            ctx = ctx.add_aux_loss(name, jnp.sum(value))
        return x, ctx.pop()

    def _loop(self, x: Array, ctx: Context, kwargs: dict) -> tuple[Array, Context]:
        """repeat=False: a Python loop, each application scoped `x_layers_<i>` (the list stack's)."""
        for i, p in enumerate(self.droppath_schedule):
            extra = {"droppath_prob": p} if any(self.droppath_schedule) else {}
            fn = lambda layer, x, ctx, extra=extra: layer(x, ctx, **extra, **kwargs)
            if self.remat_policy != "none":
                fn = eqx.filter_checkpoint(fn, policy=REMAT_POLICIES[self.remat_policy])
            x, ctx = fn(self.layer, x, ctx.push(f"x_layers_{i}"))
            ctx = ctx.pop()
        return x, ctx

    # Decoding against caches ------------------------------------------------------------------
    def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> KVCache:
        """One KV cache per application: [num_layers, batch, max_len, kv_heads, head_dim]; rolling,
        of the window's slots, with a sliding window shorter than max_len (`attentions.empty_cache`)."""
        a = self.layer.attention
        return empty_cache((self.num_layers,), batch, max_len, a.num_kv_heads, a.head_dim, dtype, a.window)

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
        """The layer's Transformer.decode once per application, each against its own cache
        (and `project_memory`'s memory keys/values), by scan."""

        def body(h, xs):
            cache, layer_memory = xs
            return self.layer.decode(
                h, cache, start, positions, key_valid, bias=bias, memory_kv=layer_memory, memory_valid=memory_valid
            )

        return jax.lax.scan(body, x, (caches, memory_kv))

    def project_memory(self, memory: Float[Array, "batch memory embed"]) -> KVCache:
        """The cross-attention keys/values of `memory`, computed once and given a leading
        [num_layers] axis (every application attends to the same ones)."""
        require_cross_attention(self.layer)
        kv = self.layer.cross_attention.project_memory(memory)
        return jax.tree.map(lambda a: jnp.broadcast_to(a, (self.num_layers, *a.shape)), kv)

    def select_cache(self, cache: typing.Any, rows: Int[Array, " n"]) -> typing.Any:
        """The batch rows `rows` of a cache (batch on axis 1, under the applications axis)."""
        return take_rows(cache, rows, axis=1)

    def write_cache_rows(self, cache: typing.Any, rows: Int[Array, " n"], values: typing.Any) -> typing.Any:
        """`cache` with batch rows `rows` replaced by `values` (`select_cache`'s layout): a
        request prefilled alone, written into its decode slot of a server's cache."""
        return put_rows(cache, rows, values, axis=1)
