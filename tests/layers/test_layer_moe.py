"""MoEFeedForward against NumPy: each expert a dense feed-forward, the router's choices from the
NumPy routing loops of test_layer_moe_routing, the outputs summed by the gates."""

import functools

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from layer_reference import jit, key, random_module, random_normal, softmax
from test_layer_moe_routing import reference_load_balance_loss, reference_routing
from tolerances import assert_same_math

from pax_eqx.config import ConfigError
from pax_eqx.layers import ActivationConfig, Context, Mode, MoEFeedForwardConfig, swiglu
from pax_eqx.sharding.logical import logical_axes

B, T, M, H = 2, 8, 6, 10


def _layer(seed=0, scale=0.5, **fields):
    cfg = MoEFeedForwardConfig(**fields)
    return random_module(functools.partial(cfg.build, model_dims=M, hidden_dims=H), seed=seed, scale=scale)


@jit
def _apply(layer, x, ctx, paddings=None):
    return layer(x, ctx, paddings=paddings)


def _relu(x):
    return np.maximum(x, 0.0)


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _expert_outputs(layer, x, act=_relu):
    """[E, ..., M]: every expert's dense feed-forward on every token, float64."""
    x = np.asarray(x, np.float64)
    out = []
    for e in range(layer.num_experts):
        h = x @ np.asarray(layer.wi[e], np.float64)
        if layer.wi_gate is None:
            h = act(h)
        else:
            h = act(x @ np.asarray(layer.wi_gate[e], np.float64)) * h
        out.append(h @ np.asarray(layer.wo[e], np.float64))
    return np.stack(out)


def _router_logits(layer, x_groups):
    return np.asarray(x_groups, np.float64) @ np.asarray(layer.gate, np.float64)


def _eval(mode=Mode.EVAL, seed=None):
    return Context(mode=mode, key=None if seed is None else key(seed))


@pytest.mark.parametrize(
    "fields, act",
    [
        (dict(), _relu),
        (dict(dropless=True), _relu),
        (dict(activation=swiglu()), _silu),
    ],
    ids=["capacity", "dropless", "swiglu"],
)
def test_uniform_router_over_every_expert_is_the_average_of_the_experts(fields, act):
    """top_k = E, zero router weights (uniform gates 1/E), capacity for every token: the layer
    is the mean of the E dense feed-forwards."""
    if not fields.get("dropless"):
        fields["capacity_factor"] = 4.0  # C = S: no token can be dropped
    layer = _layer(num_experts=4, top_k=4, **fields)
    layer = eqx.tree_at(lambda m: m.gate, layer, jnp.zeros_like(layer.gate))
    x = random_normal((B, T, M), seed=1)
    y, ctx = _apply(layer, x, _eval())
    np.testing.assert_allclose(y, _expert_outputs(layer, x, act).mean(0), rtol=1e-4, atol=1e-5)
    assert float(ctx.summaries["dropped_fraction"]) == 0.0
    for e in range(4):
        np.testing.assert_allclose(ctx.summaries[f"expert_load_e{e}"], 0.25)
    np.testing.assert_allclose(ctx.summaries["router_entropy"], np.log(4), rtol=1e-6)
    np.testing.assert_allclose(ctx.aux_losses["load_balance_loss"], 1.0, rtol=1e-6)


def _reference_layer(layer, x, paddings, cap, k, num_groups=None, logit_cap=0.0):
    """y[g, s] = sum_e gate[g, s, e] * FF_e(x[g, s]) with the NumPy routing's gates."""
    groups = num_groups or B
    xg = np.asarray(x, np.float64).reshape(groups, -1, M)
    pg = None if paddings is None else np.asarray(paddings).reshape(groups, -1)
    logits = _router_logits(layer, xg)
    if logit_cap:
        logits = logit_cap * np.tanh(logits / logit_cap)
    combine, gates, _, dropped = reference_routing(logits, pg, cap, k)
    y = np.einsum("gse,egsm->gsm", gates, _expert_outputs(layer, xg))
    return y.reshape(B, T, M), logits, pg, dropped


