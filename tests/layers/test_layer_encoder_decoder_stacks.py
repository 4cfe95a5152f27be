"""The stacks of an encoder-decoder: a bidirectional encoder with input padding; a decoder with
cross-attention whose token-at-a-time decoding (T5's relative bias, memory keys/values projected
once) equals its full forward; beam rows gathered from caches; scan == list with the same weights."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from layer_reference import jit, key, random_module, random_normal
from tolerances import assert_same_math, assert_same_math_tree

from pax_eqx.layers import (
    AttentionConfig,
    Context,
    KVCache,
    Mode,
    RelativePositionBiasConfig,
    StackedTransformer,
    StackedTransformerConfig,
    StackedTransformerRepeated,
    TransformerConfig,
    apply,
)
from pax_eqx.sharding.logical import logical_axes

B, T, S, D, N, L = 2, 4, 5, 8, 2, 2  # decoder length T, encoder (memory) length S
PADDINGS = jnp.asarray([[0, 0, 0, 1, 1], [0, 1, 0, 0, 0]], jnp.float32)  # of the encoder input / memory


def _cfg(causal=True, **kw):
    block = TransformerConfig(attention=AttentionConfig(implementation="xla", causal=causal))
    base = dict(num_layers=L, model_dims=D, hidden_dims=16, num_heads=N, num_kv_heads=1, block=block)
    return StackedTransformerConfig(**{**base, **kw})


def _with_layers(cfg: StackedTransformerConfig, layers):
    """The stack `cfg` builds, holding the given layers (no initialisation is run)."""
    return eqx.tree_at(lambda s: s.layers, eqx.filter_eval_shape(cfg.build, jax.random.key(0)), layers)


def _sliced(repeated: StackedTransformerRepeated) -> tuple:
    return tuple(jax.tree.map(lambda a, i=i: a[i], repeated.layers) for i in range(L))


@functools.cache
def _decoders() -> dict[str, StackedTransformer | StackedTransformerRepeated]:
    """The decoder stack (causal, cross-attention) as a scan and as a list, the same weights."""
    rep = random_module(_cfg(cross_attention=True), seed=0, scale=0.3)
    return {"repeated": rep, "list": _with_layers(_cfg(cross_attention=True, repeat=False), _sliced(rep))}


@functools.cache
def _relative_bias():
    cfg = RelativePositionBiasConfig(num_buckets=8, max_distance=16)
    return random_module(lambda k: cfg.build(k, num_heads=N, bidirectional=False), seed=3)


def _x(seed=1, t=T):
    return random_normal((B, t, D), seed)


@jit
def _fwd(stack, x, **kwargs):
    return apply(stack, x, mode=Mode.EVAL, **kwargs)


def test_built_decoder_has_cross_attention_in_every_layer():
    rep = eqx.filter_jit(_cfg(cross_attention=True).build)(key(0))  # one compile, not one per eager op
    cross = rep.layers.cross_attention
    assert cross.w_q.shape == (L, D, N, D // N) and cross.w_k.shape == (L, D, 1, D // N) and not cross.causal
    assert not np.allclose(cross.w_q[0], cross.w_q[1])  # each layer its own weights
    assert not np.allclose(cross.w_q[0], rep.layers.attention.w_q[0])  # and not the self-attention's
    axes = logical_axes(rep)  # every new weight is named; the stack prepends "layers"
    assert tuple(axes.layers.cross_attention.w_q) == ("layers", "embed", "heads", "kv")
    assert tuple(axes.layers.cross_attention_norm.scale) == ("layers", "embed")
    lst = eqx.filter_eval_shape(_cfg(cross_attention=True, repeat=False).build, jax.random.key(0))
    assert all(layer.cross_attention is not None for layer in lst.layers)
    assert eqx.filter_eval_shape(_cfg().build, jax.random.key(0)).layers.cross_attention is None


@pytest.mark.parametrize("repeat", [True, False], ids=["repeated", "list"])
def test_encoder_outputs_ignore_what_sits_at_padded_inputs(repeat):
    encoder = random_module(_cfg(causal=False, repeat=repeat), seed=4, scale=0.3)
    x = _x(t=S)
    y = _fwd(encoder, x, paddings=PADDINGS)
    noisy = jnp.where(PADDINGS[..., None] > 0.5, random_normal(x.shape, 9, scale=100.0), x)
    real = np.asarray(PADDINGS) < 0.5
    assert_same_math(np.asarray(_fwd(encoder, noisy, paddings=PADDINGS))[real], np.asarray(y)[real])
    # Bidirectional: the first position sees the ones after it (a causal stack's would not change).
    later = x.at[:, 1:].add(random_normal((B, S - 1, D), 8))
    assert not np.allclose(_fwd(encoder, later, paddings=PADDINGS)[:, 0], y[:, 0], atol=1e-3)


@pytest.mark.parametrize("stack_kind", ["repeated", "list"])
def test_decoding_token_by_token_equals_the_full_forward(stack_kind):
    """Prefill 2 tokens, then one at a time, each with the relative bias of its position against
    every cache slot and the memory's keys/values projected once: the full forward's outputs."""
    stack, rel_bias = _decoders()[stack_kind], _relative_bias()
    x, memory = _x(), _x(seed=2, t=S)
    max_len = T + 2  # slots past the decoded tokens are masked, whatever their bias

    @jit
    def decode(stack, rel_bias, x, memory):
        caches = stack.init_cache(B, max_len)
        memory_kv = stack.project_memory(memory)
        memory_valid = PADDINGS < 0.5
        slots = jnp.arange(max_len)[None]
        outs = []
        for start, new in [(0, 2)] + [(t, 1) for t in range(2, T)]:
            pos = jnp.broadcast_to(jnp.arange(start, start + new), (B, new))
            out, caches = stack.decode(
                x[:, start : start + new], caches, jnp.int32(start), pos, jnp.ones((B, max_len), bool),
                bias=rel_bias(pos[:1], slots), memory_kv=memory_kv, memory_valid=memory_valid,
            )  # fmt: skip
            outs.append(out)
        return jnp.concatenate(outs, 1)

    pos = jnp.arange(T)[None]
    full = _fwd(stack, x, bias=_relative_bias()(pos, pos), memory=memory, memory_paddings=PADDINGS)
    assert_same_math(decode(stack, rel_bias, x, memory), full)
    # The bias and the memory padding are used (else the test above would prove nothing about them).
    assert not np.allclose(_fwd(stack, x, memory=memory, memory_paddings=PADDINGS), full, atol=1e-3)
    assert not np.allclose(_fwd(stack, x, bias=_relative_bias()(pos, pos), memory=memory), full, atol=1e-3)


def test_project_memory_shapes():
    memory = jnp.zeros((B, S, D))
    rep, lst = _decoders()["repeated"], _decoders()["list"]
    kv = eqx.filter_eval_shape(rep.project_memory, memory)
    assert isinstance(kv, KVCache) and kv.k.shape == (L, B, S, 1, D // N)
    kvs = eqx.filter_eval_shape(lst.project_memory, memory)
    assert isinstance(kvs, tuple) and [c.v.shape for c in kvs] == [(B, S, 1, D // N)] * L
    plain = eqx.filter_eval_shape(_cfg().build, jax.random.key(0))
    with pytest.raises(ValueError, match="cross_attention=True"):
        plain.project_memory(memory)


@pytest.mark.parametrize("stack_kind", ["repeated", "list"])
def test_select_cache_gathers_batch_rows(stack_kind):
    """Beam search: reorder rows, and tile a batch into beams (rows repeated)."""
    stack = _decoders()[stack_kind]
    batch = 3
    cache = jax.tree.map(
        lambda a: random_normal(a.shape, 5), eqx.filter_eval_shape(stack.init_cache, batch, T)
    )  # fmt: skip
    memory_kv = jit(lambda s, m: s.project_memory(m))(stack, random_normal((batch, S, D), 6))
    batch_axis = 1 if stack_kind == "repeated" else 0
    select = jit(lambda s, c, r: s.select_cache(c, r))
    for rows in ([2, 0, 1], [0, 0, 1, 1, 2, 2], [1]):
        rows_arr = jnp.asarray(rows, jnp.int32)
        for tree in (cache, memory_kv):
            selected = select(stack, tree, rows_arr)
            assert jax.tree.structure(selected) == jax.tree.structure(tree)
            for got, full in zip(jax.tree.leaves(selected), jax.tree.leaves(tree), strict=True):
                np.testing.assert_array_equal(got, np.take(np.asarray(full), rows, axis=batch_axis))


def test_select_cache_then_decode_equals_decoding_the_selected_rows():
    """Decoding from gathered caches is decoding the gathered inputs (what reordering beams needs)."""
    stack = _decoders()["repeated"]
    x, memory = _x(), _x(seed=2, t=S)
    rows = jnp.asarray([1, 1, 0], jnp.int32)

    @jit
    def two_steps(stack, x, memory, rows):
        pos = jnp.zeros((x.shape[0], 1), jnp.int32)
        valid, memory_valid = jnp.ones((x.shape[0], T), bool), PADDINGS < 0.5
        memory_kv = stack.project_memory(memory)
        _, cache = stack.decode(x[:, :1], stack.init_cache(x.shape[0], T), jnp.int32(0), pos, valid,
                                memory_kv=memory_kv, memory_valid=memory_valid)  # fmt: skip
        cache, memory_kv = stack.select_cache(cache, rows), stack.select_cache(memory_kv, rows)
        x2 = x[rows, 1:2]
        out, _ = stack.decode(x2, cache, jnp.int32(1), pos[rows] + 1, valid[rows], memory_kv=memory_kv,
                              memory_valid=memory_valid[rows])  # fmt: skip
        return out

    full = _fwd(stack, x[rows], memory=memory[rows], memory_paddings=PADDINGS[rows])
    assert_same_math(two_steps(stack, x, memory, rows), full[:, 1:2])


@jit
def _grad(stack, x, memory, bias):
    """(outputs, gradients of sum(outputs^2) w.r.t. the stack and the memory) in one program."""

    def loss(stack_and_memory):
        stack, memory = stack_and_memory
        y = apply(stack, x, mode=Mode.EVAL, bias=bias, memory=memory, memory_paddings=PADDINGS)
        return jnp.sum(y**2), y

    (_, y), grads = eqx.filter_value_and_grad(loss, has_aux=True)((stack, memory))
    return y, grads


def test_repeated_equals_list_with_remat_outputs_and_gradients():
    """Scan == list, with and without remat (memory, bias and paddings closed over by the scan
    body): the same outputs, weight gradients and gradients reaching the encoder's output."""
    rep = _decoders()["repeated"]
    x, memory = _x(), _x(seed=2, t=S)
    pos = jnp.arange(T)[None]
    bias = _relative_bias()(pos, pos)
    y_rep, (g_rep, g_memory) = _grad(rep, x, memory, bias)
    assert np.all(np.asarray(g_memory)[np.asarray(PADDINGS) > 0.5] == 0)  # padded memory gets nothing
    expected = jax.tree.leaves(g_rep.layers)
    variants = {
        "list": _decoders()["list"],
        "list, remat full": _with_layers(
            _cfg(cross_attention=True, repeat=False, remat_policy="full"), _sliced(rep)
        ),  # fmt: skip
        "remat qkv+context+out": _with_layers(
            _cfg(cross_attention=True, remat_policy="save_qkv_context_and_out_proj"), rep.layers
        ),
    }
    for name, stack in variants.items():
        y, (grads, g_mem) = _grad(stack, x, memory, bias)
        assert_same_math(y, y_rep, err_msg=name)
        assert_same_math(g_mem, g_memory, rtol=1e-4, err_msg=name)
        layers = grads.layers
        if isinstance(layers, tuple):
            layers = jax.tree.map(lambda *a: jnp.stack(a), *layers)
        assert_same_math_tree(jax.tree.leaves(layers), expected, rtol=1e-4, err_msg=name)


