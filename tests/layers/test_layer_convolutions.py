"""Conv2D against a direct NumPy loop of the formula; its config errors, init and logical axes."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from layer_reference import jit, key, random_module, random_normal

from pax_eqx.config import ConfigError
from pax_eqx.layers import Conv2DConfig
from pax_eqx.sharding.logical import logical_axes
from pax_eqx.sharding.rules import parse_rules


def _pads(padding, size, kernel, stride, dilation):
    """(low, high) zeros on one spatial dim, computed from the definitions of SAME and VALID."""
    if padding == "VALID":
        return (0, 0)
    if padding == "SAME":
        extent = (kernel - 1) * dilation + 1
        out = math.ceil(size / stride)
        total = max((out - 1) * stride + extent - size, 0)
        return (total // 2, total - total // 2)
    return tuple(padding)


def reference_conv(x, w, b, strides, padding, dilation, groups):
    """y[n, i, j, o] = b[o] + sum_{di, dj, c in o's group} xpad[n, i*s + di*d, j*s + dj*d, c] w[di, dj, c', o]."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    _, height, width, _ = x.shape
    kh, kw, cin_group, cout = w.shape
    pad_h = _pads(padding if isinstance(padding, str) else padding[0], height, kh, strides[0], dilation[0])
    pad_w = _pads(padding if isinstance(padding, str) else padding[1], width, kw, strides[1], dilation[1])
    xp = np.pad(x, ((0, 0), pad_h, pad_w, (0, 0)))
    out_h = (xp.shape[1] - ((kh - 1) * dilation[0] + 1)) // strides[0] + 1
    out_w = (xp.shape[2] - ((kw - 1) * dilation[1] + 1)) // strides[1] + 1
    cout_group = cout // groups
    y = np.zeros((x.shape[0], out_h, out_w, cout))
    for i in range(out_h):
        for j in range(out_w):
            for di in range(kh):
                for dj in range(kw):
                    pixel = xp[:, i * strides[0] + di * dilation[0], j * strides[1] + dj * dilation[1], :]
                    for g in range(groups):
                        cin = slice(g * cin_group, (g + 1) * cin_group)
                        out = slice(g * cout_group, (g + 1) * cout_group)
                        y[:, i, j, out] += pixel[:, cin] @ w[di, dj, :, out]
    return y if b is None else y + np.asarray(b, np.float64)


