"""Per-layer statistics (Pax's summaries at verbosity 4): the transformer's output RMS and the
attention's largest logit, against jnp formulas; at the default verbosity they are not traced."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from layer_reference import random_module, random_normal
from tolerances import assert_same_math

from pax_eqx.layers import AttentionConfig, Context, Mode, StackedTransformerConfig, TransformerConfig
from pax_eqx.layers.base import LAYER_STATISTICS_VERBOSITY

B, T, D, F, N, L = 2, 5, 8, 16, 4, 3


def _layer(**attention):
    cfg = TransformerConfig(attention=AttentionConfig(implementation="xla", **attention))
    return random_module(functools.partial(cfg.build, model_dims=D, hidden_dims=F, num_heads=N, num_kv_heads=2), 0)


def _stack(repeat: bool):
    block = TransformerConfig(attention=AttentionConfig(implementation="xla"))
    cfg = StackedTransformerConfig(num_layers=L, model_dims=D, hidden_dims=F, num_heads=N, block=block, repeat=repeat)
    return random_module(cfg, 0, scale=0.3)


def _run(module, x, verbosity=LAYER_STATISTICS_VERBOSITY, **kwargs):
    ctx = Context(mode=Mode.EVAL, summary_verbosity=verbosity)
    return eqx.filter_jit(lambda m, x: m(x, ctx, **kwargs))(module, x)


def _expected_logit_max(attention, x, mask):
    """max over allowed (query, key) pairs of q.k / sqrt(head_dim), kv heads repeated per group."""
    q, k, _ = attention.project_qkv(x, jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2]))
    k = jnp.repeat(k, q.shape[2] // k.shape[2], axis=2)
    logits = jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    return jnp.max(jnp.where(mask, logits, -jnp.inf))


def test_layer_records_output_rms_and_attention_logit_max():
    layer, x = _layer(), random_normal((B, T, D), 1)
    y, ctx = _run(layer, x)
    assert set(ctx.summaries) == {"activation_rms", "attention/logit_max"}
    np.testing.assert_allclose(ctx.summaries["activation_rms"], jnp.sqrt(jnp.mean(y**2)), rtol=1e-6)
    causal = jnp.tril(jnp.ones((T, T), bool))
    expected = _expected_logit_max(layer.attention, layer.attention_norm(x), causal)
    np.testing.assert_allclose(ctx.summaries["attention/logit_max"], expected, rtol=1e-5)


def test_logit_max_leaves_out_masked_pairs_and_is_taken_before_the_cap():
    layer, x = _layer(causal=False, logit_cap=0.1), random_normal((B, T, D), 2)
    segment_ids = jnp.asarray([[1, 1, 2, 2, 2], [1, 1, 1, 1, 0]])
    _, ctx = _run(layer, x, segment_ids=segment_ids)
    mask = (segment_ids[:, None, :, None] == segment_ids[:, None, None, :]) & (segment_ids > 0)[:, None, None, :]
    expected = _expected_logit_max(layer.attention, layer.attention_norm(x), mask)
    np.testing.assert_allclose(ctx.summaries["attention/logit_max"], expected, rtol=1e-5)
    assert expected > 0.1  # above the cap: the statistic shows what the cap acts on


@pytest.mark.parametrize("repeat", [True, False])
def test_a_stack_records_one_value_per_layer(repeat):
    stack, x = _stack(repeat), random_normal((B, T, D), 3)
    _, ctx = _run(stack, x)
    if repeat:
        rms = ctx.summaries["repeat/activation_rms"]
        assert rms.shape == (L,) and ctx.summaries["repeat/attention/logit_max"].shape == (L,)
        layers = [jax.tree.map(lambda a, i=i: a[i], stack.layers) for i in range(L)]
    else:
        rms = jnp.stack([ctx.summaries[f"x_layers_{i}/activation_rms"] for i in range(L)])
        layers = list(stack.layers)
    h, expected = x, []
    for layer in layers:
        h, _ = layer(h, Context(mode=Mode.EVAL))
        expected.append(jnp.sqrt(jnp.mean(h**2)))
    assert_same_math(rms, jnp.stack(expected))


@pytest.mark.parametrize("repeat", [True, False])
def test_default_verbosity_traces_no_statistic(repeat, monkeypatch):
    """At Pax's default verbosity (3) the program is exactly the one without any summary code:
    the same jaxpr as when `records` always says no, and no summary comes back."""
    stack, x = _stack(repeat), random_normal((B, T, D), 4)

    def trace():
        fn = lambda m, x: m(x, Context(mode=Mode.EVAL))
        return jax.make_jaxpr(fn)(stack, x), fn(stack, x)[1].summaries

    default, summaries = trace()
    assert summaries == {}
    with monkeypatch.context() as patch:
        patch.setattr(Context, "records", lambda self, verbosity: False)
        without_summaries, _ = trace()
    assert str(default) == str(without_summaries)
    recording = jax.make_jaxpr(lambda m, x: m(x, Context(mode=Mode.EVAL, summary_verbosity=4)))(stack, x)
    assert str(recording).count("reduce_max") > str(default).count("reduce_max")
    assert str(recording).count("sqrt") > str(default).count("sqrt")


def test_logit_max_is_recorded_on_the_cudnn_path_too(cudnn_tracing):
    """cuDNN's kernel does not hand its logits out; the statistic is computed from q and k beside
    it (traced here; only a GPU can run it), and only when asked for."""
    cfg = TransformerConfig(attention=AttentionConfig(implementation="cudnn"))
    layer = eqx.filter_eval_shape(
        functools.partial(cfg.build, model_dims=16, hidden_dims=F, num_heads=2), jax.random.key(0)
    )
    x = jax.ShapeDtypeStruct((B, 8, 16), jnp.bfloat16)
    record = lambda m, x: m(x, Context(mode=Mode.EVAL, summary_verbosity=4))[1].summaries
    jaxpr = jax.make_jaxpr(record)(layer, x)
    assert cudnn_tracing(jaxpr) == 1
    assert jax.eval_shape(record, layer, x)["attention/logit_max"].shape == ()
