"""ResNet blocks and family: published parameter counts, shapes and BatchNorm state through the
Context, zero-init residuals, synchronised BatchNorm over 8 fake devices, logical axes, errors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec
from layer_reference import jit, key, random_normal
from tolerances import assert_matches_reference, assert_same_math

from pax_eqx.config import ConfigError
from pax_eqx.layers import (
    ActivationConfig,
    BatchNorm,
    Context,
    Conv2D,
    Mode,
    ResNetBlockConfig,
    ResNetConfig,
    resnet18,
    resnet50,
    split_state,
)
from pax_eqx.sharding.logical import LogicalAxes, logical_axes
from pax_eqx.sharding.rules import parse_rules

TINY = ResNetConfig(blocks=(1, 1), channels=(8, 16), strides=(1, 2), stem_channels=4, block=ResNetBlockConfig())


def _abstract(cfg, input_channels=3):
    """The trunk and its BatchNorm state as shapes only (nothing is initialised)."""
    return eqx.filter_eval_shape(lambda k: split_state(cfg.build(k, input_channels=input_channels)), key(0))


def _size(tree):
    return sum(a.size for a in jax.tree.leaves(tree) if isinstance(a, (jax.Array, jax.ShapeDtypeStruct)))


@pytest.mark.parametrize("preset, published", [(resnet50, 25_557_032), (resnet18, 11_689_512)])
def test_parameter_count_with_a_1000_class_head_is_the_published_one(preset, published):
    cfg = preset()
    trunk, state = _abstract(cfg)
    head = trunk.output_dims * 1000 + 1000  # the classifier's Linear + bias lives in the model
    assert _size(trunk) + head == published
    # Moving statistics are state, not parameters: a mean and a variance per BatchNorm channel.
    norms = [n for n in jax.tree.leaves(trunk, is_leaf=lambda x: isinstance(x, BatchNorm)) if isinstance(n, BatchNorm)]
    assert len(norms) == 1 + (3 if cfg.block.bottleneck else 2) * sum(cfg.blocks) + (4 if cfg.block.bottleneck else 3)
    assert _size(state) == sum(2 * n.gamma.size for n in norms)


def _build(build):
    """`split_state(build(key))`, initialised in one compiled program: eagerly, each initialiser
    of each shape would be its own XLA compile (seconds for a small ResNet on CPU)."""
    return split_state(jit(build)(key(0)))


def _tiny(cfg=TINY, input_channels=3):
    return _build(lambda k: cfg.build(k, input_channels=input_channels))


def _forward(model, x, state, mode):
    y, ctx = model(x, Context(state=state, mode=mode))
    return y, ctx.state


@pytest.mark.parametrize(
    "cfg, size, input_channels",
    [
        (TINY, 32, 3),  # imagenet stem: 32 -> conv/2 16 -> pool/2 8 -> stage strides (1, 2) -> 4
        (TINY.replace(stem="small", block=ResNetBlockConfig(bottleneck=True)), 8, 1),  # 8x8 digits
    ],
)
def test_forward_pools_features_and_threads_batch_norm_state(cfg, size, input_channels):
    model, state = _tiny(cfg, input_channels)
    assert model.output_dims == cfg.channels[-1] == cfg.output_dims
    x = random_normal((2, size, size, input_channels), seed=1)
    y, new_state = jit(_forward)(model, x, state, Mode.TRAIN)
    assert y.shape == (2, 16) and bool(jnp.all(jnp.isfinite(y)))
    old, new = jax.tree.leaves(state), jax.tree.leaves(new_state)
    assert len(old) == 2 * (1 + 2 + 2 * (3 if cfg.block.bottleneck else 2))  # stem + 2 shortcuts + bodies
    assert all(not np.allclose(a, b) for a, b in zip(old, new)), "every BatchNorm's moving stats move in TRAIN"
    y_eval, eval_state = jit(_forward)(model, x, state, Mode.EVAL)
    assert y_eval.shape == (2, 16)
    assert all(np.array_equal(a, b) for a, b in zip(old, jax.tree.leaves(eval_state)))
    # He-normal convolutions with fan-out, no bias: w / sqrt(2 / (kh * kw * out)) is N(0, 1).
    convs = [c for c in jax.tree.leaves(model, is_leaf=lambda c: isinstance(c, Conv2D)) if isinstance(c, Conv2D)]
    assert all(c.b is None for c in convs)
    z = np.concatenate([np.ravel(c.w) / np.sqrt(2.0 / (c.w.shape[0] * c.w.shape[1] * c.w.shape[3])) for c in convs])
    assert z.size > 400 and abs(z.std() - 1.0) < 0.12 and abs(z.mean()) < 0.15


def test_bfloat16_activations_stay_bfloat16():
    model, state = _abstract(TINY)
    x = jax.ShapeDtypeStruct((2, 16, 16, 3), jnp.bfloat16)
    y, _ = eqx.filter_eval_shape(_forward, model, x, state, Mode.TRAIN)
    assert y.dtype == jnp.bfloat16


@pytest.mark.parametrize(
    "cin, cout, stride, projects",
    [(8, 8, 1, False), (8, 16, 1, True), (8, 8, 2, True), (16, 8, 2, True)],
)
def test_the_shortcut_projects_only_when_the_shape_changes(cin, cout, stride, projects):
    for bottleneck in (False, True):
        build = ResNetBlockConfig(bottleneck=bottleneck).build
        block = eqx.filter_eval_shape(build, key(0), input_channels=cin, output_channels=cout, stride=stride)
        assert (block.shortcut is not None) == projects
        assert len(block.body) == (3 if bottleneck else 2)
        if bottleneck:
            assert block.body[1].conv.w.shape == (3, 3, cout // 4, cout // 4)  # stride on the 3x3
            assert block.body[1].conv.strides == (stride, stride)


@pytest.mark.parametrize("bottleneck", [False, True])
def test_zero_init_residual_makes_each_block_start_as_its_shortcut(bottleneck):
    cfg = ResNetBlockConfig(bottleneck=bottleneck, zero_init_residual=True)
    block, state = _build(lambda k: cfg.build(k, input_channels=8, output_channels=8))
    gammas = [np.asarray(layer.norm.gamma) for layer in block.body]
    assert all((g == 0.0).all() for g in gammas[:-1]) and (gammas[-1] == -1.0).all()  # scale = 1 + gamma
    x = random_normal((2, 4, 4, 8), seed=2)
    y, _ = jit(_forward)(block, x, state, Mode.TRAIN)
    assert_matches_reference(y, jax.nn.relu(x), rtol=1e-7, atol=1e-6)


def test_sharded_training_forward_equals_single_device():
    """Pax's synchronised BatchNorm under SPMD: with the batch split over 8 devices, the batch
    statistics are the global batch's, so outputs and new moving averages match one device."""
    assert len(jax.devices()) == 8, "tests/conftest.py sets 8 fake CPU devices"
    cfg = ResNetBlockConfig(bottleneck=True)
    block, state = _build(lambda k: cfg.build(k, input_channels=4, output_channels=8, stride=2))
    # Each device's rows get a different offset, so per-device statistics would differ from the global ones.
    x = random_normal((16, 6, 6, 4), seed=3) + jnp.arange(16, dtype=jnp.float32)[:, None, None, None] / 4
    step = jax.jit(lambda block, x, state: _forward(block, x, state, Mode.TRAIN))
    y1, state1 = step(block, x, state)

    mesh = Mesh(np.array(jax.devices()), ("data",), axis_types=(AxisType.Auto,))
    x8 = jax.device_put(x, NamedSharding(mesh, PartitionSpec("data")))
    y8, state8 = step(block, x8, state)
    assert len(y8.sharding.device_set) == 8 and not y8.sharding.is_fully_replicated

    assert_same_math(y8, y1)
    new1, new8 = jax.tree.leaves(state1), jax.tree.leaves(state8)
    assert len(new1) == 2 * 4  # conv_in, conv_mid, conv_out, shortcut
    for a, b in zip(new1, new8):
        assert_same_math(b, a)
    # The moving means really are the global batch's: the shortcut BN's mean of a 1x1 conv of x.
    shortcut_conv = np.asarray(jit(lambda conv, x: conv(x))(block.shortcut.conv, x), np.float64)
    moving_mean = state8.get(block.shortcut.norm.moving_mean)
    assert_matches_reference(moving_mean, 0.1 * shortcut_conv.mean((0, 1, 2)), rtol=1e-4, atol=1e-6)


