"""The layer mechanism: Context (keys, state, summaries, aux losses, mode), variable, init, apply, call."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float, PRNGKeyArray
from layer_reference import key

from pax_eqx.config import Config, config
from pax_eqx.layers import (
    Context,
    LinearConfig,
    Mode,
    Variable,
    apply,
    call,
    init,
    mean_sync_markers,
    split_state,
    variable,
)


@config
class ProbeConfig(Config):
    """A layer that uses every Context feature once, so each can be checked by value."""

    dims: int = 3

    def build(self, key: PRNGKeyArray) -> "Probe":
        return Probe(self, key=key)


class Probe(eqx.Module):
    linear: eqx.Module
    count: Variable
    total: Variable

    def __init__(self, cfg: ProbeConfig, *, key: PRNGKeyArray):
        self.linear = LinearConfig(input_dims=cfg.dims, output_dims=cfg.dims).build(key)
        self.count = variable(jnp.zeros((), jnp.int32))
        self.total = variable(jnp.zeros((cfg.dims,)), mean_sync=True)

    def __call__(self, x: Float[Array, "batch dims"], ctx: Context) -> tuple[Float[Array, "batch dims"], Context]:
        ctx = ctx.add_summary("x_mean", jnp.mean(x))
        key, ctx = ctx.next_key()
        y = self.linear(x) + jax.random.normal(key, x.shape)
        ctx = ctx.add_aux_loss("y_sq", jnp.mean(y**2), weight=0.5)
        ctx = ctx.update_var(self.count, ctx.get_var(self.count) + 1)
        ctx = ctx.update_var(self.total, ctx.get_var(self.total) + jnp.sum(x, 0))
        return y, ctx


X = jnp.arange(6.0).reshape(2, 3)


def _key_bits(k):
    return tuple(np.asarray(jax.random.key_data(k)).ravel().tolist())


def test_next_key_never_reuses_a_key():
    root = key(0)
    ctx = Context(key=root)
    seen = [_key_bits(root)]
    for _ in range(20):
        k, ctx = ctx.next_key()
        seen.append(_key_bits(k))
    seen.append(_key_bits(ctx.key))
    assert len(set(seen)) == len(seen)


def test_next_key_is_deterministic_and_works_under_jit():
    def two_draws(key):
        ctx = Context(key=key)
        k1, ctx = ctx.next_key()
        k2, ctx = ctx.next_key()
        return jax.random.normal(k1), jax.random.normal(k2)

    eager = two_draws(key(5))
    jitted = jax.jit(two_draws)(key(5))
    np.testing.assert_array_equal(eager, jitted)
    assert eager[0] != eager[1]


def test_missing_key_names_the_layer_and_the_fix():
    probe, state = init(ProbeConfig(), key(0))
    with pytest.raises(ValueError, match=r"layer outer/probe needs randomness in mode 'train'.*pass `key=`"):
        call(probe, X, Context(state=state).push("outer"), "probe")


def test_missing_state_names_the_fix():
    probe = ProbeConfig().build(key(0))
    with pytest.raises(ValueError, match="no state.*pax_eqx.layers.init"):
        apply(probe, X, key=key(1))


def test_apply_mutable_returns_state_summaries_and_aux():
    probe, state = init(ProbeConfig(), key(0))
    k = key(1)
    y = apply(probe, X, state=state, key=k)
    y2, ctx = apply(probe, X, state=state, key=k, mutable=True)
    np.testing.assert_array_equal(y, y2)  # same key, same state: same output; state reusable
    noise = jax.random.normal(jax.random.split(k)[1], X.shape)
    np.testing.assert_allclose(y, X @ probe.linear.w + noise, rtol=1e-5, atol=1e-6)
    assert set(ctx.summaries) == {"x_mean"} and set(ctx.aux_losses) == {"y_sq"}
    np.testing.assert_allclose(ctx.summaries["x_mean"], 2.5)
    np.testing.assert_allclose(ctx.aux_losses["y_sq"], 0.5 * np.mean(np.asarray(y) ** 2), rtol=1e-5)
    assert int(ctx.get_var(probe.count)) == 1
    np.testing.assert_allclose(ctx.get_var(probe.total), [3.0, 5.0, 7.0])
    assert int(state.get(probe.count)) == 0  # the input state is never changed


def test_state_threads_through_repeated_calls_under_jit():
    probe, state = init(ProbeConfig(), key(0))
    step = eqx.filter_jit(lambda m, s, k: apply(m, X, state=s, key=k, mutable=True)[1].state)
    for i in range(3):
        state = step(probe, state, key(i))
    assert int(state.get(probe.count)) == 3
    np.testing.assert_allclose(state.get(probe.total), [9.0, 15.0, 21.0])


def test_call_scopes_side_output_names():
    probe, state = init(ProbeConfig(), key(0))
    ctx = Context(key=key(1), state=state)
    _, ctx = call(probe, X, ctx.push("block"), "ffn")
    _, ctx = call(probe, X, ctx, "ffn2")
    assert ctx.scope == ("block",)
    assert set(ctx.summaries) == {"block/ffn/x_mean", "block/ffn2/x_mean"}
    assert set(ctx.aux_losses) == {"block/ffn/y_sq", "block/ffn2/y_sq"}


def test_summary_names_are_unique_and_aux_losses_accumulate():
    ctx = Context().add_summary("a", jnp.ones(()))
    with pytest.raises(ValueError, match="'a' was added twice"):
        ctx.add_summary("a", jnp.zeros(()))
    ctx = ctx.add_aux_loss("l", jnp.asarray(2.0, jnp.bfloat16)).add_aux_loss("l", jnp.asarray(3.0), weight=0.1)
    assert ctx.aux_losses["l"].dtype == jnp.float32
    np.testing.assert_allclose(ctx.aux_losses["l"], 2.3, rtol=1e-6)


def test_context_is_immutable():
    ctx = Context(key=key(0))
    _, new = ctx.next_key()
    assert new is not ctx and _key_bits(ctx.key) == _key_bits(key(0))
    with_summary = ctx.add_summary("s", jnp.ones(()))
    assert ctx.summaries == {} and "s" in with_summary.summaries


def test_mode_is_explicit_and_static():
    assert Context().mode is Mode.TRAIN and Context().is_training
    ctx = Context(mode=Mode.EVAL)
    assert ctx.mode is Mode.EVAL and not ctx.is_training
    assert Mode.DECODE.value == "decode"
    leaves = jax.tree.leaves(Context(key=key(0), mode=Mode.EVAL))
    assert len(leaves) == 1  # the mode is part of the tree structure, not a traced leaf


def test_init_gives_deterministic_markers_so_states_are_interchangeable():
    a, state_a = init(ProbeConfig(), key(0))
    b, state_b = init(ProbeConfig(), key(1))
    assert jax.tree.structure(a) == jax.tree.structure(b)
    assert a.count.marker == b.count.marker == "Probe.count"
    assert a.total.marker == "Probe.total#mean_sync"
    _, ctx = apply(b, X, state=state_a, key=key(2), mutable=True)
    assert int(ctx.get_var(b.count)) == 1


def test_mean_sync_markers_lists_only_mean_synced_variables():
    probe, _ = init(ProbeConfig(), key(0))
    assert mean_sync_markers(probe) == {"Probe.total#mean_sync"}


def test_split_state_on_a_built_model_matches_init():
    built = ProbeConfig().build(key(0))
    model, state = split_state(built)
    assert jax.tree.structure(model) == jax.tree.structure(init(ProbeConfig(), key(0))[0])
    np.testing.assert_array_equal(state.get(model.total), np.zeros(3))


def test_variables_are_not_parameters():
    probe, _ = init(ProbeConfig(), key(0))
    grads = eqx.filter_grad(lambda m: jnp.sum(m.linear(X)))(probe)
    assert [g.shape for g in jax.tree.leaves(grads)] == [(3, 3)]


def test_aux_loss_gradient_flows_to_parameters():
    probe, state = init(ProbeConfig(), key(0))
    k = key(1)

    def total(m):
        _, ctx = apply(m, X, state=state, key=k, mutable=True)
        return sum(ctx.aux_losses.values())

    g = eqx.filter_grad(total)(probe).linear.w
    y = apply(probe, X, state=state, key=k)
    # d/dw 0.5 * mean(y^2) with y = x w + noise: x^T y / y.size.
    np.testing.assert_allclose(g, np.asarray(X).T @ np.asarray(y) / y.size, rtol=1e-5, atol=1e-6)
