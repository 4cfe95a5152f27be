"""Stacks: repeated (scan) == list with the same weights, remat == no remat, decode, side outputs."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float
from layer_reference import jit, key, random_module, random_normal
from tolerances import assert_matches_reference, assert_same_math, assert_same_math_tree

from pax_eqx.config import ConfigError
from pax_eqx.layers import (
    AttentionConfig,
    Context,
    Mode,
    StackedTransformer,
    StackedTransformerConfig,
    StackedTransformerRepeated,
    TransformerConfig,
    Variable,
    apply,
    mean_sync_markers,
    split_state,
    variable,
)

B, T, D, L = 2, 5, 8, 2


def _cfg(**kw):
    block = TransformerConfig(attention=AttentionConfig(implementation="xla"))
    base = dict(num_layers=L, model_dims=D, hidden_dims=16, num_heads=2, num_kv_heads=1, block=block)
    return StackedTransformerConfig(**{**base, **kw})


def _x(seed=1):
    return random_normal((B, T, D), seed)


def _with_layers(cfg: StackedTransformerConfig, layers):
    """The stack `cfg` builds, holding the given layers (no initialisation is run)."""
    return eqx.tree_at(lambda s: s.layers, eqx.filter_eval_shape(cfg.build, jax.random.key(0)), layers)


@functools.cache
def _repeated() -> StackedTransformerRepeated:
    return random_module(_cfg(), seed=0, scale=0.3)


def _sliced(repeated: StackedTransformerRepeated) -> tuple:
    return tuple(jax.tree.map(lambda a, i=i: a[i], repeated.layers) for i in range(L))


@jit
def _fwd(stack, x):
    return apply(stack, x, mode=Mode.EVAL)


@jit
def _grad(stack, x):
    """(outputs, gradients of sum(outputs^2)) in one program."""

    def loss(stack):
        y = apply(stack, x, mode=Mode.EVAL)
        return jnp.sum(y**2), y

    (_, y), grads = eqx.filter_value_and_grad(loss, has_aux=True)(stack)
    return y, grads


def test_real_build_shapes_and_independent_layers():
    rep = _cfg().build(key(0))
    assert isinstance(rep, StackedTransformerRepeated)
    assert rep.layers.attention.w_q.shape == (L, D, 2, 4)
    w = rep.layers.ff_in.linear.w
    assert not np.allclose(w[0], w[1])  # each layer gets its own key
    lst = eqx.filter_eval_shape(_cfg(repeat=False).build, jax.random.key(0))
    assert isinstance(lst, StackedTransformer) and len(lst.layers) == L
    assert lst.layers[0].attention.w_q.shape == (D, 2, 4)


def test_repeated_equals_list_with_the_same_weights():
    rep = _repeated()
    lst = _with_layers(_cfg(repeat=False), _sliced(rep))
    x = _x()
    y = _fwd(rep, x)
    assert y.shape == (B, T, D)
    assert_same_math(y, _fwd(lst, x))


def test_outputs_and_gradients_agree_across_repeat_and_remat():
    """The list, and every remat policy (which only changes what the backward pass recomputes),
    give the repeated stack's outputs and gradients."""
    rep = _repeated()
    x = _x()
    y_rep, g_rep = _grad(rep, x)
    expected = jax.tree.leaves(g_rep.layers)
    variants = {
        "list": _with_layers(_cfg(repeat=False), _sliced(rep)),
        "list, remat full": _with_layers(_cfg(repeat=False, remat_policy="full"), _sliced(rep)),
        "remat full": _with_layers(_cfg(remat_policy="full"), rep.layers),
        "remat dots": _with_layers(_cfg(remat_policy="dots_with_no_batch_dims_saveable"), rep.layers),
        "remat dots+context": _with_layers(_cfg(remat_policy="dots_with_no_batch_dims_and_context"), rep.layers),
        "remat context+out": _with_layers(_cfg(remat_policy="save_context_and_out_proj"), rep.layers),
        "unrolled, remat full": _with_layers(_cfg(remat_policy="full", unroll=L), rep.layers),
    }
    for name, stack in variants.items():
        y, grads = _grad(stack, x)
        assert_same_math(y, y_rep, err_msg=name)
        layers = grads.layers
        if isinstance(layers, tuple):
            layers = jax.tree.map(lambda *a: jnp.stack(a), *layers)
        assert_same_math_tree(jax.tree.leaves(layers), expected, rtol=1e-4, err_msg=name)


