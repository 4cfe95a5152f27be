"""Attention against a numpy softmax(QK^T/sqrt(d))V, and the equivalences the design promises."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import TypeCheckError
from layer_reference import causal_mask, jit, random_module, random_normal, reference_attention
from tolerances import assert_matches_reference, assert_same_math

from pax_eqx.config import ConfigError
from pax_eqx.layers import AttentionConfig, Context, Mode, apply
from pax_eqx.layers import attention_kernels as kernels

B, T, D, N, H = 2, 6, 8, 4, 4
EVAL = Context(mode=Mode.EVAL)


@jit
def _fwd(att, x, **kwargs):
    """The EVAL forward, jitted: one compile per config and shape instead of one per eager op."""
    return att(x, EVAL, **kwargs)[0]


_BUILD_ARGS = ("input_dims", "num_heads", "dim_per_head", "num_kv_heads", "init", "use_rotary")


def _cfg(**kw):
    """A key -> Attention function: `kw` holds config fields and build arguments alike."""
    build_args = {**dict(input_dims=D, num_heads=N, dim_per_head=H), **{k: kw.pop(k) for k in _BUILD_ARGS if k in kw}}
    return functools.partial(AttentionConfig(**{"implementation": "xla", **kw}).build, **build_args)


def _build(seed=0, **kw):
    return random_module(_cfg(**kw), seed)


def _x(seed=1, t=T):
    return random_normal((B, t, D), seed)


def _weights(att):
    return np.asarray(att.w_q), np.asarray(att.w_k), np.asarray(att.w_v), np.asarray(att.w_o)


@pytest.mark.parametrize("causal", [True, False])
def test_matches_numpy(causal):
    att = _build(causal=causal)
    assert att.w_q.shape == (D, N, H) and att.w_o.shape == (N, H, D) and att.w_qkv is None
    x = _x()
    y = _fwd(att, x)
    assert y.shape == (B, T, D)
    mask = causal_mask(B, T) if causal else None
    np.testing.assert_allclose(y, reference_attention(x, *_weights(att), mask=mask), rtol=1e-5, atol=1e-5)


def test_biases_match_numpy():
    att = _build(use_bias=True)
    x = _x()
    biases = tuple(np.asarray(b) for b in (att.b_q, att.b_k, att.b_v, att.b_o))
    expected = reference_attention(x, *_weights(att), mask=causal_mask(B, T), biases=biases)
    np.testing.assert_allclose(_fwd(att, x), expected, rtol=1e-5, atol=1e-5)


def test_combined_qkv_equals_separate_projections():
    combined = _build(combine_qkv=True)
    assert combined.w_qkv.shape == (3, D, N, H) and combined.w_q is None
    separate = eqx.tree_at(lambda m: (m.w_q, m.w_k, m.w_v), _build(seed=5), tuple(combined.w_qkv[i] for i in range(3)))
    separate = eqx.tree_at(lambda m: m.w_o, separate, combined.w_o)
    x = _x()
    assert_same_math(_fwd(combined, x), _fwd(separate, x))
    expected = reference_attention(x, *np.asarray(combined.w_qkv), np.asarray(combined.w_o), mask=causal_mask(B, T))
    np.testing.assert_allclose(_fwd(combined, x), expected, rtol=1e-5, atol=1e-5)


def test_per_dim_scale_matches_praxis():
    att = _build(per_dim_scale=True)
    x = _x()
    softplus = np.log1p(np.exp(np.asarray(att.per_dim_scale, np.float64)))
    q_scale = 1.442695041 / np.sqrt(H) * softplus  # replaces 1/sqrt(H)
    expected = reference_attention(x, *_weights(att), mask=causal_mask(B, T), q_scale=q_scale)
    np.testing.assert_allclose(_fwd(att, x), expected, rtol=1e-5, atol=1e-5)


def test_per_dim_scale_at_init_is_the_plain_scale():
    plain = _build()
    scaled = eqx.tree_at(lambda m: m.per_dim_scale, plain, jnp.zeros(H), is_leaf=lambda x: x is None)
    x = _x()
    assert_same_math(_fwd(scaled, x), _fwd(plain, x))


def test_logit_cap_matches_numpy():
    att = _build(logit_cap=0.3)
    x = _x() * 4.0
    expected = reference_attention(x, *_weights(att), mask=causal_mask(B, T), logit_cap=0.3)
    np.testing.assert_allclose(_fwd(att, x), expected, rtol=1e-5, atol=1e-5)
    assert not np.allclose(_fwd(_build(), x), expected, atol=1e-3)  # the cap is active here


def test_additive_bias_matches_numpy():
    att = _build()
    x = _x()
    bias = random_normal((1, N, T, T), 3)
    expected = reference_attention(x, *_weights(att), mask=causal_mask(B, T), bias=np.asarray(bias))
    np.testing.assert_allclose(_fwd(att, x, bias=bias), expected, rtol=1e-5, atol=1e-5)


def test_padding_mask_matches_numpy_and_padding_does_not_leak():
    att = _build(causal=False)
    x = _x()
    paddings = jnp.asarray([[0, 0, 0, 0, 1, 1], [0, 1, 0, 0, 0, 1]], jnp.float32)
    y = _fwd(att, x, paddings=paddings)
    key_valid = np.asarray(paddings) == 0
    mask = np.broadcast_to(key_valid[:, None, :], (B, T, T))
    np.testing.assert_allclose(y, reference_attention(x, *_weights(att), mask=mask), rtol=1e-5, atol=1e-5)
    # Whatever sits at padded positions, the outputs at real positions are the same.
    noise = random_normal(x.shape, 9, scale=100.0)
    y2 = _fwd(att, jnp.where(paddings[..., None] > 0, noise, x), paddings=paddings)
    assert_same_math(np.asarray(y2)[key_valid], np.asarray(y)[key_valid])


def test_segment_mask_matches_numpy():
    att = _build()
    x = _x()
    seg = jnp.asarray([[1, 1, 1, 2, 2, 0], [1, 2, 2, 2, 3, 3]])
    same = np.asarray(seg)[:, :, None] == np.asarray(seg)[:, None, :]
    expected = reference_attention(x, *_weights(att), mask=causal_mask(B, T) & same)
    np.testing.assert_allclose(_fwd(att, x, segment_ids=seg), expected, rtol=1e-5, atol=1e-5)


def test_packed_documents_equal_separate_documents():
    """Two documents packed in one row give the outputs each gives alone (segment_pos restarts)."""
    att = _build(use_rotary=True)
    doc_a, doc_b = _x(seed=2, t=4)[:1], _x(seed=3, t=2)[:1]
    packed = jnp.concatenate([doc_a, doc_b], axis=1)
    seg = jnp.asarray([[1, 1, 1, 1, 2, 2]])
    pos = jnp.asarray([[0, 1, 2, 3, 0, 1]])
    y = _fwd(att, packed, segment_ids=seg, segment_pos=pos)
    assert_same_math(y[:, :4], _fwd(att, doc_a))
    assert_same_math(y[:, 4:], _fwd(att, doc_b))


def test_rotary_matches_numpy():
    att = _build(use_rotary=True)
    x = _x()
    pos = jnp.asarray([[0, 1, 2, 3, 4, 5], [3, 4, 5, 6, 7, 8]])
    expected = reference_attention(x, *_weights(att), mask=causal_mask(B, T), rotary_positions=np.asarray(pos))
    np.testing.assert_allclose(_fwd(att, x, segment_pos=pos), expected, rtol=1e-5, atol=1e-5)


def test_rotary_attention_is_shift_invariant():
    att = _build(use_rotary=True)
    x = _x()
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    y0 = _fwd(att, x, segment_pos=pos)
    y1 = _fwd(att, x, segment_pos=pos + 37)
    np.testing.assert_allclose(y0, y1, rtol=1e-4, atol=1e-4)
    y_scaled = _fwd(att, x, segment_pos=pos * 3)
    assert not np.allclose(y0, y_scaled, atol=1e-3)  # positions do matter, only their differences


def _replicate_kv(grouped, kv_heads):
    """An MHA module whose k/v weights repeat each of the grouped module's kv heads N/K times."""
    mha = _build(seed=4)
    reps = N // kv_heads
    return eqx.tree_at(
        lambda m: (m.w_q, m.w_k, m.w_v, m.w_o),
        mha,
        (grouped.w_q, jnp.repeat(grouped.w_k, reps, axis=1), jnp.repeat(grouped.w_v, reps, axis=1), grouped.w_o),
    )


