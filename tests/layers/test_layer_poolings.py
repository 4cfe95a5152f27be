"""Max, average and global pooling against NumPy windows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from layer_reference import jit, random_normal
from test_layer_convolutions import _pads

from pax_eqx.config import ConfigError
from pax_eqx.layers import GlobalPoolingConfig, PoolingConfig


def reference_pool(x, kind, window, strides, padding):
    """Each output is the max / mean of the *real* pixels under its window (padding is NaN here)."""
    x = np.asarray(x, np.float64)
    pad_h = _pads(padding if isinstance(padding, str) else padding[0], x.shape[1], window[0], strides[0], 1)
    pad_w = _pads(padding if isinstance(padding, str) else padding[1], x.shape[2], window[1], strides[1], 1)
    xp = np.pad(x, ((0, 0), pad_h, pad_w, (0, 0)), constant_values=np.nan)
    out_h = (xp.shape[1] - window[0]) // strides[0] + 1
    out_w = (xp.shape[2] - window[1]) // strides[1] + 1
    reduce = np.nanmax if kind == "max" else np.nanmean
    y = np.zeros((x.shape[0], out_h, out_w, x.shape[3]))
    for i in range(out_h):
        for j in range(out_w):
            patch = xp[:, i * strides[0] : i * strides[0] + window[0], j * strides[1] : j * strides[1] + window[1]]
            y[:, i, j] = reduce(patch, axis=(1, 2))
    return y


CASES = {
    "max_3x3_s2_same": dict(kind="max", window=(3, 3), strides=(2, 2), padding="SAME"),
    "max_2x2_valid": dict(kind="max", window=(2, 2), strides=(2, 2), padding="VALID"),
    "max_explicit": dict(kind="max", window=(3, 2), strides=(1, 2), padding=((1, 1), (0, 1))),
    "avg_3x3_s2_same": dict(kind="avg", window=(3, 3), strides=(2, 2), padding="SAME"),
    "avg_3x3_s1_same": dict(kind="avg", window=(3, 3), strides=(1, 1), padding="SAME"),
    "avg_2x3_valid": dict(kind="avg", window=(2, 3), strides=(1, 2), padding="VALID"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_pooling_matches_numpy(name):
    cfg = PoolingConfig(**CASES[name])
    x = random_normal((2, 7, 6, 3), seed=3) - 2.0  # negative values: padding must not win a max
    y = jit(lambda x: cfg.build()(x))(x)
    expected = reference_pool(x, cfg.kind, cfg.window, cfg.strides, cfg.padding)
    assert y.shape == expected.shape
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["avg", "max"])
def test_global_pooling(kind):
    x = random_normal((2, 3, 4, 5), seed=4)
    y = jit(lambda x: GlobalPoolingConfig(kind=kind).build()(x))(x)
    reduce = np.mean if kind == "avg" else np.max
    np.testing.assert_allclose(y, reduce(np.asarray(x), axis=(1, 2)), rtol=1e-5, atol=1e-6)


def test_pooling_keeps_the_input_dtype():
    for kind in ("max", "avg"):
        y = jax.eval_shape(PoolingConfig(kind=kind).build(), jax.ShapeDtypeStruct((1, 4, 4, 2), jnp.bfloat16))
        assert y.dtype == jnp.bfloat16 and y.shape == (1, 2, 2, 2)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: PoolingConfig(kind="mean"), r"PoolingConfig\.kind='mean' is unknown: use 'max' or 'avg'"),
        (lambda: PoolingConfig(window=(0, 2)), r"PoolingConfig\.window must be two positive ints"),
        (lambda: PoolingConfig(padding="FULL"), r"PoolingConfig\.padding='FULL' is not valid"),
        (lambda: GlobalPoolingConfig(kind="sum"), r"GlobalPoolingConfig\.kind='sum' is unknown"),
    ],
)
def test_config_errors(make, match):
    with pytest.raises(ConfigError, match=match):
        make()