CASES = {
    # name: (Conv2DConfig fields, input [B, H, W, C_in])
    "same_3x3": (dict(input_channels=3, output_channels=4), (2, 5, 6, 3)),
    "same_stride2_odd": (dict(input_channels=2, output_channels=3, strides=(2, 2)), (1, 7, 6, 2)),
    "same_stride_2x3_kernel_2x4": (
        dict(input_channels=2, output_channels=2, kernel_size=(2, 4), strides=(2, 3)),
        (1, 7, 8, 2),
    ),
    "valid_stride2": (dict(input_channels=3, output_channels=2, padding="VALID", strides=(2, 2)), (2, 7, 7, 3)),
    "explicit_padding": (
        dict(input_channels=2, output_channels=3, padding=((1, 0), (2, 3)), kernel_size=(3, 2)),
        (1, 5, 4, 2),
    ),
    "dilation_same": (dict(input_channels=2, output_channels=2, dilation=(2, 3)), (1, 7, 8, 2)),
    "dilation_valid_stride": (
        dict(input_channels=2, output_channels=2, dilation=(2, 2), strides=(2, 1), padding="VALID"),
        (1, 8, 7, 2),
    ),
    "groups": (dict(input_channels=4, output_channels=6, feature_group_count=2, use_bias=True), (2, 5, 5, 4)),
    "depthwise": (dict(input_channels=3, output_channels=3, feature_group_count=3, strides=(2, 2)), (1, 6, 5, 3)),
    "depthwise_multiplier": (dict(input_channels=2, output_channels=4, feature_group_count=2), (1, 4, 4, 2)),
    "pointwise_bias": (dict(input_channels=3, output_channels=5, kernel_size=(1, 1), use_bias=True), (2, 3, 3, 3)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_conv_matches_the_direct_formula(name):
    fields, shape = CASES[name]
    cfg = Conv2DConfig(**fields)
    conv = random_module(cfg, seed=1)
    x = random_normal(shape, seed=2)
    y = jit(lambda conv, x: conv(x))(conv, x)
    groups = cfg.feature_group_count
    assert conv.w.shape == (*cfg.kernel_size, cfg.input_channels // groups, cfg.output_channels)
    expected = reference_conv(x, conv.w, conv.b, cfg.strides, cfg.padding, cfg.dilation, groups)
    assert y.shape == expected.shape
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)


def test_same_padding_keeps_ceil_of_size_over_stride():
    conv = random_module(Conv2DConfig(input_channels=1, output_channels=1, kernel_size=(7, 7), strides=(2, 2)))
    y = jax.eval_shape(conv, jax.ShapeDtypeStruct((1, 224, 223, 1), jnp.float32))
    assert y.shape == (1, 112, 112, 1)


def test_weights_are_cast_to_the_input_dtype():
    conv = random_module(Conv2DConfig(input_channels=2, output_channels=3, use_bias=True))
    y = jax.eval_shape(conv, jax.ShapeDtypeStruct((1, 4, 4, 2), jnp.bfloat16))
    assert y.dtype == jnp.bfloat16
    assert conv.w.dtype == jnp.float32


def test_wrong_input_channels_is_a_clear_error():
    conv = random_module(Conv2DConfig(input_channels=4, output_channels=4, feature_group_count=2))
    with pytest.raises(ValueError, match="expects 4 input channels"):
        jax.eval_shape(conv, jax.ShapeDtypeStruct((1, 4, 4, 2), jnp.float32))


def test_xavier_uses_the_receptive_field_in_its_fans():
    cfg = Conv2DConfig(input_channels=8, output_channels=16, kernel_size=(3, 3))
    w = np.asarray(cfg.build(key(0)).w)
    limit = math.sqrt(6.0 / (9 * (8 + 16)))
    assert np.abs(w).max() <= limit
    np.testing.assert_allclose(w.std(), limit / math.sqrt(3.0), rtol=0.1)  # uniform(-a, a) has std a/sqrt(3)


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(input_channels=0, output_channels=2), r"Conv2DConfig\.input_channels must be > 0, got 0"),
        (dict(input_channels=4, output_channels=6, feature_group_count=4), r"output_channels=6 is not divisible"),
        (dict(input_channels=3, output_channels=4, feature_group_count=2), r"input_channels=3 is not divisible"),
        (dict(input_channels=1, output_channels=1, padding="same"), r"padding='same' is not valid.*'SAME'"),
        (dict(input_channels=1, output_channels=1, padding=((1, 1), (-1, 0))), r"padding=.*non-negative"),
        (dict(input_channels=1, output_channels=1, strides=(0, 1)), r"Conv2DConfig\.strides must be two positive"),
        (dict(input_channels=1, output_channels=1, dilation=(1,)), r"Conv2DConfig\.dilation must be two positive"),
    ],
)
def test_config_errors_name_the_field_and_the_value(fields, match):
    with pytest.raises(ConfigError, match=match):
        Conv2DConfig(**fields)


def test_explicit_padding_round_trips_through_json():
    cfg = Conv2DConfig(input_channels=2, output_channels=2, padding=((1, 2), (0, 3)))
    assert Conv2DConfig.from_json(cfg.to_json()) == cfg


def test_logical_axes_name_every_weight_with_names_the_rules_know():
    conv = random_module(Conv2DConfig(input_channels=2, output_channels=4, use_bias=True))
    axes = logical_axes(conv)
    assert axes.w == (None, None, "conv_in", "conv_out") and axes.b == ("conv_out",)
    table = parse_rules(())
    assert {"conv_in", "conv_out"} <= set(table)
    assert table["conv_out"] == ("fsdp",) and table["conv_in"] == ()