@pytest.mark.parametrize("kv_heads", [1, 2], ids=["mqa", "gqa"])
def test_grouped_kv_heads_equal_mha_with_replicated_kv_heads(kv_heads):
    grouped = _build(num_kv_heads=kv_heads)
    assert grouped.w_k.shape == (D, kv_heads, H)
    x = _x()
    y = _fwd(grouped, x)
    assert_same_math(y, _fwd(_replicate_kv(grouped, kv_heads), x))
    expected = reference_attention(x, *_weights(grouped), mask=causal_mask(B, T))
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


# Grouped-query decoding is also checked end to end by tests/models (num_kv_heads 0, 1, 2).
@pytest.mark.parametrize("kw", [{"num_kv_heads": 1, "use_rotary": True}, {"combine_qkv": True}])
def test_decode_with_kv_cache_equals_full_forward(kw):
    att = _build(**kw)
    x = _x()
    cache = att.init_cache(B, T + 2)
    assert cache.k.shape == (B, T + 2, att.num_kv_heads, H)

    @jit
    def prefill_then_step(att, x, cache):
        pos = jnp.broadcast_to(jnp.arange(T), (B, T))
        valid = jnp.ones((B, T + 2), bool)
        out, cache = att.decode(x[:, :3], cache, jnp.int32(0), pos[:, :3], valid)  # prefill
        outs = [out]
        for t in range(3, T):  # then one token at a time
            out, cache = att.decode(x[:, t : t + 1], cache, jnp.int32(t), pos[:, t : t + 1], valid)
            outs.append(out)
        return jnp.concatenate(outs, axis=1)

    assert_same_math(prefill_then_step(att, x, cache), _fwd(att, x))


