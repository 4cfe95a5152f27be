"""ViT: patchify against NumPy, the patch embedding as a strided convolution, pooled shapes for
"cls" and "mean", attention over every patch (non-causal), logical axes, config errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from layer_reference import jit, random_module, random_normal
from tolerances import assert_same_math

from pax_eqx.config import ConfigError
from pax_eqx.layers import AttentionConfig, Context, Mode, TransformerConfig, ViTConfig, patchify
from pax_eqx.models import ClassificationModelConfig
from pax_eqx.sharding.logical import LogicalAxes, logical_axes

VOCABULARY = {"batch", "seq", "embed", "mlp", "heads", "kv_heads", "kv", "vocab", "layers", None}
TINY = dict(patch_size=2, model_dims=8, num_layers=2, num_heads=2, hidden_dims=16)
IMAGE = (4, 6, 3)  # H, W, C: 2x3 patches of 2*2*3 = 12 values


def _vit(pooling: str, **changes):
    cfg = ViTConfig(**TINY, pooling=pooling, **changes)
    return random_module(functools.partial(cfg.build, image_shape=IMAGE), scale=0.3)


@jit
def _forward(vit, x):
    return vit(x, Context(mode=Mode.EVAL))[0]


def test_patchify_matches_numpy():
    x = np.asarray(random_normal((2, *IMAGE)))
    p = 2
    patch = lambda b, i, j: x[b, i * p : (i + 1) * p, j * p : (j + 1) * p, :].reshape(-1)
    expected = np.stack([np.stack([patch(b, i, j) for i in range(2) for j in range(3)]) for b in range(2)])
    got = np.asarray(patchify(jnp.asarray(x), p))
    assert got.shape == (2, 6, 12)
    np.testing.assert_array_equal(got, expected)


def test_patch_embedding_is_a_strided_convolution():
    vit = _vit("mean")
    x = random_normal((2, *IMAGE), seed=1)
    tokens = vit.patch_embedding(patchify(x, 2))  # [B, 6, 8]
    kernel = vit.patch_embedding.w.reshape(2, 2, 3, 8)  # HWIO
    conv = jax.lax.conv_general_dilated(x, kernel, (2, 2), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    assert_same_math(tokens, np.asarray(conv).reshape(2, 6, 8))


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_output_shapes_and_tokens(pooling):
    vit = _vit(pooling)
    assert vit.output_dims == 8
    assert (vit.cls_token is not None) == (pooling == "cls")
    assert vit.position_embedding.emb_var.shape == (6 + (pooling == "cls"), 8)
    assert vit.patch_embedding.w.shape == (12, 8)
    features = _forward(vit, random_normal((3, *IMAGE)))
    assert features.shape == (3, 8) and bool(jnp.all(jnp.isfinite(features)))


def test_the_class_token_attends_to_every_patch():
    """With causal attention the class token (position 0) would see only itself and the features
    would not depend on the image; a ViT's do, through every patch, the last included."""
    vit = _vit("cls")
    x = random_normal((1, *IMAGE), seed=2)
    changed = x.at[:, -2:, -2:, :].add(1.0)  # the last patch only
    assert not np.allclose(np.asarray(_forward(vit, x)), np.asarray(_forward(vit, changed)), atol=1e-4)


def test_mean_pooling_is_the_mean_of_the_normed_tokens():
    vit = _vit("mean", repeat=False)
    x = random_normal((2, *IMAGE), seed=3)
    tokens = vit.patch_bias(vit.patch_embedding(patchify(x, 2))) + vit.position_embedding.emb_var
    y, _ = vit.transformer(tokens, Context(mode=Mode.EVAL))
    expected = jnp.mean(vit.final_norm(y), axis=1)
    assert_same_math(_forward(vit, x), expected)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_every_weight_has_logical_axes(pooling):
    vit = _vit(pooling)
    arrays = [a for a in jax.tree.leaves(vit) if isinstance(a, jax.Array)]
    axes = jax.tree.leaves(logical_axes(vit), is_leaf=lambda a: isinstance(a, LogicalAxes))
    axes = [a for a in axes if isinstance(a, LogicalAxes)]
    assert len(arrays) == len(axes)
    for array, names in zip(arrays, axes):
        assert len(names) == array.ndim and set(names) <= VOCABULARY
    named = logical_axes(vit)
    assert named.patch_embedding.w == (None, "embed") and named.position_embedding.emb_var == (None, "embed")
    assert named.transformer.layers.attention.w_q == ("layers", "embed", "heads", "kv")
    if pooling == "cls":
        assert named.cls_token == ("embed",)


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="causal"):
        ViTConfig(**TINY, block=TransformerConfig(attention=AttentionConfig(causal=True)))
    with pytest.raises(ConfigError, match="patch_size"):
        ViTConfig(**TINY).build(jax.random.key(0), image_shape=(5, 6, 3))
    with pytest.raises(ConfigError, match="patch_size"):
        patchify(jnp.zeros((1, 4, 5, 1)), 2)
    with pytest.raises(ConfigError, match="image_shape"):
        ViTConfig(**TINY).build(jax.random.key(0), image_shape=(4, 4))
    with pytest.raises(ConfigError, match="model_dims"):
        ViTConfig(**{**TINY, "model_dims": 9})
    with pytest.raises(ConfigError, match="pooling"):
        ViTConfig(**TINY, pooling="max")
    with pytest.raises(ConfigError, match="num_layers"):
        ViTConfig(**{**TINY, "num_layers": 0})
    with pytest.raises(ConfigError, match="input_shape"):
        ClassificationModelConfig(input_shape=(64,), num_classes=10, network=ViTConfig(**TINY)).build(jax.random.key(0))


def test_a_classifier_on_a_vit():
    cfg = ClassificationModelConfig(input_shape=IMAGE, num_classes=5, network=ViTConfig(**TINY, pooling="mean"))
    model = random_module(cfg, scale=0.3)
    batch = {"inputs": random_normal((3, *IMAGE)), "labels": jnp.arange(3), "weights": jnp.ones((3,))}
    classes, probabilities = jit(lambda m, b: m.predict(b))(model, batch)
    assert classes.shape == (3,) and probabilities.shape == (3, 5)
    np.testing.assert_allclose(np.asarray(probabilities.sum(-1)), 1.0, rtol=1e-5)
