"""Local attention's decode: a rolling cache (memory bounded by the window) against the
whole-sequence forward, for sequences 3x the window, with ALiBi, Transformer-XL and T5 terms; a
server's pattern of chunked prefills with padded tails at per-row starts; Transformer-XL with
grouped kv heads. Praxis parity of each class is tests/praxis/test_praxis_local_attention.py."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from layer_reference import jit, random_module, random_normal
from tolerances import assert_same_math

from pax_eqx.config import ConfigError
from pax_eqx.layers import AttentionConfig, Context, Mode, RelativePositionBiasConfig, WeightInit
from pax_eqx.layers.attention_position_bias import AlibiConfig, TransformerXLConfig, alibi_slopes
from pax_eqx.layers.attention_window import SlidingWindowConfig

B, D, N, KV, H = 2, 16, 4, 2, 4
W = 3  # the window (left_context): the sequences are 3 W long
T = 3 * W
EVAL = Context(mode=Mode.EVAL)
TERMS = {
    "xl": dict(position_bias=TransformerXLConfig(embedding_dims=6)),
    "alibi+t5": dict(position_bias=AlibiConfig()),
}


def _attention(terms: str, window: int = W, kv_heads: int = KV):
    cfg = AttentionConfig(implementation="xla", window=SlidingWindowConfig(left_context=window), **TERMS[terms])
    relative = RelativePositionBiasConfig(num_buckets=8, max_distance=16) if terms == "alibi+t5" else None
    build = functools.partial(
        cfg.build, input_dims=D, num_heads=N, num_kv_heads=kv_heads, dim_per_head=H, use_rotary=True,
        relative_bias=relative,
    )  # fmt: skip
    return random_module(build, 0)


def _left_padded(pad: int) -> tuple[jax.Array, jax.Array]:
    """Row 1 padded at its first `pad` tokens: (valid [B, T], positions [B, T] counting real tokens)."""
    valid = np.ones((B, T), bool)
    valid[1, :pad] = False
    positions = np.maximum(np.cumsum(valid, axis=1) - 1, 0).astype(np.int32)
    return jnp.asarray(valid), jnp.asarray(positions)


@pytest.mark.parametrize("terms", list(TERMS))
def test_rolling_decode_equals_the_forward(terms):
    """A prefill of 5 tokens (more than the window of 3), then one token at a time to 9: the real
    positions' outputs are the forward's, and the cache holds 3 slots, not 9."""
    att = _attention(terms)
    x = random_normal((B, T, D), 1)
    valid, positions = _left_padded(2)
    cache = att.init_cache(B, T)
    assert cache.k.shape == (B, W, KV, H) and cache.index.shape == (B, W)

    @jit
    def decode_and_forward(att, x):
        out, c = att.decode(x[:, :5], cache, jnp.int32(0), positions[:, :5], valid)
        outs = [out]
        for t in range(5, T):
            out, c = att.decode(x[:, t : t + 1], c, jnp.int32(t), positions[:, t : t + 1], valid)
            outs.append(out)
        full, _ = att(x, EVAL, segment_pos=positions, paddings=1.0 - valid)
        return jnp.concatenate(outs, axis=1), full, c.index

    got, full, index = decode_and_forward(att, x)
    assert_same_math(np.asarray(got)[np.asarray(valid)], np.asarray(full)[np.asarray(valid)])
    assert np.asarray(index).tolist() == [[6, 7, 8]] * 2  # token p in slot p % 3: the last window


def test_chunked_prefill_with_padded_tails_at_per_row_starts():
    """A server's pattern (pax_eqx.serving): each row's prompt in chunks of 4 at its own start, a
    chunk's padded tail (not real: never written, so it cannot push real tokens out of the
    window), then one token per row at per-row starts. Row 0: 6 prompt tokens (chunks of 4 and 2);
    row 1: 3, then 4. The outputs of every real token are the forward's."""
    att = _attention("xl")
    x = random_normal((B, 12, D), 2)
    # (per-row start, per-row real tokens, tokens fed): two chunks of 4, then three single tokens
    calls = [([0, 0], [4, 3], 4), ([4, 3], [2, 4], 4)] + [([6 + t, 7 + t], [1, 1], 1) for t in range(3)]

    @jit
    def serve(att, x):
        cache = att.init_cache(B, 12)
        got = {}
        for start, n_valid, n in calls:
            index = np.asarray(start)[:, None] + np.arange(n)  # [B, n] token indices
            key_valid = np.arange(12)[None] < (np.asarray(start) + np.asarray(n_valid))[:, None]
            out, cache = att.decode(
                jnp.take_along_axis(x, jnp.asarray(index)[..., None], axis=1), cache, jnp.asarray(start),
                jnp.asarray(index), jnp.asarray(key_valid),
            )  # fmt: skip
            got.update({(r, start[r] + j): out[r, j] for r in range(B) for j in range(n_valid[r])})
        return got, att(x, EVAL)[0]

    got, full = serve(att, x)
    assert sorted(got) == [(0, p) for p in range(9)] + [(1, p) for p in range(10)]
    assert_same_math(jnp.stack(list(got.values())), jnp.stack([full[r, p] for r, p in got]))


def test_xl_with_grouped_kv_heads_is_multi_head_with_repeated_kv():
    """Query head n reads kv head n // 2, for the content term u . k as for the logits."""
    grouped = _attention("xl")
    repeat = lambda w: jnp.repeat(w, N // KV, axis=1)
    full = eqx.tree_at(
        lambda a: (a.w_q, a.w_k, a.w_v, a.w_o, a.position_bias), _attention("xl", kv_heads=N),
        (grouped.w_q, repeat(grouped.w_k), repeat(grouped.w_v), grouped.w_o, grouped.position_bias),
    )  # fmt: skip
    x = random_normal((B, T, D), 3)
    got, expected = jit(lambda a, b, x: (a(x, EVAL)[0], b(x, EVAL)[0]))(grouped, full, x)
    assert_same_math(got, expected)


def test_alibi_slopes_are_the_papers():
    """2^(-8 i / n) for a power of two; otherwise the nearest lower power's, then every other slope
    of the next one (the paper's reference code)."""
    np.testing.assert_allclose(alibi_slopes(8), 2.0 ** -np.arange(1, 9), rtol=1e-7)
    np.testing.assert_allclose(alibi_slopes(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3], rtol=1e-7)


def test_xl_weights_have_praxis_shapes_and_init():
    """w_pos [embedding dims, heads, head dim] (Praxis' pos_proj.w) by the attention's init, with the
    embedding's width as fan-in; u and v zeros (Praxis' Constant(0.0)); 0 dims = the input width."""
    xl = TransformerXLConfig(embedding_dims=6).build(
        jax.random.key(0), input_dims=D, num_heads=N, head_dim=H, init=WeightInit(method="xavier")
    )
    assert xl.w_pos.shape == (6, N, H) and not np.asarray(xl.u).any() and not np.asarray(xl.v).any()
    bound = np.sqrt(6.0 / (6 + N * H))  # Xavier uniform over fan-in 6, fan-out heads x head dim
    assert 0.5 * bound < np.abs(np.asarray(xl.w_pos)).max() <= bound
    plain = TransformerXLConfig(content_bias=False).build(
        jax.random.key(0), input_dims=D, num_heads=N, head_dim=H, init=WeightInit()
    )
    assert plain.w_pos.shape == (D, N, H) and plain.u is None and plain.v is None


def test_position_bias_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="embedding_dims"):
        TransformerXLConfig(embedding_dims=-1)