def _saved_activations(policy: str) -> list[str]:
    """Shapes of the per-layer activations a scanned stack keeps for its backward pass (the
    scan's stacked residuals, as jax reports them; weights excluded)."""
    import contextlib
    import io

    stack = _with_layers(_cfg(remat_policy=policy), _repeated().layers)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        jax.ad_checkpoint.print_saved_residuals(lambda m, x: jnp.sum(_fwd(m, x)), stack, _x())
    return sorted(line.split()[0] for line in out.getvalue().splitlines() if "output of scan" in line)


def test_named_remat_policies_save_the_named_activations():
    """The attention layer tags Praxis' activation names; each policy keeps those and no more.
    (Names do not survive the scan in jax's report, so the shapes identify them: the layer
    input [L,B,T,D], context [L,B,T,N,H], out_proj [L,B,T,D].)"""
    x = f"f32[{L},{B},{T},{D}]"
    assert _saved_activations("full") == [x]
    context = _saved_activations("save_context_and_out_proj")
    assert sorted(set(context) - {x}) == [f"f32[{L},{B},{T},2,4]"] and context.count(x) == 2
    dots = _saved_activations("dots_with_no_batch_dims_saveable")
    with_context = _saved_activations("dots_with_no_batch_dims_and_context")
    assert len(with_context) == len(dots) + 1 and f"f32[{L},{B},{T},2,4]" in with_context


@pytest.mark.parametrize(
    "policy, forward_kernels", [("dots_with_no_batch_dims_saveable", 2), ("dots_with_no_batch_dims_and_context", 1)]
)
def test_which_policies_run_the_fused_attention_kernel_again_in_the_backward(cudnn_tracing, policy, forward_kernels):
    """cuDNN's backward reads its forward's output *and* softmax statistics. Saving only the dots
    runs the forward kernel a second time in the backward (the scan body's recompute); the
    `_and_context` policy keeps what the kernel returned, so it runs once."""
    block = TransformerConfig(attention=AttentionConfig(implementation="cudnn"))
    cfg = _cfg(block=block, model_dims=16, hidden_dims=32, num_kv_heads=0, remat_policy=policy)
    stack = cfg.build(jax.random.key(0))
    x = jnp.ones((B, 8, 16), jnp.bfloat16)
    loss = lambda m, x: jnp.sum(apply(m, x, mode=Mode.EVAL).astype(jnp.float32))
    assert cudnn_tracing(jax.make_jaxpr(jax.grad(loss))(stack, x)) == forward_kernels


def test_unrolled_scan_equals_rolled():
    unrolled = _with_layers(_cfg(unroll=L), _repeated().layers)
    x = _x()
    assert_same_math(_fwd(unrolled, x), _fwd(_repeated(), x))


def test_dropout_keys_in_a_scanned_stack():
    block = _cfg().block.replace(residual_dropout_prob=0.5)
    rep = random_module(_cfg(block=block), seed=0, scale=0.3)  # the same weights as _repeated()
    x = _x()
    train = jit(lambda m, x, k: apply(m, x, key=k))
    with pytest.raises(ValueError, match="needs randomness"):
        train(rep, x, None)
    a = train(rep, x, key(1))
    np.testing.assert_array_equal(a, train(rep, x, key(1)))
    assert not np.allclose(a, train(rep, x, key(2)))
    assert_same_math(_fwd(rep, x), _fwd(_repeated(), x))  # no dropout in EVAL


@pytest.mark.parametrize("repeat", [True, False])
def test_decode_equals_full_forward(repeat):
    stack = _repeated() if repeat else _with_layers(_cfg(repeat=False), _sliced(_repeated()))
    x = _x()

    @jit
    def prefill_then_step(stack, x):
        caches = stack.init_cache(B, T)
        pos = jnp.broadcast_to(jnp.arange(T), (B, T))
        valid = jnp.ones((B, T), bool)
        out, caches = stack.decode(x[:, :2], caches, jnp.int32(0), pos[:, :2], valid)
        outs = [out]
        for t in range(2, T):
            out, caches = stack.decode(x[:, t : t + 1], caches, jnp.int32(t), pos[:, t : t + 1], valid)
            outs.append(out)
        return jnp.concatenate(outs, 1)

    assert_same_math(prefill_then_step(stack, x), _fwd(stack, x))


