"""How an experiment's model is quantized (`ExperimentConfig.quantization`): a choice of four.

    none        float weights (the default)
    fake_quant  quantization-aware training with Praxis' QuantizationType.FQ: every forward (train,
                eval, decode) multiplies by the chosen weights quantized and dequantized, with
                Praxis' straight-through gradient (`operations.fake_quant`); the float weights
                are what the optimizer updates and the checkpoint holds
    aqt         the same with Praxis' AQT quantizer (QuantizationType.AQT's TensorQuantizer):
                rounding is floor(x + 0.5) rather than half to even, and the scale carries
                float32's eps (add_scale_eps, its default) rather than 1 for an all-zero channel
    int         the materialized model (Praxis' MATERIALIZE, then INFERENCE): the chosen weights
                are QuantizedWeight leaves, integers and per-channel scales, in the checkpoint
                and in the products. Written by `python -m pax_eqx.quantize`; eval, decode and
                serve run it; train refuses it (integers have no gradient)

    --quantization fake_quant --quantization.weight-bits 8 --quantization.activation-bits 8
    --quantization.layers dense attention

Each variant holds Praxis' fields (WeightQuantizationParams, ActQuantizationParams) and which
layers: weight_bits, symmetric, clipping for the weights; activation_bits (0 = float
activations) and per_token for the inputs the weights multiply; `layers`, a set of

    dense      every Linear (feed-forward layers, heads, projections built from Linear)
    attention  the attention projections (w_q, w_k, w_v or the combined w_qkv, w_o)
    moe        the MoE experts' wi, wi_gate, wo (fake_quant and aqt only: their einsums take no
               integers, so `int` refuses it)
    embedding  the input embedding table (a tied embedding/softmax table: `embedding` or `softmax`)
    softmax    the output projection
    conv       Conv2D kernels

() = every layer this variant can quantize. A listed layer the model has none of is refused
when the Task is built (it would do nothing), as is a pipelined stack (its stages' weights
are reshaped per stage, which no quantized weight follows).

Activations ride on the weight: a weight whose layer quantizes its input says so (its
`activations`), and only the products that take an input (dense, conv) read it; the embedding
lookup has none.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pax_eqx.config import ConfigError, Variant, check_range, config
from pax_eqx.quantization.quantization_config import (
    MAX_BITS,
    ActivationQuantizationConfig,
    WeightQuantizationConfig,
    check_bits,
)

Layer = Literal["dense", "attention", "moe", "embedding", "softmax", "conv"]
LAYERS: tuple[str, ...] = ("dense", "attention", "moe", "embedding", "softmax", "conv")


@config
class NoQuantizationConfig(Variant):
    """Float weights and activations."""

    kind: ClassVar[str] = "none"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Nothing to check: no fields."""

    @property
    def enabled(self) -> bool:
        return False


@config
class _Quantized(Variant):
    """The fields every quantizing variant shares (the module doc).

    weight_bits: the weights' integer grid, 2 to 8 (4 packs two values a byte when materialized).
    activation_bits: the inputs of the quantized products, quantized on the fly; 0 = float.
    per_token: one activation scale per token (Praxis' per_channel, its default); False: one per
      tensor. Read only with activation_bits > 0.
    symmetric: a weight's scale from max |w| (Praxis' default); False: from its range, with a
      zero point per channel.
    clipping: a channel's bound times this before its scale (Praxis' clipping_coeff); 1 = the max.
    layers: which layers' weights (module doc); () = every one this variant takes.
    """

    weight_bits: int = 8
    activation_bits: int = 0
    per_token: bool = True
    symmetric: bool = True
    clipping: float = 1.0
    layers: tuple[Layer, ...] = ()

    def __post_init__(self) -> None:
        self.validate()

    @property
    def enabled(self) -> bool:
        return True

    @property
    def where(self) -> str:
        return f"quantization ({self.kind})"

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        check_bits(f"{self.where}.weight_bits", self.weight_bits)
        check_range(
            self, "activation_bits", ge=0, le=MAX_BITS, prefix=self.where, note="0 = float activations",
            fix="Pass e.g. --quantization.activation-bits 8, or 0.",
        )  # fmt: skip
        if self.activation_bits:
            check_bits(f"{self.where}.activation_bits", self.activation_bits)
        check_range(self, "clipping", gt=0, le=1, prefix=self.where, note="1 = the channel's hard max")
        unknown = [name for name in self.layers if name not in LAYERS]
        if unknown or len(set(self.layers)) != len(self.layers):
            raise ConfigError(
                f"{self.where}.layers={self.layers!r} names {unknown or 'a layer twice'}; name each of {LAYERS} at "
                "most once, or none for every one."
            )
        if not self.activation_bits and not self.per_token:
            raise ConfigError(
                f"{self.where}.per_token=False has no effect with activation_bits=0 (float activations); set "
                "--quantization.activation-bits 8 or drop --quantization.no-per-token."
            )
        if self.activation_bits and not self.symmetric:
            raise ConfigError(
                f"{self.where}.symmetric=False with activation_bits={self.activation_bits}: an asymmetric weight's "
                "zero point has no integer product with quantized activations (Praxis refuses it too); quantize the "
                "weights symmetric or the activations not at all."
            )

    def chosen(self, layer: str) -> bool:
        """Whether `layer` (one of LAYERS) is quantized."""
        return not self.layers or layer in self.layers

    def weight_spec(self) -> WeightQuantizationConfig:
        return WeightQuantizationConfig(bits=self.weight_bits, symmetric=self.symmetric, clipping=self.clipping)

    def activation_spec(self) -> ActivationQuantizationConfig | None:
        """The activations' config, None when they stay float."""
        if not self.activation_bits:
            return None
        return ActivationQuantizationConfig(bits=self.activation_bits, per_token=self.per_token)


@config
class FakeQuantConfig(_Quantized):
    """Quantization-aware training, Praxis' fake quantization (module doc)."""

    kind: ClassVar[str] = "fake_quant"


@config
class AqtConfig(_Quantized):
    """Quantization-aware training with Praxis' AQT quantizer (module doc)."""

    kind: ClassVar[str] = "aqt"


@config
class IntQuantizationConfig(_Quantized):
    """The materialized model: int weights and scales (module doc). `python -m pax_eqx.quantize`
    writes it into the job dir it makes; it is not a training choice."""

    kind: ClassVar[str] = "int"

    def validate(self) -> None:
        """The shared checks; and `moe`, whose einsums take no integers, refused."""
        super().validate()
        if "moe" in self.layers:
            raise ConfigError(
                f"{self.where}.layers={self.layers!r}: the MoE experts' einsums take no integer weights; leave moe "
                "out of the materialized model (train with fake_quant to quantize them in training)."
            )


QuantizationConfig = NoQuantizationConfig | FakeQuantConfig | AqtConfig | IntQuantizationConfig
"""The choice of a model's quantization (`--quantization fake_quant`)."""
