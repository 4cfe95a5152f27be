"""The Transformer layer against a numpy composition of its parts, for every norm policy."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from layer_reference import causal_mask, jit, key, random_module, random_normal, reference_attention
from test_layer_cross_attention import reference_cross_attention
from tolerances import assert_same_math

from pax_eqx.config import ConfigError
from pax_eqx.layers import (
    ActivationConfig,
    AttentionConfig,
    Context,
    KVCache,
    Mode,
    TransformerConfig,
    WeightInit,
    apply,
    swiglu,
)
from pax_eqx.layers.normalizations import RmsNormConfig

B, T, D, F, N = 2, 5, 8, 16, 2
EVAL = Context(mode=Mode.EVAL)


_BUILD_ARGS = (
    "model_dims", "hidden_dims", "num_heads", "dim_per_head", "num_kv_heads", "init", "use_rotary", "cross_attention",
    "fold_padding_with_segment_mask",
)  # fmt: skip


def _cfg(**kw):
    """A key -> Transformer function: `kw` holds config fields and build arguments alike."""
    build_args = {**dict(model_dims=D, hidden_dims=F, num_heads=N), **{k: kw.pop(k) for k in _BUILD_ARGS if k in kw}}
    cfg = TransformerConfig(**{"attention": AttentionConfig(implementation="xla"), **kw})
    return functools.partial(cfg.build, **build_args)


def _randomized(cfg, seed=0):
    """Every array random (norm scales and biases start at zero, which would hide mistakes)."""
    return random_module(cfg, seed, scale=0.3)


def _x(seed=1):
    return random_normal((B, T, D), seed)


@jit
def _fwd(layer, x, **kwargs):
    return layer(x, EVAL, **kwargs)[0]


def _np_layer_norm(x, norm):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-6) * (1 + np.asarray(norm.scale)) + np.asarray(norm.bias)


def _np_rms_norm(x, norm):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * np.asarray(norm.scale)


def _np_transformer(layer, x, policy, act=lambda h: np.maximum(h, 0), norm_fn=_np_layer_norm, memory=None,
                    memory_valid=None, attention_mask=None, ff_keep=None):  # fmt: skip
    """The layer written out in numpy from its parts (causal self-attention, or `attention_mask`
    [B, T, T]; cross-attention to `memory` when given; ReLU/gated FFN, whose hidden activations
    and output are multiplied by `ff_keep` [B, T] when given, Praxis' TransformerFeedForward)."""
    x = np.asarray(x, np.float64)
    a = layer.attention
    mask = causal_mask(*x.shape[:2]) if attention_mask is None else attention_mask
    keep = 1.0 if ff_keep is None else np.asarray(ff_keep, np.float64)[..., None]
    attend = lambda h: reference_attention(h, a.w_q, a.w_k, a.w_v, a.w_o, mask=mask)
    cross = lambda h: reference_cross_attention(h, memory, layer.cross_attention, key_valid=memory_valid)

    def ff(h):
        hidden = h @ np.asarray(layer.ff_in.linear.w) + np.asarray(layer.ff_in.bias.b)
        if layer.ff_in.gate is not None:
            gate = h @ np.asarray(layer.ff_in.gate.w) + np.asarray(layer.ff_in.gate_bias.b)
            hidden = act(gate) * hidden
        else:
            hidden = act(hidden)
        hidden = hidden * keep
        return (hidden @ np.asarray(layer.ff_out.w) + np.asarray(layer.ff_out_bias.b)) * keep

    norm = lambda n, h: norm_fn(h, n)
    if policy == "pre":
        x = x + attend(norm(layer.attention_norm, x))
        if memory is not None:
            x = x + cross(norm(layer.cross_attention_norm, x))
        return x + ff(norm(layer.ff_norm, x))
    if policy == "post":
        x = norm(layer.attention_norm, x + attend(x))
        if memory is not None:
            x = norm(layer.cross_attention_norm, x + cross(x))
        return norm(layer.ff_norm, x + ff(x))
    x = x + norm(layer.attention_post_norm, attend(norm(layer.attention_norm, x)))
    if memory is not None:
        x = x + norm(layer.cross_attention_post_norm, cross(norm(layer.cross_attention_norm, x)))
    return x + norm(layer.ff_post_norm, ff(norm(layer.ff_norm, x)))


@pytest.mark.parametrize("policy", ["pre", "post", "primer_hybrid"])
def test_matches_numpy_for_each_norm_policy(policy):
    layer = _randomized(_cfg(norm_policy=policy))
    assert (layer.attention_post_norm is not None) == (policy == "primer_hybrid")
    x = _x()
    y = _fwd(layer, x)
    assert y.shape == (B, T, D)
    np.testing.assert_allclose(y, _np_transformer(layer, x, policy), rtol=1e-4, atol=1e-4)


PADDINGS = jnp.asarray([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]], jnp.float32)


