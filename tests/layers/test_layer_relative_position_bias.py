"""T5's relative position bias against a numpy transcription of mesh_tensorflow's bucketing."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from layer_reference import jit, random_module

from pax_eqx.config import ConfigError
from pax_eqx.layers import RelativePositionBiasConfig, WeightInit, relative_position_bucket
from pax_eqx.sharding.logical import logical_axes

HEADS = 3


def t5_relative_position_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """mesh_tensorflow.transformer.attention._relative_position_bucket (and t5's), line by line,
    in float64 numpy."""
    ret = 0
    n = -relative_position
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0).astype(np.int64) * num_buckets
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    # now n is in the range [0, inf)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    with np.errstate(divide="ignore", invalid="ignore"):
        val_if_large = max_exact + (
            np.log(n.astype(np.float64) / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
        ).astype(np.int64)
    val_if_large = np.minimum(val_if_large, num_buckets - 1)
    ret += np.where(is_small, n, val_if_large)
    return ret


# Distances from -1000 to 1000: both directions, every exact and logarithmic bucket, and far
# beyond max_distance (which must all share the last bucket of their direction).
RELATIVE = np.arange(-1000, 1001)


@pytest.mark.parametrize("bidirectional", [True, False], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 20), (10, 33)])
def test_buckets_match_t5(bidirectional, num_buckets, max_distance):
    ours = relative_position_bucket(
        jnp.asarray(RELATIVE, jnp.int32), bidirectional=bidirectional, num_buckets=num_buckets,
        max_distance=max_distance,
    )  # fmt: skip
    expected = t5_relative_position_bucket(RELATIVE, bidirectional, num_buckets, max_distance)
    np.testing.assert_array_equal(ours, expected)
    # Every bucket is reached, but for T5's quirk: keys after the query have n >= 1, so the
    # bidirectional upper half's "distance 0" bucket (num_buckets // 2) is never used.
    unused = {num_buckets // 2} if bidirectional else set()
    assert set(np.unique(expected).tolist()) == set(range(num_buckets)) - unused
    beyond = np.abs(RELATIVE) >= max_distance
    last = num_buckets // 2 - 1 if bidirectional else num_buckets - 1
    assert set(expected[beyond & (RELATIVE < 0)]) == {last}
    assert set(expected[beyond & (RELATIVE > 0)]) == ({2 * last + 1} if bidirectional else {0})


def test_t5_default_buckets_by_hand():
    """A few of T5's default (32 buckets, 128) buckets worked out by hand: n = query - key."""
    bucket = lambda rel, bi: int(relative_position_bucket(jnp.asarray(rel), bidirectional=bi, num_buckets=32,
                                                          max_distance=128))  # fmt: skip
    # Bidirectional: 16 per direction, 8 exact, keys after the query in 16..31.
    assert [bucket(r, True) for r in (0, -1, -7, -8, -15, -16, -127, -128, -5000)] == [0, 1, 7, 8, 9, 10, 15, 15, 15]
    assert [bucket(r, True) for r in (1, 7, 8, 5000)] == [17, 23, 24, 31]
    # Causal: 32 for keys at or before the query, 16 exact; later keys share bucket 0.
    assert [bucket(r, False) for r in (0, 3, -1, -15, -16, -32, -127, -9999)] == [0, 0, 1, 15, 16, 21, 31, 31]


@pytest.mark.parametrize("bidirectional", [True, False], ids=["bidirectional", "causal"])
def test_bias_is_the_embedding_of_the_bucket(bidirectional):
    cfg = RelativePositionBiasConfig(num_buckets=8, max_distance=20)
    module = random_module(lambda k: cfg.build(k, num_heads=HEADS, bidirectional=bidirectional), seed=2)
    assert module.embedding.shape == (8, HEADS)
    q_pos = np.asarray([[0, 3, 9, 40], [5, 6, 7, 8]])
    k_pos = np.asarray([[0, 1, 2, 3, 30, 60], [0, 5, 10, 15, 20, 100]])
    bias = jit(lambda m, q, k: m(q, k))(module, jnp.asarray(q_pos), jnp.asarray(k_pos))
    assert bias.shape == (2, HEADS, 4, 6) and bias.dtype == jnp.float32
    buckets = t5_relative_position_bucket(k_pos[:, None, :] - q_pos[:, :, None], bidirectional, 8, 20)
    expected = np.asarray(module.embedding)[buckets]  # [B, q, k, heads]
    np.testing.assert_array_equal(bias, expected.transpose(0, 3, 1, 2))


def test_a_batch_of_one_broadcasts():
    cfg = RelativePositionBiasConfig(num_buckets=8, max_distance=20)
    module = random_module(lambda k: cfg.build(k, num_heads=HEADS, bidirectional=True), seed=2)
    pos = jnp.arange(5)[None]
    assert eqx.filter_eval_shape(module, pos, pos).shape == (1, HEADS, 5, 5)
    # Decoding: one new query at position 3 against 7 cache slots.
    step = jit(lambda m, q, k: m(q, k))(module, jnp.asarray([[3]]), jnp.arange(7)[None])
    full = jit(lambda m, q, k: m(q, k))(module, jnp.arange(7)[None], jnp.arange(7)[None])
    np.testing.assert_array_equal(step[:, :, 0], full[:, :, 3])


def test_build_init_and_logical_axes():
    module = RelativePositionBiasConfig().build(
        jax.random.key(0), num_heads=HEADS, bidirectional=False, init=WeightInit(method="constant", scale=0.25)
    )
    np.testing.assert_array_equal(module.embedding, np.full((32, HEADS), 0.25))
    assert tuple(logical_axes(module).embedding) == (None, "heads")


@pytest.mark.parametrize(
    "fields, build, match",
    [
        (dict(num_buckets=1), {}, "num_buckets"),
        (dict(max_distance=0), {}, "max_distance"),
        (dict(num_buckets=9), dict(bidirectional=True), "num_buckets=9 is odd"),
        (dict(num_buckets=2), dict(bidirectional=True), "num_buckets=2 leaves 1 bucket"),
        (dict(num_buckets=32, max_distance=8), dict(bidirectional=True), "max_distance=8"),
        (dict(num_buckets=32, max_distance=16), dict(bidirectional=False), "max_distance=16"),
    ],
)
def test_config_errors_name_the_field(fields, build, match):
    with pytest.raises(ConfigError, match=match):
        cfg = RelativePositionBiasConfig(**fields)
        cfg.build(jax.random.key(0), num_heads=HEADS, **{"bidirectional": False, **build})


def test_smallest_valid_configs_build():
    RelativePositionBiasConfig(num_buckets=2, max_distance=2).build(jax.random.key(0), num_heads=1, bidirectional=False)
    RelativePositionBiasConfig(num_buckets=4, max_distance=2).build(jax.random.key(0), num_heads=1, bidirectional=True)
    RelativePositionBiasConfig(num_buckets=9, max_distance=8).build(jax.random.key(0), num_heads=1, bidirectional=False)
