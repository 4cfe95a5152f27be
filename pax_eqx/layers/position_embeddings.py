"""Position embeddings: trainable, sinusoidal, and rotary (praxis.layers.embedding_softmax).

All take explicit integer `positions` ([batch, seq]), not just a length: packed sequences
restart positions at each document (`segment_pos`), and decoding asks for one position at a
time. Sinusoidal and rotary follow Praxis' timescale conventions (min 1, max 10_000; rotary
rotates the first half of each head against the second half, not interleaved pairs).
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, config, require_positive
from pax_eqx.layers.initializers import WeightInit, gaussian


@config
class TrainablePositionalEmbeddingConfig(Config):
    """A learned `[max_seq_length, embedding_dims]` table."""

    max_seq_length: int
    embedding_dims: int
    init: WeightInit = gaussian(0.02)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        require_positive(self, ("max_seq_length", "embedding_dims"))

    def build(self, key: PRNGKeyArray) -> TrainablePositionalEmbedding:
        return TrainablePositionalEmbedding(self, key=key)


class TrainablePositionalEmbedding(eqx.Module):
    emb_var: Float[Array, "max_seq embed"]

    def __init__(self, cfg: TrainablePositionalEmbeddingConfig, *, key: PRNGKeyArray):
        self.emb_var = cfg.init(key, (cfg.max_seq_length, cfg.embedding_dims))

    def __call__(self, positions: Int[Array, "*batch"]) -> Float[Array, "*batch embed"]:
        return jnp.take(self.emb_var, positions, axis=0)

    def first(self, length: int) -> Float[Array, "length embed"]:
        """Rows 0..length-1: positions of unpacked sequences. A slice, so the gradient is a
        pad (and a sum over the batch) rather than the scatter-add a gather of [batch, length]
        positions costs in the backward pass."""
        return self.emb_var[:length]

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {"emb_var": (None, "embed")}


def sinusoidal_position_embedding(
    positions: Int[Array, "*batch"],
    embedding_dims: int,
    min_timescale: float = 1.0,
    max_timescale: float = 10_000.0,
) -> Float[Array, "*batch embed"]:
    """Praxis PositionalEmbedding: concat(sin(p * inv_t), cos(p * inv_t)), zero-padded if odd."""
    num_timescales = embedding_dims // 2
    log_increment = math.log(max_timescale / min_timescale) / max(num_timescales - 1, 1)
    inv_timescales = min_timescale * jnp.exp(jnp.arange(num_timescales, dtype=jnp.float32) * -log_increment)
    scaled = positions.astype(jnp.float32)[..., None] * inv_timescales
    signal = jnp.concatenate([jnp.sin(scaled), jnp.cos(scaled)], axis=-1)
    if embedding_dims % 2:
        signal = jnp.pad(signal, [(0, 0)] * (signal.ndim - 1) + [(0, 1)])
    return signal


def apply_rotary(
    x: Float[Array, "*batch seq heads dim"],
    positions: Int[Array, "*batch seq"],
    min_timescale: float = 1.0,
    max_timescale: float = 10_000.0,
    inv_timescales: Float[Array, " half"] | None = None,
) -> Float[Array, "*batch seq heads dim"]:
    """Rotary position embedding (RoPE), Praxis' RotaryPositionalEmbedding.

    Each head's first half (x1) and second half (x2) are rotated by angle p / timescale_i:
    [x1 cos - x2 sin, x2 cos + x1 sin]. Dot products of rotated q and k depend only on the
    position difference, which is what makes attention shift-invariant. `inv_timescales`
    ([dim / 2]), when given, are the frequencies 1 / timescale_i instead (a scaled rotary, as
    Llama 3.1's: `layers.rotary_scaling`); the angle is then p * inv_timescales_i.
    """
    dim = x.shape[-1]
    if dim % 2:
        raise ConfigError(f"rotary embedding needs an even head dimension, got {dim}.")
    if inv_timescales is not None:
        angle = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_timescales, jnp.float32)
    else:
        fraction = 2.0 * jnp.arange(dim // 2, dtype=jnp.float32) / dim
        timescale = min_timescale * (max_timescale / min_timescale) ** fraction
        angle = positions.astype(jnp.float32)[..., None] / timescale  # [..., seq, dim/2]
    # The tables are made once, into a buffer: XLA fuses an elementwise producer into each of its
    # consumers, so sin and cos would be evaluated again for every element each rotation writes
    # (every head, both halves, forward and backward: on CPU a scalar libm call each, +11% of
    # shakespeare_char's step; an optimization barrier did not stop it). A matmul's output is
    # always a buffer, and x @ I at "highest" precision is x exactly, so the tables go through
    # one [rows, dim] x [dim, dim] identity matmul (docs/performance.md "CPU").
    tables = jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], axis=-1)
    tables = jnp.dot(tables, jnp.eye(dim, dtype=jnp.float32), precision=jax.lax.Precision.HIGHEST)
    sin, cos = tables[..., None, : dim // 2], tables[..., None, dim // 2 :]  # [..., seq, 1, dim/2]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)