def test_cache_shapes():
    rep, lst = _repeated(), _with_layers(_cfg(repeat=False), _sliced(_repeated()))
    assert eqx.filter_eval_shape(rep.init_cache, B, T).k.shape == (L, B, T, 1, 4)
    assert [c.k.shape for c in eqx.filter_eval_shape(lst.init_cache, B, T)] == [(B, T, 1, 4)] * L


@pytest.mark.parametrize("kw, match", [({"num_layers": 0}, "num_layers"), ({"unroll": 0}, "unroll"),
                                       ({"unroll": L + 1}, "unroll"), ({"model_dims": 0}, "model_dims"),
                                       ({"repeat": False, "unroll": 2}, "unroll.*no effect with repeat=False"),
                                       ({"remat_policy": "dots"}, "remat_policy")])  # fmt: skip
def test_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(**kw)


def test_stack_sizes_reach_every_layer():
    stack = eqx.filter_eval_shape(_cfg(dim_per_head=3, hidden_dims=12).build, jax.random.key(0))
    attention = stack.layers.attention
    assert attention.w_q.shape == (L, D, 2, 3) and attention.w_k.shape == (L, D, 1, 3)
    assert stack.layers.ff_in.linear.w.shape == (L, D, 12)


# Side outputs through a scanned stack --------------------------------------------------------
class ProbeBlock(eqx.Module):
    """A block with a per-layer weight that reports a summary and an aux loss and counts calls.

    Built from `scale` [D] (one layer) or [L, D] (stacked, as filter_vmap would make it)."""

    scale: Float[Array, "*layers embed"]
    calls: Variable
    mean_seen: Variable

    def __init__(self, scale):
        self.scale = scale
        self.calls = variable(jnp.zeros(scale.shape[:-1], jnp.int32))
        self.mean_seen = variable(jnp.zeros(scale.shape[:-1]), mean_sync=True)

    def __call__(self, x: Float[Array, "batch time embed"], ctx: Context, **kwargs):
        h = x * self.scale + 1.0
        ctx = ctx.add_summary("h_mean", jnp.mean(h))
        ctx = ctx.add_aux_loss("h_sq", jnp.mean(h**2))
        ctx = ctx.update_var(self.calls, ctx.get_var(self.calls) + 1)
        ctx = ctx.update_var(self.mean_seen, jnp.mean(h))
        return h, ctx

    def param_axes(self):
        return {"scale": ("embed",)}


SCALES = jnp.asarray(np.random.default_rng(3).uniform(0.5, 1.5, (L, D)), jnp.float32)


def _probe_stacks(remat_policy="none"):
    """The repeated and the list stack with ProbeBlocks in place of their Transformer layers."""
    rep = _with_layers(_cfg(remat_policy=remat_policy), ProbeBlock(SCALES))
    lst = _with_layers(_cfg(repeat=False, remat_policy=remat_policy), tuple(ProbeBlock(s) for s in SCALES))
    return split_state(rep), split_state(lst)


def _expected_probe_outputs(x):
    h, means, squares = np.asarray(x, np.float64), [], []
    for scale in np.asarray(SCALES):
        h = h * scale + 1.0
        means.append(h.mean())
        squares.append((h**2).mean())
    return h, np.asarray(means), np.asarray(squares)


_apply_mutable = jit(lambda m, x, s: apply(m, x, state=s, mutable=True))


def test_scanned_stack_stacks_summaries_sums_aux_losses_and_updates_state():
    (rep, state), _ = _probe_stacks()
    x = _x()
    y, ctx = _apply_mutable(rep, x, state)
    h, means, squares = _expected_probe_outputs(x)
    assert_matches_reference(y, h, rtol=1e-5, atol=1e-6)
    assert set(ctx.summaries) == {"repeat/h_mean"} and set(ctx.aux_losses) == {"repeat/h_sq"}
    assert ctx.summaries["repeat/h_mean"].shape == (L,)  # one value per layer
    np.testing.assert_allclose(ctx.summaries["repeat/h_mean"], means, rtol=1e-5)
    np.testing.assert_allclose(ctx.aux_losses["repeat/h_sq"], squares.sum(), rtol=1e-5)  # summed over layers
    np.testing.assert_array_equal(ctx.get_var(rep.layers.calls), np.ones(L))
    np.testing.assert_allclose(ctx.get_var(rep.layers.mean_seen), means, rtol=1e-5)  # per layer
    np.testing.assert_array_equal(state.get(rep.layers.calls), np.zeros(L))  # input state untouched
    assert mean_sync_markers(rep) == {rep.layers.mean_seen.marker}