def test_decode_ignores_invalid_cache_slots():
    att = _build()
    x = _x()
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    valid = jnp.ones((B, T), bool).at[:, 0].set(False)
    decode = jit(lambda att, x: att.decode(x, att.init_cache(B, T), jnp.int32(0), pos, valid)[0])
    y, y_noisy = decode(att, x), decode(att, x.at[:, 0].set(50.0))
    assert_same_math(y[:, 1:], y_noisy[:, 1:])


def test_grad_matches_finite_differences():
    att = _build(num_kv_heads=2, use_rotary=True, per_dim_scale=True)
    x = _x()
    loss = lambda m, x: jnp.sum(_fwd(m, x) ** 2)
    g_att, g_x = jit(eqx.filter_grad(lambda mx: loss(*mx)))((att, x))
    for g in jax.tree.leaves(g_att):
        assert np.all(np.isfinite(g)) and np.any(g != 0)
    # Directional derivative with respect to the input against a central finite difference.
    direction = random_normal(x.shape, 7)
    eps = 1e-2
    fd = (loss(att, x + eps * direction) - loss(att, x - eps * direction)) / (2 * eps)
    np.testing.assert_allclose(jnp.sum(g_x * direction), fd, rtol=2e-2)


def test_attention_dropout_only_in_training():
    att = _build(dropout_prob=0.5)
    x = _x()
    no_dropout = _fwd(_build(), x)
    assert_same_math(_fwd(att, x), no_dropout)
    train = jit(lambda m, x, key: apply(m, x, key=key))
    a = train(att, x, jax.random.key(1))
    np.testing.assert_array_equal(a, train(att, x, jax.random.key(1)))
    assert not np.allclose(a, no_dropout, atol=1e-3)
    with pytest.raises(ValueError, match="needs randomness"):
        train(att, x, None)


