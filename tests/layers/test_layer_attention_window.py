"""The sliding attention window against a dense masked numpy formula, decode against the forward,
and a stack's local/global alternation (Gemma 2's) against its list of layers."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from layer_reference import jit, random_module, random_normal, reference_attention
from tolerances import assert_same_math

from pax_eqx.config import ConfigError
from pax_eqx.layers import AttentionConfig, Context, Mode
from pax_eqx.layers.attention_window import GlobalWindowConfig, SlidingWindowConfig
from pax_eqx.layers.repeats import StackedTransformerConfig
from pax_eqx.layers.transformers import TransformerConfig
from pax_eqx.models.language_model import LanguageModelConfig

B, T, D, N, H = 2, 9, 8, 4, 4
EVAL = Context(mode=Mode.EVAL)


def _window_mask(t: int, left: int, right: int, causal: bool) -> np.ndarray:
    """[B, T, T]: query i sees key j when i - left < j <= i + right (and j <= i when causal),
    written from the definition, one pair at a time."""
    m = np.zeros((t, t), bool)
    for i in range(t):
        for j in range(t):
            m[i, j] = (j > i - left) and (j <= i if causal else j <= i + right)
    return np.broadcast_to(m, (B, t, t))


def _attention(window, causal=True, **kw):
    cfg = AttentionConfig(implementation="xla", causal=causal, window=window)
    return random_module(functools.partial(cfg.build, input_dims=D, num_heads=N, dim_per_head=H, **kw), 0)


@pytest.mark.parametrize(("left", "right", "causal"), [(3, 0, True), (1, 0, True), (3, 2, False)])
def test_sliding_window_matches_a_dense_masked_formula(left, right, causal):
    att = _attention(SlidingWindowConfig(left_context=left, right_context=right), causal=causal)
    x = random_normal((B, T, D), 1)
    y = jit(lambda a, x: a(x, EVAL)[0])(att, x)
    w = (np.asarray(att.w_q), np.asarray(att.w_k), np.asarray(att.w_v), np.asarray(att.w_o))
    np.testing.assert_allclose(y, reference_attention(x, *w, mask=_window_mask(T, left, right, causal)), atol=1e-5)


def test_a_window_as_long_as_the_sequence_is_global():
    x = random_normal((B, T, D), 1)
    fwd = jit(lambda a, x: a(x, EVAL)[0])
    assert_same_math(fwd(_attention(SlidingWindowConfig(left_context=T)), x), fwd(_attention(GlobalWindowConfig()), x))


def test_windowed_decode_equals_the_forward():
    """Prefill 4 tokens, then one at a time, past the window of 3: the same outputs as the forward."""
    att = _attention(SlidingWindowConfig(left_context=3), num_kv_heads=2, use_rotary=True)
    x = random_normal((B, T, D), 1)

    @jit
    def prefill_then_step(att, x):
        pos = jnp.broadcast_to(jnp.arange(T), (B, T))
        valid = jnp.ones((B, T), bool)
        cache = att.init_cache(B, T)
        out, cache = att.decode(x[:, :4], cache, jnp.int32(0), pos[:, :4], valid)
        outs = [out]
        for t in range(4, T):
            out, cache = att.decode(x[:, t : t + 1], cache, jnp.int32(t), pos[:, t : t + 1], valid)
            outs.append(out)
        return jnp.concatenate(outs, axis=1)

    assert_same_math(prefill_then_step(att, x), jit(lambda a, x: a(x, EVAL)[0])(att, x))


def test_window_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="left_context"):
        SlidingWindowConfig(left_context=0)
    with pytest.raises(ConfigError, match="right_context=2 with a causal attention"):
        AttentionConfig(window=SlidingWindowConfig(left_context=4, right_context=2))


def _stack(repeat: bool, interval: int = 2, num_layers: int = 2, **kw) -> StackedTransformerConfig:
    window = SlidingWindowConfig(left_context=2)
    block = TransformerConfig(attention=AttentionConfig(implementation="xla", window=window))
    return StackedTransformerConfig(
        num_layers=num_layers, model_dims=D, hidden_dims=16, num_heads=N, block=block, repeat=repeat,
        global_layer_interval=interval, **kw,
    )  # fmt: skip


def test_global_layer_interval_alternates_local_and_global_layers():
    """Layer 0 windowed and 1 global (Gemma 2's order), the scanned stack equal to the list."""
    key = jax.random.key(0)
    listed, scanned = _stack(False).build(key), _stack(True).build(key)
    assert [layer.attention.window for layer in listed.layers] == [(2, 0), (0, 0)]
    assert [layer.attention.window for layer in scanned.block] == [(2, 0), (0, 0)]
    x = random_normal((B, T, D), 1)
    fwd = jit(lambda s, x: s(x, EVAL)[0])
    assert_same_math(fwd(scanned, x), fwd(listed, x))
    # Not the same function as every layer windowed: the global layers see the whole sequence.
    assert not np.allclose(fwd(scanned, x), fwd(_stack(True, interval=0).build(key), x), atol=1e-4)


def test_global_layer_interval_errors_name_the_field():
    with pytest.raises(ConfigError, match="num_layers=4 is not a multiple of global_layer_interval=3"):
        _stack(True, interval=3, num_layers=4)
    with pytest.raises(ConfigError, match="model.global_layer_interval=2 has no effect"):
        LanguageModelConfig(
            vocab_size=8, max_seq_len=8, num_layers=2, model_dims=8, hidden_dims=8, num_heads=2,
            global_layer_interval=2,
        ).validate()  # fmt: skip


def test_query_scale_dims_replaces_the_head_dim_in_the_scale():
    cfg = AttentionConfig(implementation="xla", query_scale_dims=24.0)
    att = random_module(functools.partial(cfg.build, input_dims=D, num_heads=N, dim_per_head=H), 0)
    x = random_normal((B, T, D), 1)
    y = jit(lambda a, x: a(x, EVAL)[0])(att, x)
    w = (np.asarray(att.w_q), np.asarray(att.w_k), np.asarray(att.w_v), np.asarray(att.w_o))
    causal = np.broadcast_to(np.tril(np.ones((T, T), bool)), (B, T, T))
    np.testing.assert_allclose(y, reference_attention(x, *w, mask=causal, scale=24.0**-0.5), atol=1e-5)