@pytest.mark.parametrize("policy", ["pre", "post", "primer_hybrid"])
@pytest.mark.parametrize("gated", [False, True])
def test_ff_paddings_zero_the_feed_forward_at_padded_positions(policy, gated):
    """ff_paddings: Praxis' TransformerFeedForward, hidden activations and output times (1 - paddings)."""
    act = ActivationConfig(name="relu", gated=gated)
    layer = _randomized(_cfg(norm_policy=policy, activation=act, ff_paddings=True))
    x = _x()
    valid = np.asarray(PADDINGS) < 0.5
    mask = causal_mask(B, T) & valid[:, None, :]  # the attention's own masking of padded keys
    y = _fwd(layer, x, paddings=PADDINGS)
    expected = _np_transformer(layer, x, policy, attention_mask=mask, ff_keep=1.0 - np.asarray(PADDINGS))
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
    # Real positions are what they are without the option; padded ones are not.
    plain = _fwd(_randomized(_cfg(norm_policy=policy, activation=act)), x, paddings=PADDINGS)
    assert_same_math(np.asarray(y)[valid], np.asarray(plain)[valid])
    assert not np.allclose(np.asarray(y)[~valid], np.asarray(plain)[~valid])


def test_ff_paddings_zero_the_hidden_activations_before_the_relu_dropout():
    """In training too the feed-forward adds nothing at padded positions: there the layer's output
    is that of the same layer with a zero feed-forward (the same dropout keys)."""
    layer = _randomized(_cfg(ff_paddings=True, relu_dropout_prob=0.5))
    x = _x()
    y, _ = layer(x, Context(key=key(3), mode=Mode.TRAIN), paddings=PADDINGS)
    no_ff = eqx.tree_at(lambda m: m.ff_out_bias.b, layer, jnp.zeros(D))
    no_ff = eqx.tree_at(lambda m: m.ff_out.w, no_ff, jnp.zeros((F, D)))
    y0, _ = no_ff(x, Context(key=key(3), mode=Mode.TRAIN), paddings=PADDINGS)
    padded = np.asarray(PADDINGS) > 0.5
    assert_same_math(np.asarray(y)[padded], np.asarray(y0)[padded])
    assert not np.allclose(np.asarray(y)[~padded], np.asarray(y0)[~padded])


@pytest.mark.parametrize("given_segments", [False, True])
def test_fold_padding_with_segment_mask_is_praxis_transformer_lm_masking(given_segments):
    """Praxis' TransformerLm: segment ids (given, or 1 - paddings), causal, and no padding mask:
    a padded token attends to the earlier padded tokens; the feed-forward still sees paddings."""
    act = ActivationConfig(name="relu")
    layer = _randomized(_cfg(fold_padding_with_segment_mask=True, ff_paddings=True, activation=act))
    x = _x()
    seg = np.asarray([[1, 1, 2, 0, 0], [1, 1, 1, 1, 1]]) if given_segments else 1 - np.asarray(PADDINGS, np.int64)
    mask = causal_mask(B, T) & (seg[:, :, None] == seg[:, None, :])
    kwargs = dict(paddings=PADDINGS, segment_ids=jnp.asarray(seg)) if given_segments else dict(paddings=PADDINGS)
    y = _fwd(layer, x, **kwargs)
    expected = _np_transformer(layer, x, "pre", attention_mask=mask, ff_keep=1.0 - np.asarray(PADDINGS))
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)


def test_a_praxis_mask_mode_language_model_folds_padding():
    from pax_eqx.models import LanguageModelConfig

    sizes = dict(vocab_size=8, max_seq_len=8, num_layers=1, model_dims=8, hidden_dims=16, num_heads=2)
    praxis = TransformerConfig(attention=AttentionConfig(mask_mode="praxis"))
    assert LanguageModelConfig(**sizes, block=praxis).stack_config().fold_padding_with_segment_mask
    assert not LanguageModelConfig(**sizes).stack_config().fold_padding_with_segment_mask