def test_top2_with_capacity_and_padding_matches_reference():
    """capacity_factor 0.5 over 4 experts and 8 tokens: capacity 1, so most assignments drop."""
    layer = _layer(num_experts=4, capacity_factor=0.5, load_balance_loss_weight=0.01, z_loss_weight=1e-3, scale=1.0)
    x = random_normal((B, T, M), seed=2)
    paddings = np.zeros((B, T), np.float32)
    paddings[1, 5:] = 1.0
    y, ctx = _apply(layer, x, _eval(), jnp.asarray(paddings))
    ref, logits, pg, dropped = _reference_layer(layer, x, paddings, 1, 2)
    assert dropped.sum() > 0
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)
    assert np.all(np.asarray(y)[1, 5:] == 0)
    tokens = (paddings == 0).sum()
    np.testing.assert_allclose(ctx.summaries["dropped_fraction"], dropped.sum() / (2 * tokens), rtol=1e-6)
    balance = reference_load_balance_loss(logits, pg)
    np.testing.assert_allclose(ctx.summaries["load_balance_loss"], balance, rtol=1e-5)
    np.testing.assert_allclose(ctx.aux_losses["load_balance_loss"], 0.01 * balance, rtol=1e-5)
    keep = pg == 0
    z = np.log(np.exp(logits).sum(-1))[keep] ** 2
    np.testing.assert_allclose(ctx.aux_losses["router_z_loss"], 1e-3 * z.mean(), rtol=1e-5)
    p = softmax(logits)[keep]
    np.testing.assert_allclose(ctx.summaries["router_entropy"], -(p * np.log(p)).sum(-1).mean(), rtol=1e-5)
    load = sum(float(ctx.summaries[f"expert_load_e{e}"]) for e in range(4))
    np.testing.assert_allclose(load, 1.0, rtol=1e-6)


def test_num_groups_routes_the_whole_batch_together():
    layer = _layer(num_experts=4, num_groups=1, capacity_factor=1.0, scale=1.0)
    x = random_normal((B, T, M), seed=3)
    y, _ = _apply(layer, x, _eval())
    cap = 4  # S = 16 tokens: floor(16 * 1.0 / 4) = 4
    ref, *_ = _reference_layer(layer, x, None, cap, 2, num_groups=1)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(ConfigError, match="num_groups=3"):
        _layer(num_experts=4, num_groups=3)(x, _eval())


def test_gating_logit_cap_bounds_the_router_logits():
    # A cap the logits reach but do not saturate at (float32 tanh = 1.0 exactly would make ties).
    layer = _layer(num_experts=4, gating_logit_cap=2.0, capacity_factor=1.0, scale=1.0)
    x = random_normal((B, T, M), seed=12)
    y, ctx = _apply(layer, x, _eval())
    ref, logits, *_ = _reference_layer(layer, x, None, 4, 2, logit_cap=2.0)
    assert np.abs(logits).max() > 1.5
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ctx.summaries["router_z_loss"], np.mean(np.log(np.exp(logits).sum(-1)) ** 2), rtol=1e-5)


def test_dropless_topk_is_the_per_token_sum_over_its_k_experts():
    layer = _layer(num_experts=5, top_k=3, dropless=True, scale=1.0)
    x = random_normal((B, T, M), seed=4)
    y, _ = _apply(layer, x, _eval())
    xs = np.asarray(x, np.float64).reshape(-1, M)
    expected = np.zeros_like(xs)
    for i, token in enumerate(xs):
        probs = softmax(token @ np.asarray(layer.gate, np.float64))
        top = np.argsort(-probs)[:3]
        gates = probs[top] / (probs[top].sum() + 1e-9)
        outputs = _expert_outputs(layer, token[None])[:, 0]
        expected[i] = sum(g * outputs[e] for g, e in zip(gates, top))
    np.testing.assert_allclose(y, expected.reshape(B, T, M), rtol=1e-4, atol=1e-5)


