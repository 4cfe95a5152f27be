"""Weight initialisation (Pax's `WeightInit`), as a small config.

Pax's default `params_init` is Xavier-uniform with scale 1.0; GPT-style models use a
Gaussian with a small standard deviation (nanoGPT: 0.02). `fan_in`/`fan_out` are taken from
the shape's last two dimensions, as Praxis does for a `[input, output]` weight.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, check_range, config

InitMethod = Literal["xavier", "gaussian", "uniform", "constant"]


@config
class WeightInit(Config):
    """How a weight is initialised.

    method: "xavier" (uniform, Pax's default), "gaussian" (std = scale), "uniform"
      (in [-scale, scale]) or "constant" (every entry = scale).
    scale: the method's scale (Xavier's gain).
    """

    method: InitMethod = "xavier"
    scale: float = 1.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.method not in get_args(InitMethod):
            raise ConfigError(f"WeightInit.method={self.method!r} is not one of {get_args(InitMethod)}.")
        if self.method == "constant":
            check_range(self, "scale", note="every entry's value")
        else:
            check_range(self, "scale", ge=0, note=f"the {self.method} init's scale; 0 = all zeros")

    def __call__(self, key: PRNGKeyArray, shape: tuple[int, ...], dtype=jnp.float32) -> Array:
        if self.method == "constant":
            return jnp.full(shape, self.scale, dtype)
        if self.method == "gaussian":
            return self.scale * jax.random.normal(key, shape, dtype)
        if self.method == "uniform":
            return jax.random.uniform(key, shape, dtype, -self.scale, self.scale)
        fan_in, fan_out = (shape[-2], shape[-1]) if len(shape) >= 2 else (shape[0], shape[0])
        limit = self.scale * math.sqrt(6.0 / (fan_in + fan_out))
        return jax.random.uniform(key, shape, dtype, -limit, limit)


def xavier(scale: float = 1.0) -> WeightInit:
    return WeightInit(method="xavier", scale=scale)


def gaussian(std: float) -> WeightInit:
    return WeightInit(method="gaussian", scale=std)


def constant(value: float) -> WeightInit:
    return WeightInit(method="constant", scale=value)