def test_wrong_shapes_are_type_errors():
    att = _build()
    with pytest.raises(TypeCheckError):
        att(jnp.ones((B, T, D + 1)), EVAL)  # embed does not match the weights
    with pytest.raises(TypeCheckError):
        att(_x(), EVAL, segment_ids=jnp.ones((B, T + 1), jnp.int32))
    with pytest.raises(TypeCheckError):
        att(jnp.ones((T, D)), EVAL)  # missing batch axis


def test_config_errors_name_the_fix():
    with pytest.raises(ValueError, match="must divide num_heads"):
        _build(num_kv_heads=3)
    with pytest.raises(ValueError, match="combine_qkv=False"):
        _build(combine_qkv=True, num_kv_heads=1)
    with pytest.raises(ValueError, match="input_dims, num_heads"):
        AttentionConfig().build(jax.random.key(0), input_dims=0, num_heads=2)
    with pytest.raises(ValueError, match="even head dim"):
        _build(dim_per_head=3, use_rotary=True)


@pytest.mark.parametrize(
    "fields, named",
    [
        (dict(implementation="cudnn", logit_cap=30.0), "logit_cap"),
        (dict(implementation="cudnn", dropout_prob=0.1), "dropout_prob"),
        (dict(dropout_prob=1.0), "dropout_prob"),
        (dict(logit_cap=-1.0), "logit_cap"),
        (dict(implementation="flash"), "implementation"),
    ],
)
def test_fields_that_would_do_nothing_are_rejected(fields, named):
    with pytest.raises(ConfigError, match=named):
        AttentionConfig(**fields)


def test_rotary_timescale_without_rotary_is_rejected_at_build():
    with pytest.raises(ConfigError, match="rotary_max_timescale"):
        _build(rotary_max_timescale=500.0)
    _build(rotary_max_timescale=500.0, use_rotary=True)


def test_xla_is_what_auto_means_on_cpu():
    x = _x()
    assert not kernels.cudnn_qualifies(x.astype(jnp.bfloat16).reshape(B, T, N, 2), 0.0, False)
    auto = _build(implementation="auto")
    np.testing.assert_array_equal(_fwd(auto, x), _fwd(_build(implementation="xla"), x))


# Praxis' mask semantics (mask_mode="praxis") and the probabilities (with_probs) ----------------
_LARGE_NEGATIVE = -0.7 * np.finfo(np.float32).max  # py_utils.get_large_negative_number(float32)


def _praxis_mask(paddings, *, causal, segment_ids=None):
    """Praxis' additive mask [B, 1, T|1, T], written from compute_attention_masks_for_fprop:
    convert_paddings_to_mask, then merge_masks (min; a [B, 1, 1, T] mask merged with a
    [., 1, T, T] one is first min(its transpose, itself)) with the segment and causal masks."""

    def merge(a, b):
        if a.shape[2] != b.shape[2]:
            if a.shape[2] == 1:
                a = np.minimum(np.transpose(a, (0, 1, 3, 2)), a)
            else:
                b = np.minimum(np.transpose(b, (0, 1, 3, 2)), b)
        return np.minimum(a, b)

    t = paddings.shape[1]
    mask = np.asarray(paddings, np.float64)[:, None, None, :] * _LARGE_NEGATIVE
    if segment_ids is not None:
        seg = np.asarray(segment_ids)
        mask = merge(mask, (seg[:, None, :, None] != seg[:, None, None, :]) * _LARGE_NEGATIVE)
    if causal:
        mask = merge(mask, (np.arange(t)[:, None] < np.arange(t)[None, :])[None, None] * _LARGE_NEGATIVE)
    return mask