def test_padded_tokens_take_no_capacity_and_do_not_change_the_others():
    layer = _layer(num_experts=4, scale=1.0)
    x = np.asarray(random_normal((B, T, M), seed=5))
    paddings = np.zeros((B, T), np.float32)
    paddings[:, :3] = 1.0
    y1, _ = _apply(layer, jnp.asarray(x), _eval(), jnp.asarray(paddings))
    x2 = x.copy()
    x2[:, :3] = 100.0 * np.asarray(random_normal((B, 3, M), seed=6))
    y2, _ = _apply(layer, jnp.asarray(x2), _eval(), jnp.asarray(paddings))
    np.testing.assert_array_equal(y1, y2)
    assert np.all(np.asarray(y1)[:, :3] == 0)
    # The real tokens are routed as if the padded ones were not there at all.
    y3, _ = _apply(layer, jnp.asarray(x[:, 3:].reshape(B, T - 3, M)), _eval())
    ref, *_ = _reference_layer(layer, x, paddings, 4, 2)
    np.testing.assert_allclose(y1, ref, rtol=1e-4, atol=1e-5)
    # The same capacity in both calls: S=8 and S=5 both give 4 (floor(S * 2 / 4) rounded up to 4).
    assert_same_math(np.asarray(y1)[:, 3:], y3)


def test_jitter_only_in_training_and_deterministic_per_key():
    layer = _layer(num_experts=4, jitter_eps=0.3, scale=1.0)
    plain = _layer(num_experts=4, scale=1.0)  # the same weights (same seed), no jitter
    x = random_normal((B, T, M), seed=7)
    train_a, _ = _apply(layer, x, _eval(Mode.TRAIN, seed=1))
    train_b, _ = _apply(layer, x, _eval(Mode.TRAIN, seed=1))
    train_c, _ = _apply(layer, x, _eval(Mode.TRAIN, seed=2))
    evaluated, _ = _apply(layer, x, _eval())
    np.testing.assert_array_equal(train_a, train_b)
    assert not np.allclose(train_a, train_c)
    np.testing.assert_array_equal(evaluated, _apply(plain, x, _eval())[0])
    assert not np.allclose(train_a, evaluated)
    with pytest.raises(ValueError, match="needs randomness"):
        layer(x, _eval(Mode.TRAIN))


def test_sampled_second_expert_needs_a_key_only_in_training():
    layer = _layer(num_experts=4, second_expert_policy="sampling", capacity_factor=4.0, scale=1.0)
    greedy = _layer(num_experts=4, capacity_factor=4.0, scale=1.0)  # the same weights
    x = random_normal((B, T, M), seed=8)
    sampled_a, _ = _apply(layer, x, _eval(Mode.TRAIN, seed=3))
    sampled_b, _ = _apply(layer, x, _eval(Mode.TRAIN, seed=3))
    np.testing.assert_array_equal(sampled_a, sampled_b)
    evaluated, _ = _apply(layer, x, _eval())
    np.testing.assert_array_equal(evaluated, _apply(greedy, x, _eval())[0])
    assert not np.allclose(sampled_a, evaluated)


def test_gradient_reaches_the_router_and_every_expert_weight():
    layer = _layer(num_experts=4, activation=swiglu(), z_loss_weight=1e-2, scale=1.0)
    x = random_normal((B, T, M), seed=9)

    def loss(layer, x):
        y, ctx = layer(x, _eval(Mode.TRAIN))
        return jnp.sum(y**2) + sum(ctx.aux_losses.values())

    grads = jit(eqx.filter_grad(loss))(layer, x)
    for name in ("gate", "wi", "wi_gate", "wo"):
        g = np.asarray(getattr(grads, name))
        assert np.all(np.isfinite(g)) and np.any(g != 0), name
    # Every expert that received a token gets a gradient.
    assert np.all(np.abs(np.asarray(grads.wo)).sum(axis=(1, 2)) > 0)


