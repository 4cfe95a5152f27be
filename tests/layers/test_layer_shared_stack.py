"""The shared stack (share_layers): one layer's weights applied num_layers times, in the scanned
and the looped form: the forward is the layer applied in turn, the gradient is the sum of each
application's, the weights exist once (parameters, names, logical axes), decoding equals the
forward, and the combinations it cannot be are refused."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from layer_reference import key, random_normal
from tolerances import assert_same_math, assert_same_math_tree

from pax_eqx.config import ConfigError
from pax_eqx.layers import Context, Mode, StackedTransformerConfig, TransformerConfig
from pax_eqx.layers.moe import MoEFeedForwardConfig
from pax_eqx.layers.shared_stack import SharedLayerStack
from pax_eqx.learners.variables import param_names
from pax_eqx.models import LanguageModelConfig
from pax_eqx.sharding.logical import logical_axes

EVAL = Context(mode=Mode.EVAL)


def _config(repeat: bool, **kw) -> StackedTransformerConfig:
    return StackedTransformerConfig(
        num_layers=3, model_dims=8, hidden_dims=16, num_heads=2, repeat=repeat, share_layers=True, **kw
    )


@pytest.mark.parametrize("repeat", [True, False])
def test_the_forward_is_the_one_layer_applied_num_layers_times(repeat):
    stack = _config(repeat).build(key(0))
    assert isinstance(stack, SharedLayerStack)
    x = random_normal((2, 5, 8), 1)
    h = x
    for _ in range(3):
        h, _ = stack.layer(h, EVAL)
    assert_same_math(stack(x, EVAL)[0], h)


@pytest.mark.parametrize("repeat", [True, False])
def test_the_gradient_is_the_sum_of_every_applications(repeat):
    """The unshared list stack holding three copies of the shared layer computes the same
    function; its three per-layer gradients add up to the shared layer's gradient."""
    shared = _config(repeat).build(key(0))
    copies = _config(False).replace(share_layers=False).build(key(0))
    copies = eqx.tree_at(lambda s: s.layers, copies, (shared.layer,) * 3)
    x, cotangent = random_normal((2, 5, 8), 1), random_normal((2, 5, 8), 2)
    objective = lambda stack: jnp.sum(stack(x, EVAL)[0] * cotangent)
    assert_same_math(objective(shared), objective(copies))
    g_shared = eqx.filter_grad(objective)(shared).layer
    g_copies = eqx.filter_grad(objective)(copies).layers
    summed = jax.tree.map(lambda *g: sum(g), *g_copies)
    assert_same_math_tree(g_shared, summed, rtol=1e-4)


def test_the_weights_exist_once_with_the_layers_own_axes():
    """Stored, optimised and sharded once: the language model's parameters are the unshared
    model's minus num_layers - 1 layers, named `stack.layer.*` (no layers axis), and their
    logical axes are the layer's own."""
    tiny = dict(vocab_size=13, max_seq_len=16, num_layers=4, model_dims=16, hidden_dims=32, num_heads=2)
    count = lambda m: sum(a.size for a in jax.tree.leaves(eqx.filter(m, eqx.is_array)))
    shared = LanguageModelConfig(**tiny, share_layers=True).build(key(0))
    unshared = LanguageModelConfig(**tiny).build(key(0))
    one_layer = count(shared.stack.layer)
    assert count(unshared) - count(shared) == 3 * one_layer
    names = [n for n in param_names(shared) if n.startswith("stack.")]
    assert names and all(n.startswith("stack.layer.") for n in names)
    assert shared.stack.layer.attention.w_q.shape == (16, 2, 8)
    axes = logical_axes(shared).stack.layer.attention.w_q
    assert tuple(axes) == ("embed", "heads", "kv")


@pytest.mark.parametrize("repeat", [True, False])
def test_a_shared_language_model_decodes_as_it_computes(repeat):
    tiny = dict(vocab_size=13, max_seq_len=16, num_layers=3, model_dims=16, hidden_dims=32, num_heads=2)
    model = LanguageModelConfig(**tiny, share_layers=True, repeat=repeat).build(key(0))
    ids = jax.random.randint(key(1), (2, 7), 0, 13)
    full, _ = model(ids, EVAL)
    cache = model.init_cache(2, 8)
    positions = jnp.broadcast_to(jnp.arange(7), (2, 7))
    valid = jnp.ones((2, 8), bool)
    got, cache = model.extend_step(ids[:, :4], cache, jnp.int32(0), positions[:, :4], valid)
    steps = [got]
    for t in range(4, 7):
        logits, cache = model.extend_step(ids[:, t : t + 1], cache, jnp.int32(t), positions[:, t : t + 1], valid)
        steps.append(logits)
    assert_same_math(jnp.concatenate(steps, axis=1), full)


def test_what_one_shared_layer_cannot_be_is_refused():
    with pytest.raises(ConfigError, match="share_layers=True cannot be combined with moe"):
        _config(True, moe=MoEFeedForwardConfig(num_experts=2))
    tiny = dict(vocab_size=13, max_seq_len=16, num_layers=2, model_dims=16, hidden_dims=32, num_heads=2)
    with pytest.raises(ConfigError, match="model.share_layers=True with model.moe_layer_interval"):
        LanguageModelConfig(**tiny, share_layers=True, moe_layer_interval=1).validate()


@pytest.mark.parametrize("repeat", [True, False])
def test_each_application_draws_its_own_dropout(repeat, monkeypatch):
    """Dropout in a shared layer: every application gets a key of its own (a different mask),
    not the first one's again."""
    from pax_eqx.layers import stochastics

    masks = []
    original = stochastics.jax.random.bernoulli

    def spy(k, p, shape):
        keep = original(k, p, shape)
        jax.debug.callback(lambda m: masks.append(np.asarray(m)), keep, ordered=True)
        return keep

    monkeypatch.setattr(stochastics.jax.random, "bernoulli", spy)
    stack = _config(repeat, block=TransformerConfig(residual_dropout_prob=0.5)).build(key(0))
    stack(random_normal((2, 5, 8), 1), Context(key=key(3)))
    jax.effects_barrier()
    assert len(masks) == 6  # attention and feed-forward, three applications
    assert len({m.tobytes() for m in masks}) == 6