def _praxis_probs(att, x, mask):
    """Praxis' _dot_atten probabilities: logits, apply_mask_to_logits (a select), softmax."""
    x = np.asarray(x, np.float64)
    q = np.einsum("btd,dnh->btnh", x, np.asarray(att.w_q, np.float64)) / np.sqrt(att.head_dim)
    k = np.einsum("btd,dnh->btnh", x, np.asarray(att.w_k, np.float64))
    logits = np.einsum("btnh,bsnh->bnts", q, k)
    logits = np.where(np.broadcast_to(mask, logits.shape) >= _LARGE_NEGATIVE * 0.5, logits, _LARGE_NEGATIVE)
    logits = logits - logits.max(-1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(-1, keepdims=True)


def _praxis_output(att, x, probs):
    v = np.einsum("btd,dnh->btnh", np.asarray(x, np.float64), np.asarray(att.w_v, np.float64))
    return np.einsum("bnts,bsnh,nhd->btd", probs, v, np.asarray(att.w_o, np.float64))


PADDINGS = jnp.asarray([[0, 0, 0, 0, 1, 1], [0, 1, 0, 0, 0, 1]], jnp.float32)
SEGMENTS = jnp.asarray([[1, 1, 2, 2, 0, 0], [1, 0, 1, 1, 2, 0]])


@jit
def _fwd_probs(att, x, **kwargs):
    y, probs, _ = att.with_probs(x, EVAL, **kwargs)
    return y, probs


@pytest.mark.parametrize("causal, segments", [(True, False), (True, True), (False, True), (False, False)])
def test_praxis_mask_mode_matches_praxis_masks(causal, segments):
    """mask_mode='praxis' against Praxis' own mask arithmetic: padded query rows are masked whole
    (a uniform softmax over every key) wherever the padding mask meets a causal or segment mask;
    a non-causal layer without segments masks the padded keys only."""
    att = _build(causal=causal, mask_mode="praxis")
    x = _x()
    seg = SEGMENTS if segments else None
    y, probs = _fwd_probs(att, x, paddings=PADDINGS, segment_ids=seg)
    expected_probs = _praxis_probs(att, x, _praxis_mask(np.asarray(PADDINGS), causal=causal, segment_ids=seg))
    assert_matches_reference(probs, expected_probs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y, _praxis_output(att, x, expected_probs), rtol=1e-5, atol=1e-5)
    assert_same_math(_fwd(att, x, paddings=PADDINGS, segment_ids=seg), y)
    padded = np.asarray(PADDINGS) > 0.5
    if causal or segments:
        np.testing.assert_allclose(np.asarray(probs).transpose(0, 2, 1, 3)[padded], 1.0 / T, rtol=1e-6)
    # Real positions agree with the default mode. Padded ones differ where the default lets a
    # padded query see real keys: causal without segments (with segments, padding is segment 0,
    # whose keys are all masked, so the default's row is uniform too).
    plain = _fwd(_build(causal=causal), x, paddings=PADDINGS, segment_ids=seg)
    assert_same_math(np.asarray(y)[~padded], np.asarray(plain)[~padded])
    same = np.allclose(np.asarray(y)[padded], np.asarray(plain)[padded], atol=1e-5)
    assert same != (causal and not segments)


def test_probabilities_match_numpy_and_are_what_multiplies_v():
    """with_probs: [B, N, T, T] probabilities of the default mask (causal, padded keys), rows sum
    to 1, zero on masked pairs; the output is the plain forward's."""
    att = _build()
    x = _x()
    y, probs = _fwd_probs(att, x, paddings=PADDINGS)
    assert probs.shape == (B, N, T, T)
    mask = causal_mask(B, T) & (np.asarray(PADDINGS) < 0.5)[:, None, :]
    np.testing.assert_allclose(y, reference_attention(x, *_weights(att), mask=mask), rtol=1e-5, atol=1e-5)
    assert_same_math(_fwd(att, x, paddings=PADDINGS), y)
    expected = _praxis_probs(att, x, np.where(mask, 0.0, _LARGE_NEGATIVE)[:, None])
    assert_matches_reference(probs, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(probs).sum(-1), 1.0, rtol=1e-6)


def test_cross_probabilities_mask_padded_memory_only():
    att = _build(causal=False, mask_mode="praxis")
    x, memory = _x(), _x(seed=4, t=4)
    memory_paddings = jnp.asarray([[0, 0, 1, 1], [0, 0, 0, 1]], jnp.float32)
    y, probs, _ = jit(lambda a, x, m, p: a.cross_with_probs(x, m, EVAL, memory_paddings=p))(
        att, x, memory, memory_paddings
    )
    assert probs.shape == (B, N, T, 4)
    assert_matches_reference(
        np.asarray(probs) * np.asarray(memory_paddings)[:, None, None, :], 0.0, rtol=1e-7, atol=1e-7
    )
    np.testing.assert_allclose(np.asarray(probs).sum(-1), 1.0, rtol=1e-6)  # no query row is masked
    expected = jit(lambda a, x, m, p: a.cross(x, m, EVAL, memory_paddings=p)[0])(att, x, memory, memory_paddings)
    assert_same_math(y, expected)


def test_probabilities_in_training_are_after_dropout():
    """As Praxis returns them: the dropped-out, rescaled probabilities that multiplied v."""
    att = _build(dropout_prob=0.5)
    x = _x()
    run = jit(lambda a, x, k: a.with_probs(x, Context(key=k, mode=Mode.TRAIN))[:2])
    y, probs = run(att, x, jax.random.key(2))
    np.testing.assert_array_equal(y, apply(att, x, key=jax.random.key(2)))
    values = np.unique(np.round(np.asarray(probs) / 2.0, 6))
    assert np.any(np.asarray(probs) == 0.0) and len(values) > 2


def test_mask_mode_is_checked():
    with pytest.raises(ConfigError, match="mask_mode='paxml'"):
        AttentionConfig(mask_mode="paxml")


def test_cudnn_takes_the_causal_kernel_at_run_time_when_every_row_is_one_unpadded_segment(monkeypatch):
    """The trainer's batch always carries segment ids; cuDNN's fused causal kernel runs only when
    the mask they make is the causal one (checked per batch at run time), else the mask tensor.
    cuDNN stands in here as the XLA kernel (this runs on CPU), recording which form each call ran."""
    ran = []

    def fake_cudnn(q, k, v, mask, *, scale, causal_only, bias=None):
        jax.debug.callback(lambda: ran.append("is_causal" if causal_only else "mask"))
        causal = kernels.make_mask(q.shape[1], k.shape[1], causal=True)
        return kernels.xla_attention(q, k, v, causal if causal_only else mask, scale=scale)

    monkeypatch.setattr(kernels, "cudnn_attention", fake_cudnn)
    xla, cudnn = _build(), _build(implementation="cudnn")
    x = _x()
    one = jnp.ones((B, T), jnp.int32)
    packed = jnp.asarray([[1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 1, 1]])
    padded = one.at[1, -2:].set(0)
    for segment_ids, expected in [(one, "is_causal"), (packed, "mask"), (padded, "mask")]:
        ran.clear()
        paddings = 1.0 - (segment_ids > 0)
        kwargs = dict(segment_ids=segment_ids, paddings=paddings)
        y = jax.block_until_ready(_fwd(cudnn, x, **kwargs))
        assert ran == [expected]
        assert_same_math(y, _fwd(xla, x, **kwargs))


def test_one_segment_per_row_is_true_only_for_unpacked_unpadded_rows():
    one = jnp.ones((2, 4), jnp.int32)
    assert kernels.one_segment_per_row(one, None)
    assert kernels.one_segment_per_row(one * 3, jnp.ones((2, 4), bool))
    assert not kernels.one_segment_per_row(one.at[0, 2:].set(2), None)
    assert not kernels.one_segment_per_row(one, jnp.ones((2, 4), bool).at[1, 3].set(False))
    assert kernels.one_segment_per_row(None, None)