S = 4  # memory length (the queries have T)
MEMORY_PADDINGS = jnp.asarray([[0, 0, 1, 1], [0, 0, 0, 0]], jnp.float32)


@pytest.mark.parametrize("policy", ["pre", "post", "primer_hybrid"])
def test_cross_attention_layer_matches_numpy_for_each_norm_policy(policy):
    """Praxis' order: self-attention, cross-attention to the memory, feed-forward, each in the
    norm policy; padded memory is not attended to."""
    layer = _randomized(_cfg(norm_policy=policy, num_kv_heads=1, cross_attention=True))
    assert (layer.cross_attention_post_norm is not None) == (policy == "primer_hybrid")
    x, memory = _x(), random_normal((B, S, D), 2)
    y = _fwd(layer, x, memory=memory, memory_paddings=MEMORY_PADDINGS)
    valid = np.asarray(MEMORY_PADDINGS) < 0.5
    expected = _np_transformer(layer, x, policy, memory=memory, memory_valid=valid)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)


def test_cross_attention_layer_decode_equals_full_forward():
    layer = _randomized(_cfg(norm_policy="primer_hybrid", num_kv_heads=1, cross_attention=True))
    x, memory = _x(), random_normal((B, S, D), 2)

    @jit
    def prefill_then_step(layer, x, memory):
        cache = layer.attention.init_cache(B, T)
        memory_kv = layer.cross_attention.project_memory(memory)
        pos = jnp.broadcast_to(jnp.arange(T), (B, T))
        valid, memory_valid = jnp.ones((B, T), bool), MEMORY_PADDINGS < 0.5
        step = lambda i, j, cache: layer.decode(
            x[:, i:j], cache, jnp.int32(i), pos[:, i:j], valid, memory_kv=memory_kv, memory_valid=memory_valid
        )
        out, cache = step(0, 2, cache)
        outs = [out]
        for t in range(2, T):
            out, cache = step(t, t + 1, cache)
            outs.append(out)
        return jnp.concatenate(outs, 1)

    expected = _fwd(layer, x, memory=memory, memory_paddings=MEMORY_PADDINGS)
    assert_same_math(prefill_then_step(layer, x, memory), expected)


