"""Cross-attention (queries from x, keys/values from a memory) against a numpy softmax formula;
decoding against projected memory and with an additive bias against the full forward."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from layer_reference import causal_mask, jit, key, random_module, random_normal, reference_attention, softmax
from tolerances import assert_same_math

from pax_eqx.layers import AttentionConfig, Context, KVCache, Mode, apply

B, T, S, D, N, H = 2, 3, 5, 8, 4, 4  # queries T, memory S: different lengths
EVAL = Context(mode=Mode.EVAL)
MEMORY_PADDINGS = jnp.asarray([[0, 0, 0, 1, 1], [0, 1, 0, 0, 0]], jnp.float32)


def _build(seed=0, num_kv_heads=0, **fields):
    cfg = AttentionConfig(**{"implementation": "xla", "causal": False, **fields})
    return random_module(
        functools.partial(cfg.build, input_dims=D, num_heads=N, dim_per_head=H, num_kv_heads=num_kv_heads), seed
    )


def _x(seed=1, t=T):
    return random_normal((B, t, D), seed)


def _memory(seed=2):
    return random_normal((B, S, D), seed)


@jit
def _cross(att, x, memory, **kwargs):
    return att.cross(x, memory, EVAL, **kwargs)[0]


def reference_cross_attention(x, memory, att, *, key_valid=None, bias=None):
    """softmax(Q K^T / sqrt(H) [+ bias], padded memory masked) V in float64 numpy, one head at a
    time: Q = x w_q (+ b_q), K = memory w_k (+ b_k), V = memory w_v (+ b_v); query head n uses kv
    head n // (N / K); then (.) w_o (+ b_o). key_valid: [B, S], False at padded memory."""
    f64 = lambda a: np.asarray(a, np.float64)
    x, memory = f64(x), f64(memory)
    q = np.einsum("btd,dnh->btnh", x, f64(att.w_q))
    k = np.einsum("bsd,dkh->bskh", memory, f64(att.w_k))
    v = np.einsum("bsd,dkh->bskh", memory, f64(att.w_v))
    if att.b_q is not None:
        q, k, v = q + f64(att.b_q), k + f64(att.b_k), v + f64(att.b_v)
    n, h, kv = q.shape[2], q.shape[3], k.shape[2]
    out = np.zeros(q.shape)
    for bi in range(x.shape[0]):
        for head in range(n):
            kh = head // (n // kv)
            logits = q[bi, :, head] @ k[bi, :, kh].T / np.sqrt(h)  # [T, S]
            if bias is not None:
                logits = logits + f64(bias)[bi % bias.shape[0], head % bias.shape[1]]
            if key_valid is not None:
                logits = np.where(key_valid[bi][None, :], logits, -1e30)
            out[bi, :, head] = softmax(logits) @ v[bi, :, kh]
    y = np.einsum("btnh,nhd->btd", out, f64(att.w_o))
    return y if att.b_o is None else y + f64(att.b_o)


@pytest.mark.parametrize("num_kv_heads", [0, 2, 1], ids=["mha", "gqa", "mqa"])
def test_cross_matches_numpy_with_memory_padding(num_kv_heads):
    att = _build(num_kv_heads=num_kv_heads, use_bias=True)
    assert att.w_k.shape == (D, num_kv_heads or N, H)
    x, memory = _x(), _memory()
    y = _cross(att, x, memory, memory_paddings=MEMORY_PADDINGS)
    assert y.shape == (B, T, D)
    expected = reference_cross_attention(x, memory, att, key_valid=np.asarray(MEMORY_PADDINGS) < 0.5)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    # Without paddings every memory position is attended to.
    np.testing.assert_allclose(_cross(att, x, memory), reference_cross_attention(x, memory, att), rtol=1e-5, atol=1e-5)


def test_padded_memory_is_never_attended_to():
    att = _build()
    x, memory = _x(), _memory()
    y = _cross(att, x, memory, memory_paddings=MEMORY_PADDINGS)
    noise = random_normal(memory.shape, 9, scale=100.0)
    noisy = jnp.where(MEMORY_PADDINGS[..., None] > 0.5, noise, memory)
    assert_same_math(_cross(att, x, noisy, memory_paddings=MEMORY_PADDINGS), y)
    assert not np.allclose(_cross(att, x, noisy), _cross(att, x, memory), atol=1e-3)  # it would leak unmasked