def test_every_weight_has_logical_axes_the_rules_know():
    model, _ = _abstract(TINY.replace(block=ResNetBlockConfig(bottleneck=True)))
    arrays = [a for a in jax.tree.leaves(model) if isinstance(a, jax.ShapeDtypeStruct)]
    axes = [a for a in jax.tree.leaves(logical_axes(model), is_leaf=lambda x: isinstance(x, LogicalAxes))]
    axes = [a for a in axes if isinstance(a, LogicalAxes)]
    assert arrays and len(arrays) == len(axes)
    known = set(parse_rules(())) | {None}
    for array, names in zip(arrays, axes):
        assert len(names) == array.ndim and set(names) <= known
    assert logical_axes(model).stem.conv.w == (None, None, "conv_in", "conv_out")


def test_presets_and_overrides():
    cfg = resnet50()
    assert cfg.blocks == (3, 4, 6, 3) and cfg.block.bottleneck and cfg.output_dims == 2048
    small = resnet18(stem="small", channels=(16, 32, 64, 128))
    assert small.stem == "small" and small.output_dims == 128 and not small.block.bottleneck
    assert ResNetConfig.from_json(small.to_json()) == small


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: ResNetConfig(blocks=(1, 1), channels=(8,), strides=(1, 2)), r"ResNetConfig\.channels=\(8,\) has 1"),
        (lambda: ResNetConfig(blocks=(1, 0), channels=(8, 8), strides=(1, 2)), r"ResNetConfig\.blocks=.*> 0"),
        (lambda: ResNetConfig(channels=(6, 8, 8, 8)), r"ResNetConfig\.channels=.*divisible by 4.*\[6\]"),
        (lambda: ResNetConfig(stem="cifar"), r"ResNetConfig\.stem='cifar' is unknown"),
        (lambda: ResNetConfig(stem_channels=0), r"ResNetConfig\.stem_channels must be > 0"),
        (lambda: ResNetBlockConfig(activation=ActivationConfig(name="silu", gated=True)), r"gated=True"),
        (lambda: ResNetBlockConfig(batch_norm_decay=1.5), r"ResNetBlockConfig\.batch_norm_decay.*1\.5"),
        (lambda: TINY.build(key(0), input_channels=0), r"input_channels must be > 0, got 0"),
    ],
)
def test_config_errors_name_the_field_and_the_value(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_stochastic_depth_drops_each_examples_residual_branch_in_training_only():
    """Praxis' ResNetBlock residual_droppath_prob: act(body(x) / survival + shortcut(x)) for a
    kept example, act(shortcut(x)) for a dropped one; eval is act(body(x) + shortcut(x))."""
    p = 0.5
    cfg = ResNetBlockConfig(residual_droppath_prob=p)
    block, state = _build(lambda k: cfg.build(k, input_channels=4, output_channels=8, stride=2))
    x = random_normal((64, 4, 4, 4), seed=3)

    def body_and_shortcut(x, mode):
        ctx = Context(state=state, mode=mode)
        y = x
        for layer in block.body:
            y, ctx = layer(y, ctx)
        s, _ = block.shortcut(x, ctx)
        return y, s

    y, _ = jax.jit(lambda x: block(x, Context(state=state, mode=Mode.TRAIN, key=key(5))))(x)
    body, shortcut = jax.jit(lambda x: body_and_shortcut(x, Mode.TRAIN))(x)
    kept, dropped = jax.nn.relu(body / (1 - p) + shortcut), jax.nn.relu(shortcut)
    is_kept = np.all(np.isclose(y, kept, atol=1e-5), axis=(1, 2, 3))
    is_dropped = np.all(np.isclose(y, dropped, atol=1e-5), axis=(1, 2, 3))
    assert np.all(is_kept ^ is_dropped) and 0 < is_kept.sum() < 64

    y_eval, _ = jit(_forward)(block, x, state, Mode.EVAL)  # no key needed
    body, shortcut = jax.jit(lambda x: body_and_shortcut(x, Mode.EVAL))(x)
    assert_same_math(y_eval, jax.nn.relu(body + shortcut))
    with pytest.raises(ConfigError, match="residual_droppath_prob"):
        ResNetBlockConfig(residual_droppath_prob=1.0)
