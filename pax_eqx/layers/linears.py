"""Linear, Bias, FeedForward and MLPBlock (praxis.layers.linears).

Weights are stored `[input_dims, output_dims]` as in Praxis, so `y = x @ w` acts on any
leading (batch, time, ...) dimensions. Each weight dimension carries a logical axis name
(`axes`), which the sharding rules map onto the mesh.

Every projection of the layers (`dense`: these, the attention's and the softmax's) is one 2-D
matmul over the flattened leading dimensions. The result is the same as an einsum over
`[batch, time, in]`, but its autodiff gives the weight gradient as a plain `[in, rows] x [rows,
out]` contraction: XLA:CPU compiles the einsum's two-batch-dimension form into a transposing
copy of the activation gradient fused into its producer (the GELU backward computed twice,
once in a strided order) -- measured, the backward of a 128 -> 512 -> 128 GELU MLP on 768
tokens took 2x as long (docs/performance.md, "CPU").
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, check_range, config, require_positive
from pax_eqx.layers.activations import Activation, ActivationConfig
from pax_eqx.layers.fp8 import Fp8Scales, fp8_dense
from pax_eqx.layers.initializers import WeightInit
from pax_eqx.layers.low_rank import LowRankAdapted
from pax_eqx.quantization.products import quantized_matmul
from pax_eqx.quantization.quantized_weight import QuantizedWeight


@config
class LinearConfig(Config):
    """y = x @ w, w: [input_dims, output_dims]. `axes` are w's logical axis names.

    fp8: the matmul in fp8 with delayed scaling (`layers.fp8`): x and w in e4m3, the gradient in
    e5m2. Pays on Hopper GPUs and later, on large matmuls.
    """

    input_dims: int
    output_dims: int
    init: WeightInit = WeightInit()
    axes: tuple[str, str] = ("embed", "mlp")
    fp8: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field and the value."""
        require_positive(self, ("input_dims", "output_dims"))

    def build(self, key: PRNGKeyArray) -> Linear:
        return Linear(self, key=key)


class Linear(eqx.Module):
    w: Float[Array, "input_dims output_dims"]
    fp8: Fp8Scales | None  # the delayed-scaling state of an fp8 matmul; None: in x's dtype
    axes: tuple[str, str] = eqx.field(static=True)

    def __init__(self, cfg: LinearConfig, *, key: PRNGKeyArray):
        self.w = cfg.init(key, (cfg.input_dims, cfg.output_dims))
        self.fp8 = Fp8Scales() if cfg.fp8 else None
        self.axes = cfg.axes

    def __call__(self, x: Float[Array, "*batch input_dims"]) -> Float[Array, "*batch output_dims"]:
        return _matmul(x, self.w, self.fp8)

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {"w": self.axes}


def _matmul(
    x: Float[Array, "*batch input_dims"],
    w: Float[Array, "input_dims output_dims"] | LowRankAdapted | QuantizedWeight,
    fp8: Fp8Scales | None,
) -> Float[Array, "*batch output_dims"]:
    """x @ w in x's dtype. A function of both arrays so the shape check ties x to the weight
    (jaxtyping does not relate a call's argument to the module's field annotations)."""
    return dense(x, w, fp8)


def dense(
    x: Float[Array, "*batch input_dims"],
    w: Float[Array, "input_dims output_dims"] | LowRankAdapted | QuantizedWeight,
    fp8: Fp8Scales | None = None,
) -> Float[Array, "*batch output_dims"]:
    """x @ w in x's dtype, as one 2-D matmul over the flattened leading dimensions (see the
    module docstring for why not an einsum); in fp8 with delayed scaling when `fp8` is given.
    A LoRA-adapted weight (`layers.low_rank`, a LoRA run's training forward with dropout)
    computes x @ W + s dropout(x) @ A @ B. A quantized weight (`quantization.QuantizedWeight`)
    computes Praxis' INFERENCE product: its integers times x (or times x quantized, in int32),
    scaled per output channel after the matmul (`quantization.products`)."""
    if isinstance(w, LowRankAdapted):
        if fp8 is not None:
            raise ConfigError(f"lora.targets: {w.name} is an fp8 matmul; turn fp8 off for a LoRA run.")
        return w.matmul(x)
    if isinstance(w, QuantizedWeight):
        if fp8 is not None:
            raise ConfigError(
                "a quantized weight reached an fp8 matmul (its layer's fp8=True): a weight is either int-quantized or "
                "fp8; turn fp8 off for the quantized layers."
            )
        return quantized_matmul(x, w)
    if fp8 is not None:
        return fp8_dense(x, w, fp8)
    y = jnp.dot(x.reshape(-1, x.shape[-1]), w.astype(x.dtype))
    return y.reshape(*x.shape[:-1], w.shape[-1])