def test_cross_bias_matches_numpy():
    att = _build(num_kv_heads=2)
    x, memory = _x(), _memory()
    bias = random_normal((1, N, T, S), 3)
    expected = reference_cross_attention(
        x, memory, att, key_valid=np.asarray(MEMORY_PADDINGS) < 0.5, bias=np.asarray(bias)
    )
    y = _cross(att, x, memory, memory_paddings=MEMORY_PADDINGS, bias=bias)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_cross_ignores_the_causal_flag_and_equals_the_combined_weight_layout():
    """`causal` is self-attention's: a causal layer's cross-attention attends to all of memory.
    A combine_qkv layer projects with the slices of its fused weight."""
    combined = _build(causal=True, combine_qkv=True)
    separate = eqx.tree_at(lambda m: (m.w_q, m.w_k, m.w_v, m.w_o), _build(seed=5), (*combined.w_qkv, combined.w_o))
    x, memory = _x(), _memory()
    expected = reference_cross_attention(x, memory, separate)
    np.testing.assert_allclose(_cross(combined, x, memory), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_kv_heads", [0, 1], ids=["mha", "mqa"])
def test_decode_cross_equals_cross(num_kv_heads):
    att = _build(num_kv_heads=num_kv_heads, use_bias=True)
    x, memory = _x(), _memory()
    memory_kv = jit(lambda att, m: att.project_memory(m))(att, memory)
    assert isinstance(memory_kv, KVCache) and memory_kv.k.shape == (B, S, num_kv_heads or N, H)
    valid = MEMORY_PADDINGS < 0.5

    @jit
    def one_at_a_time(att, x, memory_kv):
        return jnp.concatenate([att.decode_cross(x[:, t : t + 1], memory_kv, valid) for t in range(T)], axis=1)

    expected = _cross(att, x, memory, memory_paddings=MEMORY_PADDINGS)
    assert_same_math(one_at_a_time(att, x, memory_kv), expected)
    all_at_once = jit(lambda att, x, kv: att.decode_cross(x, kv, valid))(att, x, memory_kv)
    assert_same_math(all_at_once, expected)


def test_decode_with_bias_equals_full_forward_with_bias():
    """Self-attention decoding with T5-style bias: the new tokens' rows of the full [T, T] bias,
    against every cache slot (slots not yet written are masked, whatever their bias)."""
    att = _build(causal=True, num_kv_heads=2)
    t, max_len = 5, 7
    x = _x(t=t)
    bias = random_normal((1, N, max_len, max_len), 4)  # rows/columns past t: never used

    @jit
    def prefill_then_step(att, x, bias):
        cache = att.init_cache(B, max_len)
        pos = jnp.broadcast_to(jnp.arange(t), (B, t))
        valid = jnp.ones((B, max_len), bool)
        out, cache = att.decode(x[:, :2], cache, jnp.int32(0), pos[:, :2], valid, bias=bias[:, :, :2])
        outs = [out]
        for i in range(2, t):
            out, cache = att.decode(x[:, i : i + 1], cache, jnp.int32(i), pos[:, i : i + 1], valid,
                                    bias=bias[:, :, i : i + 1])  # fmt: skip
            outs.append(out)
        return jnp.concatenate(outs, 1)

    full_bias = bias[:, :, :t, :t]
    full = jit(lambda att, x, b: att(x, EVAL, bias=b)[0])(att, x, full_bias)
    expected = reference_attention(
        x, att.w_q, att.w_k, att.w_v, att.w_o, mask=causal_mask(B, t), bias=np.asarray(full_bias)
    )
    np.testing.assert_allclose(full, expected, rtol=1e-5, atol=1e-5)
    assert_same_math(prefill_then_step(att, x, bias), full)


def test_logit_max_summary_from_cross_logits():
    att = _build()
    x, memory = _x(), _memory()
    ctx = Context(mode=Mode.EVAL, summary_verbosity=4)
    _, ctx = jit(lambda att, x, m, p: att.cross(x, m, ctx, memory_paddings=p))(att, x, memory, MEMORY_PADDINGS)
    q = np.einsum("btd,dnh->bnth", np.asarray(x, np.float64), np.asarray(att.w_q))
    k = np.einsum("bsd,dnh->bnsh", np.asarray(memory, np.float64), np.asarray(att.w_k))
    logits = np.einsum("bnth,bnsh->bnts", q, k) / np.sqrt(H)
    valid = (np.asarray(MEMORY_PADDINGS) < 0.5)[:, None, None, :]
    np.testing.assert_allclose(ctx.summaries["logit_max"], np.where(valid, logits, -np.inf).max(), rtol=1e-5)
    assert not Context(mode=Mode.EVAL).records(4)  # the default: nothing recorded (or traced)


def test_cross_dropout_only_in_training_and_gradients_reach_memory():
    att = _build(dropout_prob=0.5)
    x, memory = _x(), _memory()
    plain = _cross(att, x, memory)
    train = jit(lambda att, x, m, k: apply(att.cross, x, m, key=k))
    a = train(att, x, memory, key(1))
    np.testing.assert_array_equal(a, train(att, x, memory, key(1)))
    assert not np.allclose(a, plain, atol=1e-3)
    with pytest.raises(ValueError, match="needs randomness"):
        train(att, x, memory, None)
    g = jit(jax.grad(lambda m: jnp.sum(_cross(att, x, m, memory_paddings=MEMORY_PADDINGS) ** 2)))(memory)
    g = np.asarray(g)
    assert np.all(np.isfinite(g)) and np.all(g[np.asarray(MEMORY_PADDINGS) > 0.5] == 0)  # padding gets none
    assert np.all(np.abs(g[np.asarray(MEMORY_PADDINGS) < 0.5]).sum(-1) > 0)


def test_cross_attention_with_rotary_is_refused():
    att = eqx.filter_eval_shape(
        functools.partial(AttentionConfig().build, input_dims=D, num_heads=N, use_rotary=True), jax.random.key(0)
    )
    with pytest.raises(ValueError, match="use_rotary=False"):
        att.cross(_x(), _memory(), EVAL)