def test_side_outputs_are_named_under_the_scope_and_losses_only_when_weighted():
    layer = _layer(num_experts=3, load_balance_loss_weight=0.0)
    x = random_normal((1, 4, M), seed=10)
    _, ctx = _apply(layer, x, _eval().push("moe"))
    assert ctx.aux_losses == {}
    assert set(ctx.summaries) == {
        "moe/load_balance_loss", "moe/router_z_loss", "moe/dropped_fraction", "moe/router_entropy",
        "moe/expert_load_e0", "moe/expert_load_e1", "moe/expert_load_e2",
    }  # fmt: skip
    assert all(np.ndim(v) == 0 for v in ctx.summaries.values())  # scalars: a stack adds [layers]
    y, none = jit(lambda layer, x: layer(x, None))(layer, x)  # a decode step: no context, EVAL behaviour
    assert none is None
    assert_same_math(y, _apply(layer, x, _eval())[0])


def test_keeps_the_input_dtype():
    layer = _layer(num_experts=4)
    y, _ = _apply(layer, random_normal((B, T, M), seed=11).astype(jnp.bfloat16), _eval())
    assert y.dtype == jnp.bfloat16


def test_weights_shapes_axes_and_init():
    cfg = MoEFeedForwardConfig(num_experts=4, activation=swiglu())
    layer = jit(functools.partial(cfg.build, model_dims=16, hidden_dims=32))(key(0))
    assert (layer.gate.shape, layer.wi.shape, layer.wi_gate.shape, layer.wo.shape) == (
        (16, 4), (4, 16, 32), (4, 16, 32), (4, 32, 16),
    )  # fmt: skip
    axes = logical_axes(layer)
    assert axes.gate == ("embed", None)
    assert axes.wi == axes.wi_gate == ("expert", "embed", "mlp")
    assert axes.wo == ("expert", "mlp", "embed")
    limit = np.sqrt(6.0 / (16 + 32))  # xavier over each expert's [in, out]
    assert float(jnp.max(jnp.abs(layer.wi))) <= limit
    assert not np.allclose(layer.wi[0], layer.wi[1])  # experts differ
    plain = functools.partial(MoEFeedForwardConfig().build, model_dims=4, hidden_dims=8)
    assert eqx.filter_eval_shape(plain, key(0)).wi_gate is None
    with pytest.raises(ConfigError, match="model_dims"):
        cfg.build(key(0), model_dims=0, hidden_dims=8)


@pytest.mark.parametrize(
    "fields, named",
    [
        (dict(num_experts=0), "num_experts"),
        (dict(num_groups=-1), "num_groups"),
        (dict(top_k=5, num_experts=4), "top_k"),
        (dict(top_k=0), "top_k"),
        (dict(second_expert_policy="random"), "second_expert_policy"),
        (dict(second_expert_policy="sampling", top_k=3), "needs top_k=2"),
        (dict(capacity_factor=0.0), "capacity_factor"),
        (dict(min_capacity=0), "min_capacity"),
        (dict(dropless=True, capacity_factor=1.25), "capacity_factor=1.25 has no effect"),
        (dict(dropless=True, min_capacity=4), "min_capacity=4 has no effect"),
        (dict(top_k=1), "renormalize=False"),
        (dict(load_balance_loss_weight=-1.0), "load_balance_loss_weight"),
        (dict(z_loss_weight=-1.0), "z_loss_weight"),
        (dict(jitter_eps=1.0), "jitter_eps"),
        (dict(gating_logit_cap=-1.0), "gating_logit_cap"),
    ],
)
def test_config_errors_name_the_field(fields, named):
    with pytest.raises(ConfigError, match=named):
        MoEFeedForwardConfig(**fields)


def test_top1_without_renormalisation_and_logit_cap_build():
    cfg = MoEFeedForwardConfig(top_k=1, renormalize=False, gating_logit_cap=5.0, activation=ActivationConfig())
    assert eqx.filter_eval_shape(functools.partial(cfg.build, model_dims=4, hidden_dims=8), key(0)).top_k == 1