def test_scanned_stack_side_outputs_eagerly():
    (rep, state), _ = _probe_stacks()
    y, ctx = apply(rep, _x(), state=state, mutable=True)
    np.testing.assert_allclose(ctx.summaries["repeat/h_mean"], _expected_probe_outputs(_x())[1], rtol=1e-5)


@pytest.mark.parametrize("repeat", [True, False])
def test_stack_state_threads_under_jit_and_remat(repeat):
    (rep, rep_state), (lst, lst_state) = _probe_stacks(remat_policy="full")
    stack, state = (rep, rep_state) if repeat else (lst, lst_state)
    for _ in range(2):
        state = _apply_mutable(stack, _x(), state)[1].state
    calls = [state.get(stack.layers.calls)] if repeat else [state.get(layer.calls) for layer in stack.layers]
    np.testing.assert_array_equal(np.concatenate([np.ravel(c) for c in calls]), np.full(L, 2))


def test_list_stack_names_side_outputs_per_layer():
    _, (lst, state) = _probe_stacks()
    x = _x()
    y, ctx = _apply_mutable(lst, x, state)
    h, means, squares = _expected_probe_outputs(x)
    assert_matches_reference(y, h, rtol=1e-5, atol=1e-6)
    assert set(ctx.summaries) == {f"x_layers_{i}/h_mean" for i in range(L)}
    for i in range(L):
        np.testing.assert_allclose(ctx.summaries[f"x_layers_{i}/h_mean"], means[i], rtol=1e-5)
        np.testing.assert_allclose(ctx.aux_losses[f"x_layers_{i}/h_sq"], squares[i], rtol=1e-5)
        assert int(ctx.get_var(lst.layers[i].calls)) == 1


@pytest.mark.parametrize("repeat", [False, True])
def test_stochastic_depth_follows_praxis_stack_schedule(repeat, monkeypatch):
    """block.residual_droppath_prob p: layer i of L keeps each sub-block's output with
    probability 1 - p * i / L (Praxis' StackedTransformer), in the list and the scanned stack
    alike (where it is a traced per-layer input); eval is the stack without drop-path."""
    from pax_eqx.layers import transformers

    seen = []
    original = transformers.drop_path

    def spy(h, survival, ctx):
        jax.debug.callback(lambda s: seen.append(float(s)), jnp.asarray(survival, jnp.float32), ordered=True)
        return original(h, survival, ctx)

    monkeypatch.setattr(transformers, "drop_path", spy)
    block = TransformerConfig(residual_droppath_prob=0.4)
    cfg = StackedTransformerConfig(num_layers=4, model_dims=8, hidden_dims=16, num_heads=2, block=block, repeat=repeat)
    stack = cfg.build(key(0))
    x = random_normal((3, 5, 8), 1)
    stack(x, Context(key=key(1)))
    jax.effects_barrier()
    assert seen == pytest.approx([1 - 0.4 * i / 4 for i in range(4) for _ in ("attention", "feed-forward")])

    plain = cfg.replace(block=block.replace(residual_droppath_prob=0.0)).build(key(0))
    eval_ctx = Context(mode=Mode.EVAL)
    np.testing.assert_array_equal(stack(x, eval_ctx)[0], plain(x, eval_ctx)[0])


def test_stochastic_depth_refusals_name_the_field():
    with pytest.raises(ConfigError, match="residual_droppath_prob"):
        TransformerConfig(residual_droppath_prob=1.0)
    with pytest.raises(ConfigError, match="num_layers=1"):
        StackedTransformerConfig(
            num_layers=1, model_dims=8, hidden_dims=16, num_heads=2, block=TransformerConfig(residual_droppath_prob=0.1)
        )
