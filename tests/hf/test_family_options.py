"""The layer options the open families need, each against a direct numpy formula: Qwen2's q/k/v
biases without an output bias (AttentionConfig.qkv_bias) and Llama 3.1's rotary frequencies
(rotary_scaling llama3); and their refusals."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_eqx.config import ConfigError
from pax_eqx.layers import Context, Mode
from pax_eqx.layers.attention_config import AttentionConfig
from pax_eqx.layers.position_embeddings import apply_rotary
from pax_eqx.layers.rotary_scaling import Llama3RotaryScalingConfig


def _numpy_attention(x, wq, wk, wv, wo, bq, bk, bv):
    """Causal multi-head attention, written out: x [T, D], w* [D, N, H], wo [N, H, D]."""
    q = np.einsum("td,dnh->tnh", x, wq) + bq
    k = np.einsum("td,dnh->tnh", x, wk) + bk
    v = np.einsum("td,dnh->tnh", x, wv) + bv
    logits = np.einsum("qnh,knh->nqk", q, k) / math.sqrt(q.shape[-1])
    t = x.shape[0]
    logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("nqk,knh,nhd->qd", probs, v, wo)


def test_qkv_bias_adds_biases_to_q_k_v_and_none_to_the_output():
    att = AttentionConfig(qkv_bias=True).build(jax.random.PRNGKey(0), input_dims=8, num_heads=2)
    assert att.b_o is None and att.b_q.shape == (2, 4)
    rng = np.random.default_rng(0)
    biases = {name: rng.normal(size=(2, 4)).astype(np.float32) for name in ("b_q", "b_k", "b_v")}
    for name, value in biases.items():
        att = _replace(att, name, jnp.asarray(value))
    x = rng.normal(size=(1, 5, 8)).astype(np.float32)
    y, _ = att(jnp.asarray(x), Context(mode=Mode.EVAL))
    want = _numpy_attention(x[0], *(np.asarray(w) for w in (att.w_q, att.w_k, att.w_v, att.w_o)), *biases.values())
    np.testing.assert_allclose(np.asarray(y[0]), want, atol=1e-5)


def _replace(module, name, value):
    import equinox as eqx

    return eqx.tree_at(lambda m: getattr(m, name), module, value)


def test_qkv_bias_with_use_bias_is_refused():
    with pytest.raises(ConfigError, match="qkv_bias=True has no effect with use_bias=True"):
        AttentionConfig(qkv_bias=True, use_bias=True)


def test_llama3_frequencies_follow_the_published_rule():
    """Meta's apply_scaling, in float64 by hand: high frequencies kept, low ones divided by the
    factor, the band between interpolated."""
    cfg = Llama3RotaryScalingConfig(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=64)
    dim, theta = 32, 10000.0
    base = 1.0 / theta ** (np.arange(0, dim, 2) / dim)
    want = []
    for f in base:
        wavelen = 2 * math.pi / f
        if wavelen < 64 / 4.0:
            want.append(f)
        elif wavelen > 64 / 1.0:
            want.append(f / 8.0)
        else:
            s = (64 / wavelen - 1.0) / (4.0 - 1.0)
            want.append((1 - s) * f / 8.0 + s * f)
    got = cfg.inverse_timescales(dim, theta)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    kinds = {"kept": got == base.astype(np.float32), "divided": np.isclose(got, base / 8, rtol=1e-6)}
    assert kinds["kept"].any() and kinds["divided"].any() and (~kinds["kept"] & ~kinds["divided"]).any()


def test_rotary_with_given_frequencies_rotates_by_position_times_frequency():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(1, 3, 2, 8)).astype(np.float32)
    inv = np.array([1.0, 0.3, 0.01, 0.001], np.float32)
    pos = np.array([[0, 5, 11]])
    y = np.asarray(apply_rotary(jnp.asarray(x), jnp.asarray(pos), inv_timescales=jnp.asarray(inv)))
    angle = pos[..., None, None] * inv  # [1, 3, 1, 4]
    x1, x2 = x[..., :4], x[..., 4:]
    want = np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle), x2 * np.cos(angle) + x1 * np.sin(angle)], -1)
    np.testing.assert_allclose(y, want, atol=1e-5)


def test_rotary_scaling_refusals_name_the_field():
    scaled = Llama3RotaryScalingConfig(original_max_position=64)
    with pytest.raises(ConfigError, match="rotary_scaling=.llama3.: llama3 .* has no effect without rotary positions"):
        AttentionConfig(rotary_scaling=scaled).build(jax.random.PRNGKey(0), input_dims=8, num_heads=2)
    with pytest.raises(ConfigError, match="rotary_scaling llama3 .* changes no rotary frequency"):
        AttentionConfig(rotary_scaling=Llama3RotaryScalingConfig()).build(
            jax.random.PRNGKey(0), input_dims=8, num_heads=2, use_rotary=True
        )
    with pytest.raises(ConfigError, match="high_freq_factor=1.0 must be above low_freq_factor=2.0"):
        Llama3RotaryScalingConfig(low_freq_factor=2.0, high_freq_factor=1.0)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"hidden_act": "gelu"}, "gelu"),  # the first releases' value: transformers reads it as the tanh form
        ({"hidden_act": "gelu", "hidden_activation": "gelu_pytorch_tanh"}, "gelu"),
        ({"hidden_act": "gelu_pytorch_tanh"}, "gelu"),
        ({"hidden_act": "silu", "hidden_activation": "gelu_pytorch_tanh"}, "silu"),  # hidden_activation unread
    ],
)
def test_gemma_computes_hidden_act_with_gelu_as_the_tanh_form(fields, expected):
    import json
    from pathlib import Path

    from pax_eqx.hf.families import model_config

    cfg = json.loads((Path(__file__).parents[1] / "fixtures" / "hf" / "gemma" / "config.json").read_text())
    cfg = {k: v for k, v in cfg.items() if k not in ("hidden_act", "hidden_activation")} | fields
    model, _ = model_config(cfg)
    assert model.block.activation.name == expected and model.block.activation.gated
