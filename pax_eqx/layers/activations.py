"""Activations (praxis.layers.activations), one stateless module selected by name.

Why one module with a `name` rather than a class per function: the activation is a child
*template* of FeedForward and the transformer MLP, and a single concrete config type keeps
those templates parseable by tyro (`--model.ff.activation.name gelu`) and JSON-serialisable
without a type registry. Gated variants (GeGLU, SwiGLU) are an MLP property (`gated=True`):
`act(x W_gate) * (x W)`, as Praxis' `use_gated_activation`.
"""

from __future__ import annotations

import difflib
import math
import typing
from collections.abc import Callable
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from pax_eqx.config import Config, ConfigError, check_range, config

ActivationName = Literal[
    "relu", "relu6", "squared_relu", "leaky_relu", "elu", "sigmoid", "tanh",
    "gelu", "gelu_exact", "silu", "swish", "softplus", "identity",
]  # fmt: skip


def _fn(name: str, negative_slope: float | None) -> Callable[[Array], Array]:
    return {
        "relu": jax.nn.relu,
        "relu6": jax.nn.relu6,
        "squared_relu": lambda x: jnp.square(jax.nn.relu(x)),
        "leaky_relu": lambda x: jax.nn.leaky_relu(x, negative_slope),
        "elu": jax.nn.elu,
        "sigmoid": jax.nn.sigmoid,
        "tanh": jnp.tanh,
        # Praxis' GELU defaults to the tanh approximation; "gelu_exact" is the erf form.
        "gelu": lambda x: jax.nn.gelu(x, approximate=True),
        "gelu_exact": _gelu_exact,
        "silu": jax.nn.silu,
        "swish": jax.nn.silu,
        "softplus": jax.nn.softplus,
        "identity": lambda x: x,
    }[name]


_DEFAULT_NEGATIVE_SLOPE = 0.01


def _gelu_exact(x: Array) -> Array:
    """x * Phi(x) = x (1 + erf(x / sqrt 2)) / 2, as written (PyTorch's and Praxis' exact GELU).

    Not `jax.nn.gelu(approximate=False)`, which computes Phi through erfc for accuracy in the far
    negative tail (|x| > 5, where GELU is below 1e-6 anyway): XLA expands erfc on CPU into an
    exponential and two branches that cost about as much as the layer's matmuls (measured,
    docs/performance.md "CPU"), while erf is one polynomial. The two agree to 1e-6 absolute.
    """
    return 0.5 * x * (1.0 + jax.lax.erf(x * (1.0 / math.sqrt(2.0))))


@config
class ActivationConfig(Config):
    """name: which function; negative_slope: LeakyReLU's slope for x < 0.

    gated: used by the layers that own the projections (FeedForward, TransformerFeedForward):
      GeGLU is name="gelu", gated=True; SwiGLU is name="silu", gated=True.
    """

    name: ActivationName = "relu"
    negative_slope: float = _DEFAULT_NEGATIVE_SLOPE
    gated: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        names = typing.get_args(ActivationName)
        if self.name not in names:
            close = difflib.get_close_matches(str(self.name), names, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"ActivationConfig.name={self.name!r} is unknown.{hint} Choose one of {', '.join(names)}."
            )
        check_range(self, "negative_slope")
        if self.name != "leaky_relu" and self.negative_slope != _DEFAULT_NEGATIVE_SLOPE:
            raise ConfigError(
                f"ActivationConfig.negative_slope={self.negative_slope} has no effect with name={self.name!r} "
                "(only leaky_relu has a slope); use name='leaky_relu' or leave negative_slope at its default "
                f"{_DEFAULT_NEGATIVE_SLOPE}."
            )

    def build(self, key=None) -> Activation:
        return Activation(self)


def geglu() -> ActivationConfig:
    return ActivationConfig(name="gelu", gated=True)


def swiglu() -> ActivationConfig:
    return ActivationConfig(name="silu", gated=True)


class Activation(eqx.Module):
    """y = f(x), elementwise; no parameters."""

    name: str = eqx.field(static=True)
    negative_slope: float | None = eqx.field(static=True)  # leaky_relu's only: a module holds what it uses

    def __init__(self, cfg: ActivationConfig = ActivationConfig()):
        self.name = cfg.name
        self.negative_slope = cfg.negative_slope if cfg.name == "leaky_relu" else None

    def __call__(self, x: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        return _fn(self.name, self.negative_slope)(x)
