"""The plain-JAX reference ResNet-50: BatchNorm and a bottleneck block against NumPy formulas,
torchvision's parameter count, the optimizer's decay mask, and a tiny train step that learns."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.reference_resnet import (
    ResNetReferenceConfig,
    batch_norm,
    bottleneck,
    count_params,
    init_params,
    make_train_step,
)

F32 = ResNetReferenceConfig(image_size=32, batch_size=2, dtype="float32", num_classes=10, learning_rate=0.05)


def _np_bn(x, scale, bias, eps):
    mean = x.mean(axis=(0, 1, 2))
    var = ((x - mean) ** 2).mean(axis=(0, 1, 2))
    return (x - mean) / np.sqrt(var + eps) * scale + bias, mean, var


def _np_conv(x, w, stride):
    """SAME-padded NHWC x HWIO convolution by its definition: a sum over the kernel's taps."""
    n, h, wd, _ = x.shape
    k = w.shape[0]
    out_h, out_w = math.ceil(h / stride), math.ceil(wd / stride)
    pad_h, pad_w = max((out_h - 1) * stride + k - h, 0), max((out_w - 1) * stride + k - wd, 0)
    xp = np.pad(x, ((0, 0), (pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
    y = np.zeros((n, out_h, out_w, w.shape[-1]))
    for i in range(k):
        for j in range(k):
            patch = xp[:, i : i + stride * out_h : stride, j : j + stride * out_w : stride]
            y += patch @ w[i, j]
    return y


def test_batch_norm_normalises_by_batch_statistics_and_updates_the_running_ones():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 5, 6)) * 2 + 1
    p = {"scale": rng.standard_normal(6), "bias": rng.standard_normal(6)}
    stats = {"mean": rng.standard_normal(6), "var": rng.uniform(0.5, 2, 6)}
    y, new = batch_norm(jnp.asarray(x, jnp.float32), jax.tree.map(jnp.float32, p),
                        jax.tree.map(jnp.float32, stats), 0.9, 1e-3)  # fmt: skip
    want, mean, var = _np_bn(x, p["scale"], p["bias"], 1e-3)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(new["mean"], 0.9 * stats["mean"] + 0.1 * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new["var"], 0.9 * stats["var"] + 0.1 * var, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("stride", [1, 2])
def test_a_projected_bottleneck_block_matches_its_numpy_formula(stride):
    """relu(bn(1x1) -> relu -> bn(3x3/stride) -> relu -> bn(1x1) + bn(1x1/stride shortcut)) on 5x5 images."""
    rng = np.random.default_rng(stride)
    c_in, width, c_out = 3, 2, 8
    x = rng.standard_normal((2, 5, 5, c_in))
    shapes = {
        "conv1": (1, c_in, width),
        "conv2": (3, width, width),
        "conv3": (1, width, c_out),
        "proj": (1, c_in, c_out),
    }
    p, s = {}, {}
    for name, (k, i, o) in shapes.items():
        bn = {"scale": rng.uniform(0.5, 1.5, o), "bias": rng.standard_normal(o)}
        p[name] = {"w": rng.standard_normal((k, k, i, o)), "bn": bn}
        s[name] = {"bn": {"mean": np.zeros(o), "var": np.ones(o)}}
    to32 = lambda t: jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), t)  # noqa: E731
    y, new = bottleneck(jnp.asarray(x, jnp.float32), to32(p), to32(s), stride, F32)

    def conv_bn(h, name, stride=1):
        out, mean, var = _np_bn(_np_conv(h, p[name]["w"], stride), p[name]["bn"]["scale"], p[name]["bn"]["bias"], 1e-3)
        np.testing.assert_allclose(new[name]["bn"]["mean"], 0.1 * mean, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(new[name]["bn"]["var"], 0.9 + 0.1 * var, rtol=1e-4, atol=1e-5)
        return out

    relu = lambda a: np.maximum(a, 0)  # noqa: E731
    h = relu(conv_bn(x, "conv1"))
    h = relu(conv_bn(h, "conv2", stride))
    want = relu(conv_bn(h, "conv3") + conv_bn(x, "proj", stride))
    assert y.shape == (2, math.ceil(5 / stride), math.ceil(5 / stride), c_out)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_resnet50_has_torchvisions_parameter_count():
    # torchvision.models.resnet50(): 25,557,032 with BatchNorm weight + bias, fc 2048 x 1000 + 1000.
    assert count_params(ResNetReferenceConfig()) == 25_557_032
    params, stats = jax.eval_shape(lambda: init_params(ResNetReferenceConfig(), jax.random.key(0)))
    # 53 BatchNorms (1 stem + 3 per block x 16 + 4 projections), each with a running mean and variance.
    assert len(jax.tree.leaves(stats)) == 2 * 53
    assert params["stages"][1][0]["conv2"]["w"].shape == (3, 3, 128, 128)  # v1.5: the stride is on the 3x3


def test_train_step_learns_a_fixed_batch_and_updates_the_running_statistics():
    rng = np.random.default_rng(0)
    batch = {
        "images": rng.standard_normal((2, 32, 32, 3)).astype(np.float32),
        "labels": np.array([3, 7], np.int32),
    }
    init_fn, step = make_train_step(F32)
    state = init_fn(jax.random.key(0))
    old_stem_var = np.asarray(state.batch_stats["stem"]["bn"]["var"])
    losses = []
    for _ in range(4):
        state, loss = step(state, batch)
        losses.append(float(loss))
    assert losses[0] == pytest.approx(math.log(10), abs=0.5)  # 0.01-std head: near-uniform predictions
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0] - 0.1, losses
    assert int(state.step) == 4
    assert not np.allclose(state.batch_stats["stem"]["bn"]["var"], old_stem_var)
