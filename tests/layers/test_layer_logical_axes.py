"""Every weight of every layer has logical axis names; a stack prepends "layers"."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from layer_reference import key

from pax_eqx.layers import (
    AttentionConfig,
    BatchNormConfig,
    BiasConfig,
    EmbeddingConfig,
    FeedForwardConfig,
    LinearConfig,
    MLPBlockConfig,
    SharedEmbeddingSoftmaxConfig,
    SoftmaxConfig,
    StackedTransformerConfig,
    TrainablePositionalEmbeddingConfig,
    TransformerConfig,
    init,
    split_state,
    swiglu,
)
from pax_eqx.layers.normalizations import LayerNormConfig, RmsNormConfig
from pax_eqx.sharding.logical import LogicalAxes, logical_axes

VOCABULARY = {"batch", "seq", "embed", "mlp", "heads", "kv_heads", "kv", "vocab", "layers", None}

BLOCK = TransformerConfig(norm_policy="primer_hybrid", activation=swiglu())
BLOCK_SIZES = dict(model_dims=8, hidden_dims=16, num_heads=2)

CONFIGS = {
    "linear": LinearConfig(input_dims=3, output_dims=4),
    "bias": BiasConfig(dims=4),
    "feedforward_gated": FeedForwardConfig(input_dims=3, output_dims=4, activation=swiglu()),
    "mlp_block": MLPBlockConfig(num_layers=3, input_dims=3, hidden_dims=5, output_dims=2),
    "embedding": EmbeddingConfig(num_classes=7, input_dims=4),
    "full_softmax": SoftmaxConfig(input_dims=4, num_classes=7),
    "shared_softmax": SharedEmbeddingSoftmaxConfig(num_classes=7, input_dims=4),
    "position_embedding": TrainablePositionalEmbeddingConfig(max_seq_length=9, embedding_dims=4),
    "layer_norm": functools.partial(LayerNormConfig().build, 4),
    "rms_norm": functools.partial(RmsNormConfig().build, 4),
    "batch_norm": BatchNormConfig(dims=4),
    "attention_all_options": functools.partial(
        AttentionConfig(use_bias=True, per_dim_scale=True).build, input_dims=8, num_heads=2
    ),
    "attention_combined": functools.partial(
        AttentionConfig(combine_qkv=True, use_bias=True).build, input_dims=8, num_heads=2
    ),
    "attention_gqa": functools.partial(AttentionConfig().build, input_dims=8, num_heads=4, num_kv_heads=2),
    "transformer": functools.partial(BLOCK.build, **BLOCK_SIZES),
}


def _abstract_init(cfg):
    """`init(cfg, key)`'s model as shapes only (what the sharding code sees; nothing is computed).
    `cfg` may also be a function key -> module (a config whose sizes are build arguments)."""
    build = cfg.build if hasattr(cfg, "build") else cfg
    return eqx.filter_eval_shape(lambda key: split_state(build(key)), jax.random.key(0))[0]


def _is_weight(x):
    return isinstance(x, (jax.Array, jax.ShapeDtypeStruct))


def _arrays_and_axes(model):
    arrays = [a for a in jax.tree.leaves(model) if _is_weight(a)]
    axes = jax.tree.leaves(logical_axes(model), is_leaf=lambda x: isinstance(x, LogicalAxes))
    axes = [a for a in axes if isinstance(a, LogicalAxes)]
    return arrays, axes


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_weight_has_logical_axes(name):
    model = _abstract_init(CONFIGS[name])
    arrays, axes = _arrays_and_axes(model)
    assert arrays and len(arrays) == len(axes)
    for array, names in zip(arrays, axes):
        assert len(names) == array.ndim
        assert set(names) <= VOCABULARY
        assert "layers" not in names


def test_named_examples():
    # Real (computed) models, as the sharding rules also see them after a restore.
    lin, _ = init(LinearConfig(input_dims=3, output_dims=4, axes=("mlp", "embed")), key(0))
    assert logical_axes(lin).w == ("mlp", "embed")
    att = _abstract_init(CONFIGS["attention_gqa"])
    axes = logical_axes(att)
    assert axes.w_q == ("embed", "heads", "kv") and axes.w_k == ("embed", "kv_heads", "kv")
    assert axes.w_o == ("heads", "kv", "embed")
    assert logical_axes(init(SoftmaxConfig(input_dims=4, num_classes=7), key(0))[0]).w == ("embed", "vocab")


@pytest.mark.parametrize("repeat", [True, False])
def test_stacks_name_every_weight_and_prepend_layers_when_repeated(repeat):
    cfg = StackedTransformerConfig(num_layers=3, block=BLOCK, repeat=repeat, **BLOCK_SIZES)
    stack = _abstract_init(cfg)
    arrays, axes = _arrays_and_axes(stack)
    single, single_axes = _arrays_and_axes(_abstract_init(CONFIGS["transformer"]))
    assert len(arrays) == len(single) * (1 if repeat else 3)
    for array, names in zip(arrays, axes):
        assert len(names) == array.ndim and set(names) <= VOCABULARY
        assert (names[0] == "layers") == repeat and names.count("layers") == int(repeat)
    if repeat:
        assert [a[1:] for a in axes] == list(single_axes)
        assert all(a.shape[0] == 3 for a in arrays)
    else:
        assert axes == list(single_axes) * 3


def test_logical_axes_of_a_stack_by_path():
    cfg = StackedTransformerConfig(num_layers=2, block=BLOCK, **BLOCK_SIZES)
    axes = logical_axes(_abstract_init(cfg))
    assert axes.layers.attention.w_q == ("layers", "embed", "heads", "kv")


def test_an_unnamed_weight_is_an_error():
    class Unnamed(eqx.Module):
        w: jax.Array

    with pytest.raises(ValueError, match=r"Unnamed\.w.*has no logical axis names"):
        logical_axes(Unnamed(jnp.zeros((2, 2))))