def test_memory_must_match_whether_the_layer_has_cross_attention():
    plain = eqx.filter_eval_shape(_cfg(), jax.random.key(0))
    cross = eqx.filter_eval_shape(_cfg(cross_attention=True), jax.random.key(0))
    x, memory = jnp.zeros((B, T, D)), jnp.zeros((B, S, D))
    cache = KVCache(jnp.zeros((B, T, N, D // N)), jnp.zeros((B, T, N, D // N)))
    pos, valid = jnp.zeros((B, 1), jnp.int32), jnp.ones((B, T), bool)
    with pytest.raises(ValueError, match="without cross-attention"):
        plain(x, EVAL, memory=memory)
    with pytest.raises(ValueError, match="no memory was given"):
        cross(x, EVAL)
    with pytest.raises(ValueError, match="without cross-attention"):
        plain.decode(x[:, :1], cache, jnp.int32(0), pos, valid, memory_kv=cache)
    with pytest.raises(ValueError, match="no memory_kv was given"):
        cross.decode(x[:, :1], cache, jnp.int32(0), pos, valid)


def test_cross_attention_is_built_bidirectional_unfused_without_rotary():
    """From the layer's attention template, whatever it says about causality, fusing and rotary."""
    attention = AttentionConfig(combine_qkv=True, rotary_max_timescale=500.0, use_bias=True)
    build = _cfg(
        attention=attention, cross_attention=True, use_rotary=True, init=WeightInit(method="constant", scale=0.5)
    )
    layer = build(jax.random.key(0))
    self_attention, cross = layer.attention, layer.cross_attention
    assert self_attention.causal and self_attention.w_qkv is not None and self_attention.rotary_max_timescale == 500.0
    assert not cross.causal and cross.w_qkv is None and cross.rotary_max_timescale is None
    assert cross.w_q.shape == (D, N, D // N) and cross.b_k is not None
    for w in (cross.w_q, cross.w_k, cross.w_v, cross.w_o):
        np.testing.assert_array_equal(w, 0.5)
    plain = eqx.filter_eval_shape(_cfg(), jax.random.key(0))
    assert plain.cross_attention is None and plain.cross_attention_norm is None


def test_swiglu_and_rms_norm():
    layer = _randomized(_cfg(activation=swiglu(), norm=RmsNormConfig()))
    assert layer.ff_in.gate is not None
    x = _x()
    silu = lambda h: h / (1 + np.exp(-h))
    expected = _np_transformer(layer, x, "pre", act=silu, norm_fn=_np_rms_norm)
    np.testing.assert_allclose(_fwd(layer, x), expected, rtol=1e-4, atol=1e-4)


def test_segment_ids_keep_packed_documents_apart():
    layer = _randomized(_cfg(use_rotary=True))
    x = _x()[:1]
    seg = jnp.asarray([[1, 1, 1, 2, 2]])
    pos = jnp.asarray([[0, 1, 2, 0, 1]])
    y = _fwd(layer, x, segment_ids=seg, segment_pos=pos)
    assert_same_math(y[:, :3], _fwd(layer, x[:, :3]))
    assert_same_math(y[:, 3:], _fwd(layer, x[:, 3:]))


@pytest.mark.parametrize("policy", ["post", "primer_hybrid"])  # "pre": tests/models decode the LM
def test_decode_equals_full_forward(policy):
    layer = _randomized(_cfg(norm_policy=policy, num_kv_heads=1))

    @jit
    def prefill_then_step(layer, x):
        cache = layer.attention.init_cache(B, T)
        pos = jnp.broadcast_to(jnp.arange(T), (B, T))
        valid = jnp.ones((B, T), bool)
        out, cache = layer.decode(x[:, :2], cache, jnp.int32(0), pos[:, :2], valid)
        outs = [out]
        for t in range(2, T):
            out, cache = layer.decode(x[:, t : t + 1], cache, jnp.int32(t), pos[:, t : t + 1], valid)
            outs.append(out)
        return jnp.concatenate(outs, 1)

    x = _x()
    assert_same_math(prefill_then_step(layer, x), _fwd(layer, x))


def test_dropout_needs_a_key_in_training_only():
    layer = _randomized(_cfg(residual_dropout_prob=0.3, relu_dropout_prob=0.3))
    plain = _randomized(_cfg())  # the same weights, no dropout
    x = _x()
    assert_same_math(_fwd(layer, x), _fwd(plain, x))
    train = jit(lambda m, x, k: apply(m, x, key=k))
    with pytest.raises(ValueError, match="needs randomness"):
        train(layer, x, None)
    a = train(layer, x, key(1))
    np.testing.assert_array_equal(a, train(layer, x, key(1)))
    assert not np.allclose(a, train(layer, x, key(2)))


def test_grad_reaches_every_weight():
    layer = _randomized(_cfg(activation=ActivationConfig(name="gelu"), norm_policy="primer_hybrid"))
    x = _x()
    grads = jit(eqx.filter_grad(lambda m: jnp.sum(_fwd(m, x) ** 2)))(layer)
    for g in jax.tree.leaves(grads):
        assert np.all(np.isfinite(g)) and np.any(g != 0)


def test_build_gives_children_the_parent_dims():
    layer = eqx.filter_eval_shape(_cfg(num_kv_heads=1), jax.random.key(0))
    assert (layer.attention.num_heads, layer.attention.num_kv_heads, layer.attention.head_dim) == (N, 1, D // N)
    assert layer.attention.w_q.shape == (D, N, D // N) and layer.attention.w_k.shape == (D, 1, D // N)
    assert layer.ff_in.linear.w.shape == (D, F) and layer.ff_out.w.shape == (F, D)
    assert layer.attention_norm.scale.shape == (D,)


def test_init_reaches_every_projection():
    layer = _cfg(init=WeightInit(method="constant", scale=0.5))(jax.random.key(0))
    for w in (layer.attention.w_q, layer.attention.w_o, layer.ff_in.linear.w, layer.ff_out.w):
        np.testing.assert_array_equal(w, 0.5)


def test_missing_dims_fail_clearly():
    with pytest.raises(ValueError, match="model_dims, hidden_dims, num_heads"):
        TransformerConfig().build(jax.random.key(0), model_dims=D, hidden_dims=0, num_heads=N)


@pytest.mark.parametrize(
    "fields, named",
    [(dict(norm_policy="pree"), "norm_policy"), (dict(residual_dropout_prob=1.0), "residual_dropout_prob")],
)
def test_config_errors_name_the_field(fields, named):
    with pytest.raises(ConfigError, match=named):
        TransformerConfig(**fields)
