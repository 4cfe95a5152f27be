"""The CNN trunk (pax_eqx/layers/cnns.py, Paxml's MNIST `CNN`) against its formula written out in
jnp: each convolution as a sum over kernel offsets of shifted, zero-padded inputs times the
kernel's slice, the pooling as a mean (max) over the real pixels of each window, the flattened
map through x @ w + b and the activation."""

from __future__ import annotations

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from layer_reference import jit, random_module, random_normal

from pax_eqx.config import ConfigError
from pax_eqx.layers import Context
from pax_eqx.layers.activations import ActivationConfig
from pax_eqx.layers.cnns import CNNConfig
from pax_eqx.sharding.logical import LogicalAxes, logical_axes
from pax_eqx.sharding.rules import parse_rules

ACTIVATIONS = {"relu": jax.nn.relu, "leaky_relu": lambda x: jnp.where(x >= 0, x, 0.01 * x)}


def reference_cnn(net, x, activation: str, pooling: str, pool: int):
    """The CNN's output written from its definition (module docstring of layers/cnns.py)."""
    act = ACTIVATIONS[activation]
    for conv in net.convs:
        kh, kw, _, _ = conv.w.shape
        n, height, width, _ = x.shape
        xp = jnp.pad(x, ((0, 0), ((kh - 1) // 2, kh // 2), ((kw - 1) // 2, kw // 2), (0, 0)))  # "SAME", stride 1
        y = conv.b + sum(
            jnp.einsum("nhwc,co->nhwo", xp[:, di : di + height, dj : dj + width], conv.w[di, dj])
            for di in range(kh)
            for dj in range(kw)
        )
        y = act(y)
        # "SAME" pooling at stride = window: ceil(size / pool) windows, the missing pixels split
        # before / after (the extra one after) and left out of the max or mean (NaN here).
        out_h, out_w = math.ceil(height / pool), math.ceil(width / pool)
        pad_h, pad_w = out_h * pool - height, out_w * pool - width
        yp = jnp.pad(y, ((0, 0), (pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2), (0, 0)),
                     constant_values=jnp.nan)  # fmt: skip
        windows = yp.reshape(n, out_h, pool, out_w, pool, y.shape[-1])
        x = (jnp.nanmax if pooling == "max" else jnp.nanmean)(windows, axis=(2, 4))
    x = x.reshape(x.shape[0], -1)  # (row, column, channel) order
    for layer in net.mlp.layers:
        x = act(x @ layer.projection.linear.w + layer.projection.bias.b)
    return x


CASES = {
    # name: (CNNConfig, image shape [H, W, C])
    "paxml_mnist": (CNNConfig(), (28, 28, 1)),
    "odd_sizes_even_kernel_max_pool_no_hidden": (
        CNNConfig(
            channels=(3,),
            kernel_size=2,
            pooling="max",
            pool_size=3,
            hidden_dims=(),
            activation=ActivationConfig(name="leaky_relu"),
        ),
        (7, 9, 2),
    ),  # fmt: skip
    "three_convs_two_hidden": (
        CNNConfig(channels=(4, 5, 6), kernel_size=5, pool_size=2, hidden_dims=(7, 3)),
        (10, 11, 3),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_cnn_is_its_formula(name):
    cfg, shape = CASES[name]
    net = random_module(functools.partial(cfg.build, image_shape=shape), seed=1, scale=0.3)
    x = random_normal((2, *shape), seed=2)
    y, _ = jit(lambda net, x: net(x, Context()))(net, x)
    expected = jit(reference_cnn)(net, x, cfg.activation.name, cfg.pooling, cfg.pool_size)
    assert y.shape == expected.shape == (2, net.output_dims)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_paxmls_mnist_cnn_has_its_shapes_and_parameter_count():
    """3x3 convs 1 -> 32 -> 64 with biases, 2x2 pooling twice (28 -> 7), 7 * 7 * 64 = 3136 -> 256."""
    net = eqx.filter_eval_shape(functools.partial(CNNConfig().build, image_shape=(28, 28, 1)), jax.random.key(0))
    assert [(c.w.shape, c.b.shape) for c in net.convs] == [((3, 3, 1, 32), (32,)), ((3, 3, 32, 64), (64,))]
    (hidden,) = net.mlp.layers
    assert (hidden.projection.linear.w.shape, hidden.projection.bias.b.shape) == ((3136, 256), (256,))
    count = sum(a.size for a in jax.tree.leaves(net) if isinstance(a, jax.ShapeDtypeStruct))
    assert count == (9 * 32 + 32) + (9 * 32 * 64 + 64) + (3136 * 256 + 256) == 821_888
    assert net.output_dims == 256


def test_every_weight_has_logical_axes_the_rules_know():
    net = eqx.filter_eval_shape(functools.partial(CNNConfig().build, image_shape=(28, 28, 1)), jax.random.key(0))
    arrays = [a for a in jax.tree.leaves(net) if isinstance(a, jax.ShapeDtypeStruct)]
    axes = [a for a in jax.tree.leaves(logical_axes(net), is_leaf=lambda x: isinstance(x, LogicalAxes))]
    axes = [a for a in axes if isinstance(a, LogicalAxes)]
    assert arrays and len(arrays) == len(axes)
    known = set(parse_rules(())) | {None}
    for array, names in zip(arrays, axes):
        assert len(names) == array.ndim and set(names) <= known


@pytest.mark.parametrize(
    "fields, named",
    [
        (dict(channels=()), "channels"),
        (dict(channels=(32, 0)), r"channels\[1\]"),
        (dict(kernel_size=0), "kernel_size"),
        (dict(pool_size=-1), "pool_size"),
        (dict(hidden_dims=(0,)), r"hidden_dims\[0\]"),
        (dict(pooling="median"), "pooling"),
        (dict(activation=ActivationConfig(name="silu", gated=True)), r"activation\.gated"),
    ],
)
def test_a_bad_field_is_refused_naming_it(fields, named):
    with pytest.raises(ConfigError, match=rf"CNNConfig\.{named}"):
        CNNConfig(**fields)
