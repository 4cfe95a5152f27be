"""Image sources: digits as 8x8x1 images, .npz files, folders of PNGs and in-memory arrays, each
against its ground truth; host sharding and padded eval epochs; bad inputs name the field."""

import numpy as np
import pytest

from pax_eqx.config import ConfigError
from pax_eqx.data import DataConfig, InputConfig, build_input, build_tokenizer
from pax_eqx.data.augment import AugmentConfig
from pax_eqx.data.digits import digits_examples

EVAL = InputConfig(batch_size=4, shuffle=False, repeat=False, reset_for_eval=True)


def read_all(inp):
    return list(inp)


def inputs(data, split, hosts=1, index=0):
    data.validate()
    return build_input(data, split, build_tokenizer(data), hosts, index)


def test_digits_images_are_the_flat_digits_as_8x8x1():
    data = DataConfig(source="digits_images", eval=InputConfig(batch_size=64, **_finite()))
    batches = read_all(inputs(data, "eval"))
    flat = list(digits_examples("eval", data.eval_fraction))
    x = np.concatenate([b["inputs"] for b in batches])
    w = np.concatenate([b["weights"] for b in batches])
    y = np.concatenate([b["labels"] for b in batches])
    assert batches[0]["inputs"].shape == (64, 8, 8, 1) and batches[0]["inputs"].dtype == np.float32
    assert batches[0]["labels"].dtype == np.int32 and batches[0]["weights"].dtype == np.float32
    real = w == 1
    assert real.sum() == len(flat) == 180
    np.testing.assert_array_equal(x[real].reshape(len(flat), 64), np.stack([e["inputs"] for e in flat]))
    np.testing.assert_array_equal(y[real], [e["labels"] for e in flat])
    assert not x[~real].any()  # padding rows are all zero

    train = inputs(data, "train").get_next()
    assert train["inputs"].shape == (12, 8, 8, 1) and 0.0 <= train["inputs"].min() and train["inputs"].max() <= 1.0


def _finite():
    return dict(shuffle=False, repeat=False, reset_for_eval=True)


def test_digits_images_rejects_fields_that_would_do_nothing():
    with pytest.raises(ConfigError, match="data.path='x' would do nothing"):
        DataConfig(source="digits_images", path="x").validate()
    with pytest.raises(ConfigError, match=r"data.augment.mean=\(0.5, 0.5, 0.5\) has 3 value"):
        DataConfig(source="digits_images", augment=AugmentConfig(mean=(0.5,) * 3, std=(0.2,) * 3)).validate()
    with pytest.raises(ConfigError, match="data.augment.crop_padding=2 would do nothing"):
        DataConfig(source="digits", augment=AugmentConfig(crop_padding=2)).validate()
