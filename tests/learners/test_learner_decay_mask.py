"""The default weight-decay mask: no decay on arrays with < 2 dimensions per layer."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from pax_eqx.learners import LearnerConfig, build_optimizer, default_decay_mask
from pax_eqx.learners.optimizer_configs import AdamWConfig


class Block(eqx.Module):
    w: jax.Array
    scale: jax.Array


class Stack(eqx.Module):
    """Two Blocks whose arrays carry a leading [layers] axis, marked like layers.scanned_stack does."""

    layers: Block
    head: jax.Array
    bias: jax.Array
    stacked_field = "layers"


def stack():
    return Stack(
        layers=Block(w=jnp.ones((2, 3, 4)), scale=jnp.ones((2, 4))),
        head=jnp.ones((4, 5)),
        bias=jnp.ones((5,)),
    )


def test_vectors_and_scalars_are_not_decayed():
    params = {"w": jnp.ones((3, 4)), "conv": jnp.ones((3, 3, 2, 4)), "b": jnp.ones((4,)), "t": jnp.ones(())}
    assert default_decay_mask(params) == {"w": True, "conv": True, "b": False, "t": False}


def test_stacked_field_axes_are_not_counted():
    mask = default_decay_mask(stack())
    assert (mask.layers.w, mask.layers.scale, mask.head, mask.bias) == (True, False, True, False)


def test_explicit_stacked_leading_axes_for_plain_pytrees():
    params = {"w": jnp.ones((2, 3, 4)), "scale": jnp.ones((2, 4))}
    assert default_decay_mask(params) == {"w": True, "scale": True}
    assert default_decay_mask(params, stacked_leading_axes=1) == {"w": True, "scale": False}


def test_mask_works_on_abstract_and_traced_stacks_inside_the_optimizer():
    params = stack()
    abstract = jax.eval_shape(lambda: params)
    assert default_decay_mask(abstract) == default_decay_mask(params)
    tx = build_optimizer(LearnerConfig(optimizer=AdamWConfig(), learning_rate=0.1, weight_decay=0.5))
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = jax.jit(tx.update)(zeros, tx.init(params), params)
    new = optax.apply_updates(params, updates)
    np.testing.assert_allclose(new.layers.w, 0.95)  # decayed: 1 - lr * wd
    np.testing.assert_allclose(new.head, 0.95)
    np.testing.assert_array_equal(new.layers.scale, 1.0)  # [layers, dims]: a stacked vector
    np.testing.assert_array_equal(new.bias, 1.0)


def test_language_model_mask_agrees_with_its_logical_axes():
    """Independent check on a real stacked model: decay iff >= 2 logical axes besides `layers`."""
    from pax_eqx.layers.base import split_state
    from pax_eqx.models import LanguageModelConfig
    from pax_eqx.sharding.logical import LogicalAxes, logical_axes

    cfg = LanguageModelConfig(
        vocab_size=32, max_seq_len=16, num_layers=2, model_dims=32, hidden_dims=64, num_heads=4, num_kv_heads=2
    )
    for repeat in (True, False):
        model, _ = jax.eval_shape(lambda r=repeat: split_state(cfg.replace(repeat=r).build(jax.random.PRNGKey(0))))
        params = eqx.filter(model, lambda x: isinstance(x, jax.ShapeDtypeStruct))
        want = jax.tree.map(
            lambda axes: sum(a != "layers" for a in axes) >= 2,
            logical_axes(params),
            is_leaf=lambda x: isinstance(x, LogicalAxes),
        )
        got = default_decay_mask(params)
        assert jax.tree.structure(got) == jax.tree.structure(want)
        assert jax.tree.leaves(got) == jax.tree.leaves(want)
        leaves = zip(jax.tree.leaves(params), jax.tree.leaves(got))
        assert any(not decays and leaf.ndim == 2 for leaf, decays in leaves) == repeat  # stacked norms/biases