def test_cross_attention_summaries_per_layer():
    rep, lst = _decoders()["repeated"], _decoders()["list"]
    x, memory = _x(), _x(seed=2, t=S)
    ctx = Context(mode=Mode.EVAL, summary_verbosity=4)
    run = jit(lambda s, x, m: s(x, ctx, memory=m, memory_paddings=PADDINGS)[1].summaries)
    rep_summaries, lst_summaries = run(rep, x, memory), run(lst, x, memory)
    assert rep_summaries["repeat/cross_attention/logit_max"].shape == (L,)
    for i in range(L):
        for name in ("attention/logit_max", "cross_attention/logit_max", "activation_rms"):
            assert_same_math(rep_summaries[f"repeat/{name}"][i], lst_summaries[f"x_layers_{i}/{name}"], err_msg=name)


def test_dropout_in_a_scanned_decoder_with_cross_attention():
    block = _cfg().block.replace(residual_dropout_prob=0.5)
    rep = random_module(_cfg(block=block, cross_attention=True), seed=0, scale=0.3)  # _decoders()' weights
    x, memory = _x(), _x(seed=2, t=S)
    train = jit(lambda s, x, m, k: apply(s, x, key=k, memory=m))
    a = train(rep, x, memory, key(1))
    np.testing.assert_array_equal(a, train(rep, x, memory, key(1)))
    assert not np.allclose(a, train(rep, x, memory, key(2)))
    assert_same_math(_fwd(rep, x, memory=memory), _fwd(_decoders()["repeated"], x, memory=memory))


def test_memory_must_match_the_stack():
    decoder, plain = _decoders()["repeated"], random_module(_cfg(), seed=0, scale=0.3)
    with pytest.raises(ValueError, match="no memory was given"):
        decoder(_x(), Context(mode=Mode.EVAL))
    with pytest.raises(ValueError, match="without cross-attention"):
        plain(_x(), Context(mode=Mode.EVAL), memory=_x(t=S))
