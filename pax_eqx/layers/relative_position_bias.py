"""T5's relative position bias: a learned scalar per head for each bucket of key - query distance.

T5 (mesh_tensorflow's `_relative_position_bucket`, also Praxis' RelativePositionBias) gives
attention no absolute positions; instead each layer's logits get a bias that depends only on
the distance from the query to the key, looked up in a `[num_buckets, heads]` table. Distances
are bucketed: with `bidirectional` (an encoder) half of the buckets are for keys before the
query and half for keys after it; a causal decoder only sees keys at or before the query and
uses all of them for those. Within a direction, the first half of the buckets are exact
distances 0, 1, ..., and the rest grow logarithmically up to `max_distance`; every distance
beyond shares the last bucket. One module per stack, shared by its layers (as in T5): the model
computes the bias once and hands it to the stack as `bias`.

The buckets are computed in float32, as T5 does (`tf.to_float`, then truncation to int), so
a distance that sits exactly on a logarithmic bucket boundary lands where T5 puts it.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, check_range, config
from pax_eqx.layers.initializers import WeightInit


@config
class RelativePositionBiasConfig(Config):
    """T5's bucketing of key - query distances (its defaults: 32 buckets, 128 max distance).

    num_buckets: buckets in all (split between the two directions when bidirectional).
    max_distance: distances from here on share the last bucket of their direction.
    The heads, the direction and the init are decided by the model that owns the bias, so they
    are arguments of `build`.
    """

    num_buckets: int = 32
    max_distance: int = 128

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix (what depends on the
        direction is checked by `build`)."""
        check_range(self, "num_buckets", ge=2, note="half exact distances, half logarithmic", fix="T5 uses 32.")
        check_range(self, "max_distance", gt=0, fix="T5 uses 128.")

    def build(
        self, key: PRNGKeyArray, *, num_heads: int, bidirectional: bool, init: WeightInit = WeightInit()
    ) -> RelativePositionBias:
        """The bias table `[num_buckets, num_heads]`, initialised by `init`.

        bidirectional: keys on both sides of the query (an encoder) or only before it (a
        causal decoder). Both need at least one exact and one logarithmic bucket per direction,
        and max_distance beyond the exact ones.
        """
        if num_heads < 1:
            raise ConfigError(f"RelativePositionBiasConfig.build needs num_heads >= 1, got {num_heads}.")
        if bidirectional and self.num_buckets % 2:
            raise ConfigError(
                f"RelativePositionBiasConfig.num_buckets={self.num_buckets} is odd, but a bidirectional bias splits "
                "the buckets evenly between the two directions (T5 would never use the last one); use an even number."
            )
        per_direction = self.num_buckets // 2 if bidirectional else self.num_buckets
        if per_direction < 2:
            raise ConfigError(
                f"RelativePositionBiasConfig.num_buckets={self.num_buckets} leaves {per_direction} bucket per "
                "direction for a bidirectional bias; T5's bucketing needs >= 2 (half exact, half logarithmic): "
                "use >= 4."
            )
        max_exact = per_direction // 2
        if self.max_distance <= max_exact:
            raise ConfigError(
                f"RelativePositionBiasConfig.max_distance={self.max_distance} must be larger than the {max_exact} "
                f"exact distances of num_buckets={self.num_buckets} (bidirectional={bidirectional}), else the "
                f"logarithmic buckets have no range; raise max_distance above {max_exact}."
            )
        return RelativePositionBias(self, key=key, num_heads=num_heads, bidirectional=bidirectional, init=init)


class RelativePositionBias(eqx.Module):
    """`embedding[bucket(key_pos - query_pos), head]`, as an additive attention bias."""

    embedding: Float[Array, "buckets heads"]
    num_buckets: int = eqx.field(static=True)
    max_distance: int = eqx.field(static=True)
    bidirectional: bool = eqx.field(static=True)

    def __init__(
        self,
        cfg: RelativePositionBiasConfig,
        *,
        key: PRNGKeyArray,
        num_heads: int,
        bidirectional: bool,
        init: WeightInit,
    ):
        """Made by `RelativePositionBiasConfig.build`, which checks the sizes."""
        self.embedding = init(key, (cfg.num_buckets, num_heads))
        self.num_buckets = cfg.num_buckets
        self.max_distance = cfg.max_distance
        self.bidirectional = bidirectional

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        # The buckets are few and every query uses them: never sharded. Heads as attention's.
        return {"embedding": (None, "heads")}

    def __call__(
        self, query_positions: Int[Array, "#batch q"], key_positions: Int[Array, "#batch k"]
    ) -> Float[Array, "#batch heads q k"]:
        """The bias of every query against every key, float32: [#batch, heads, q, k].

        Positions are absolute token positions (a batch of 1 broadcasts against any batch);
        during decoding the queries are the new tokens and the keys every cache slot.
        """
        relative = key_positions[:, None, :] - query_positions[:, :, None]  # [#B, q, k]
        buckets = relative_position_bucket(
            relative, bidirectional=self.bidirectional, num_buckets=self.num_buckets, max_distance=self.max_distance
        )
        values = jnp.take(self.embedding.astype(jnp.float32), buckets, axis=0)  # [#B, q, k, heads]
        return jnp.transpose(values, (0, 3, 1, 2))


def relative_position_bucket(
    relative_position: Int[Array, "*shape"], *, bidirectional: bool, num_buckets: int, max_distance: int
) -> Int[Array, "*shape"]:
    """T5's `_relative_position_bucket`: relative_position = key - query -> a bucket in
    [0, num_buckets).

    n = query - key (how far back the key is). Bidirectional: keys after the query (n < 0) take
    the upper half of the buckets, and n = |n|; causal: keys after the query (never attended)
    share bucket 0 with n = 0 (so, as in T5, bidirectional bucket num_buckets // 2 is never
    used: keys after the query have n >= 1). Then n < max_exact = buckets // 2 is its own bucket, and larger
    n goes to max_exact + floor(log(n / max_exact) / log(max_distance / max_exact) *
    (buckets - max_exact)), capped at the last bucket.
    """
    n = -relative_position
    buckets = num_buckets
    ret = jnp.zeros_like(n)
    if bidirectional:
        buckets //= 2
        ret = ret + (n < 0).astype(n.dtype) * buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = buckets // 2
    is_small = n < max_exact
    # max(n, 1): log(0) is never used (is_small), but would be -inf before the where.
    scaled = jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (scaled * (buckets - max_exact)).astype(n.dtype)
    large = jnp.minimum(large, buckets - 1)
    return ret + jnp.where(is_small, n, large)
