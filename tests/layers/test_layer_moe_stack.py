"""MoE in Transformer stacks: scanned blocks == list with the same weights (outputs, gradients,
side outputs), aux losses summed over the MoE layers, decode == forward, the interval checks."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from layer_reference import jit, key, random_normal
from tolerances import assert_same_math, assert_same_math_tree

from pax_eqx.config import ConfigError
from pax_eqx.layers import (
    AttentionConfig,
    Mode,
    MoEFeedForward,
    MoEFeedForwardConfig,
    StackedTransformer,
    StackedTransformerConfig,
    TransformerConfig,
    apply,
)
from pax_eqx.layers.scanned_stack import draws_randomness

B, T, D, L, E = 2, 6, 8, 4, 4


def _cfg(interval: int, repeat: bool, **moe_kw) -> StackedTransformerConfig:
    block = TransformerConfig(attention=AttentionConfig(implementation="xla"))
    moe = MoEFeedForwardConfig(num_experts=E, **moe_kw)
    return StackedTransformerConfig(
        num_layers=L, model_dims=D, hidden_dims=16, num_heads=2, block=block, repeat=repeat, moe=moe,
        moe_layer_interval=interval, moe_hidden_dims=12,
    )  # fmt: skip


@functools.cache
def _stacks(interval: int, **moe_kw):
    """(scanned, list) stacks holding the same weights layer by layer (the list's sliced from the
    scanned one's: vmapped init draws other numbers than per-layer init from the same keys)."""
    rep = _cfg(interval, True, **moe_kw).build(key(0))
    block = rep.layers if isinstance(rep.layers, tuple) else (rep.layers,)
    k = len(block)
    layers = tuple(jax.tree.map(lambda a, i=i: a[i // k], block[i % k]) for i in range(L))
    lst = eqx.filter_eval_shape(_cfg(interval, False, **moe_kw).build, jax.random.key(0))
    return rep, eqx.tree_at(lambda s: s.layers, lst, layers)


def _run(stack, x):
    def loss(stack):
        y, ctx = apply(stack, x, mode=Mode.TRAIN, mutable=True)
        return jnp.sum(y**2) + sum(ctx.aux_losses.values()), (y, ctx.summaries, ctx.aux_losses)

    (_, out), grads = eqx.filter_value_and_grad(loss, has_aux=True)(stack)
    return out, grads


_run_jit = jit(_run)


def _layer_grads(stack, grads) -> list:
    """The list stack's gradients per layer, or the scanned stack's sliced into layers in order."""
    if isinstance(stack, StackedTransformer):
        return list(grads.layers)
    block = grads.layers if isinstance(grads.layers, tuple) else (grads.layers,)
    k = len(block)
    return [jax.tree.map(lambda a, i=i: a[i // k], block[i % k]) for i in range(L)]


@pytest.mark.parametrize("interval", [1, 2])
def test_scanned_blocks_equal_the_list_stack(interval):
    rep, lst = _stacks(interval)
    moe_layers = [i for i in range(L) if i % interval == 0]
    assert [lst.layers[i].moe is not None for i in range(L)] == [i in moe_layers for i in range(L)]
    assert all(layer.ff_in is None and layer.ff_out_bias is None for layer in lst.layers if layer.moe is not None)
    assert lst.layers[moe_layers[0]].moe.wi.shape == (E, D, 12)  # moe_hidden_dims
    x = random_normal((B, T, D), 1)
    (y_rep, s_rep, a_rep), g_rep = _run_jit(rep, x)
    (y_lst, s_lst, a_lst), g_lst = _run_jit(lst, x)
    assert_same_math(y_rep, y_lst)
    for i, (gr, gl) in enumerate(zip(_layer_grads(rep, g_rep), _layer_grads(lst, g_lst), strict=True)):
        assert_same_math_tree(gr, gl, rtol=1e-4, err_msg=f"layer {i}")
    # Aux losses: the scanned stack's is the sum over the MoE layers of the list stack's.
    per_layer = [a_lst[f"x_layers_{i}/moe/load_balance_loss"] for i in moe_layers]
    assert set(a_lst) == {f"x_layers_{i}/moe/load_balance_loss" for i in moe_layers}
    assert_same_math(a_rep["repeat/moe/load_balance_loss"], sum(per_layer))
    # Summaries: one entry per layer that records it, in layer order.
    load = s_rep["repeat/moe/expert_load_e0"]
    assert load.shape == (len(moe_layers),)
    assert_same_math(load, [s_lst[f"x_layers_{i}/moe/expert_load_e0"] for i in moe_layers])
    assert {f"repeat/moe/expert_load_e{e}" for e in range(E)} <= set(s_rep)
    assert {"repeat/moe/dropped_fraction", "repeat/moe/router_entropy"} <= set(s_rep)


@pytest.mark.parametrize("interval", [1, 2])
def test_moe_stack_decode_equals_forward(interval):
    # Dropless: a decode step routes a group of 1 token and the forward a group of T, so with a
    # capacity the two could drop different tokens; without one they compute the same thing.
    rep, lst = _stacks(interval, dropless=True)
    x = random_normal((B, T, D), 2)

    @jit
    def prefill_then_step(stack, x):
        caches = stack.init_cache(B, T)
        pos = jnp.broadcast_to(jnp.arange(T), (B, T))
        valid = jnp.ones((B, T), bool)
        out, caches = stack.decode(x[:, :2], caches, jnp.int32(0), pos[:, :2], valid)
        outs = [out]
        for t in range(2, T):
            out, caches = stack.decode(x[:, t : t + 1], caches, jnp.int32(t), pos[:, t : t + 1], valid)
            outs.append(out)
        return jnp.concatenate(outs, 1), caches

    forward = jit(lambda s, x: apply(s, x, mode=Mode.EVAL))
    got_rep, cache_rep = prefill_then_step(rep, x)
    got_lst, cache_lst = prefill_then_step(lst, x)
    assert_same_math(got_rep, forward(rep, x))
    assert_same_math(got_lst, got_rep)
    assert cache_rep.k.shape == (L, B, T, 2, 4)  # one cache per layer, in layer order
    for i in range(L):
        assert_same_math(cache_rep.k[i], cache_lst[i].k)
    rows = jnp.asarray([1, 0])
    np.testing.assert_array_equal(rep.select_cache(cache_rep, rows).k[:, 0], cache_rep.k[:, 1])


def test_interval_must_divide_num_layers_and_needs_moe():
    with pytest.raises(ConfigError, match="num_layers=4 is not a multiple of moe_layer_interval=3"):
        _cfg(3, True)
    with pytest.raises(ConfigError, match="moe_layer_interval=2 / moe_hidden_dims=0 have no effect without moe"):
        StackedTransformerConfig(num_layers=4, model_dims=D, hidden_dims=16, num_heads=2, moe_layer_interval=2)


def testdraws_randomness_when_routing_is_random():
    block = TransformerConfig()
    assert not draws_randomness(block, MoEFeedForwardConfig())
    assert draws_randomness(block, MoEFeedForwardConfig(jitter_eps=0.01))
    assert draws_randomness(block, MoEFeedForwardConfig(second_expert_policy="sampling"))
    rep = eqx.filter_eval_shape(_cfg(2, True, jitter_eps=0.01).build, jax.random.key(0))
    assert rep.needs_key and isinstance(rep.layers[0].moe, MoEFeedForward) and rep.layers[1].moe is None