@config
class BiasConfig(Config):
    """y = x + b, b: [dims], initialised to zero."""

    dims: int
    axis: str = "mlp"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field and the value."""
        require_positive(self, ("dims",))

    def build(self, key: PRNGKeyArray | None = None) -> Bias:
        return Bias(self)


class Bias(eqx.Module):
    b: Float[Array, " dims"]
    axis: str = eqx.field(static=True)

    def __init__(self, cfg: BiasConfig):
        self.b = jnp.zeros((cfg.dims,), jnp.float32)
        self.axis = cfg.axis

    def __call__(self, x: Float[Array, "*batch dims"]) -> Float[Array, "*batch dims"]:
        return _add(x, self.b)

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {"b": (self.axis,)}


def _add(x: Float[Array, "*batch dims"], b: Float[Array, " dims"]) -> Float[Array, "*batch dims"]:
    """x + b in x's dtype; a function of both so the shape check ties x to the bias."""
    return x + b.astype(x.dtype)


@config
class FeedForwardConfig(Config):
    """activation(x @ w + b); with a gated activation, activation(x @ w_gate + b_gate) * (x @ w + b).

    fp8: both projections in fp8 (LinearConfig.fp8)."""

    input_dims: int
    output_dims: int
    has_bias: bool = True
    activation: ActivationConfig = ActivationConfig()
    init: WeightInit = WeightInit()
    axes: tuple[str, str] = ("embed", "mlp")
    fp8: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field and the value."""
        require_positive(self, ("input_dims", "output_dims"))

    def build(self, key: PRNGKeyArray) -> FeedForward:
        return FeedForward(self, key=key)


class FeedForward(eqx.Module):
    linear: Linear
    bias: Bias | None
    gate: Linear | None
    gate_bias: Bias | None
    activation: Activation

    def __init__(self, cfg: FeedForwardConfig, *, key: PRNGKeyArray):
        k_lin, k_gate = jax.random.split(key)
        lin = LinearConfig(
            input_dims=cfg.input_dims, output_dims=cfg.output_dims, init=cfg.init, axes=cfg.axes, fp8=cfg.fp8
        )
        bias = BiasConfig(dims=cfg.output_dims, axis=cfg.axes[1])
        gated = cfg.activation.gated
        self.linear = lin.build(k_lin)
        self.bias = bias.build() if cfg.has_bias else None
        self.gate = lin.build(k_gate) if gated else None
        self.gate_bias = bias.build() if gated and cfg.has_bias else None
        self.activation = cfg.activation.build()

    def __call__(self, x: Float[Array, "*batch input_dims"]) -> Float[Array, "*batch output_dims"]:
        y = self.linear(x)
        if self.bias is not None:
            y = self.bias(y)
        if self.gate is None:
            return self.activation(y)
        g = self.gate(x)
        if self.gate_bias is not None:
            g = self.gate_bias(g)
        return self.activation(g) * y


@config
class MLPBlockConfig(Config):
    """`num_layers` FeedForward layers: input_dims -> hidden_dims (x num_layers-1) -> output_dims.

    has_bias / activation / init / axes: every layer's, as FeedForwardConfig's (they are fields
    here rather than a FeedForwardConfig template, whose sizes the block would overwrite).
    hidden_dims: required with num_layers > 1; with one layer there is no hidden width (leave 0).
    """

    num_layers: int = 2
    input_dims: int
    hidden_dims: int = 0
    output_dims: int
    has_bias: bool = True
    activation: ActivationConfig = ActivationConfig()
    init: WeightInit = WeightInit()
    axes: tuple[str, str] = ("embed", "mlp")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        check_range(self, "num_layers", ge=1)
        require_positive(self, ("input_dims", "output_dims"))
        check_range(self, "hidden_dims", ge=0, note="0 with one layer")
        if self.num_layers > 1 and self.hidden_dims <= 0:
            raise ConfigError(
                f"MLPBlockConfig.hidden_dims must be > 0 with num_layers={self.num_layers}, got {self.hidden_dims}."
            )
        if self.num_layers == 1 and self.hidden_dims:
            raise ConfigError(
                f"MLPBlockConfig.hidden_dims={self.hidden_dims} has no effect with num_layers=1 (one layer maps "
                "input_dims to output_dims); leave hidden_dims at 0 or use num_layers > 1."
            )

    def build(self, key: PRNGKeyArray) -> MLPBlock:
        return MLPBlock(self, key=key)


class MLPBlock(eqx.Module):
    layers: tuple[FeedForward, ...]

    def __init__(self, cfg: MLPBlockConfig, *, key: PRNGKeyArray):
        dims = [cfg.input_dims] + [cfg.hidden_dims] * (cfg.num_layers - 1) + [cfg.output_dims]
        keys = jax.random.split(key, cfg.num_layers)
        self.layers = tuple(
            FeedForwardConfig(
                input_dims=i, output_dims=o, has_bias=cfg.has_bias, activation=cfg.activation, init=cfg.init,
                axes=cfg.axes,
            ).build(k)
            for i, o, k in zip(dims[:-1], dims[1:], keys)
        )  # fmt: skip

    def __call__(self, x: Float[Array, "*batch input_dims"]) -> Float[Array, "*batch output_dims"]:
        for layer in self.layers:
            x = layer(x)
        return x
