"""Quantized weights (Praxis' praxis/layers/quantization): integers and per-channel scales in a float
weight's place, multiplied where the layers multiply (docs/design.md, "Quantized weights are a
weight type").

    operations           Praxis' numerics: scales, rounding, clipping, int4 packing, fake_quant
    quantization_config  how a weight and its activations are quantized (bits, symmetric, ...)
    quantized_weight     QuantizedWeight, quantize_weight, dequantize
    products             the matmul, lookup and conv of a QuantizedWeight (Praxis' INFERENCE)
"""

from pax_eqx.quantization.operations import fake_quant, pack_int4, quantize, unpack_int4
from pax_eqx.quantization.products import quantized_conv, quantized_lookup, quantized_matmul
from pax_eqx.quantization.quantization_config import ActivationQuantizationConfig, WeightQuantizationConfig
from pax_eqx.quantization.quantized_weight import QuantizedWeight, dequantize, quantize_weight

__all__ = [
    "ActivationQuantizationConfig",
    "QuantizedWeight",
    "WeightQuantizationConfig",
    "dequantize",
    "fake_quant",
    "pack_int4",
    "quantize",
    "quantize_weight",
    "quantized_conv",
    "quantized_lookup",
    "quantized_matmul",
    "unpack_int4",
]
