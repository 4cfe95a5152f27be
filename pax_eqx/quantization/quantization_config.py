"""How a weight, and the activations multiplied by it, are quantized: Praxis' WeightQuantizationParams
and ActQuantizationParams (praxis/layers/quantization/quantization_hparams.py), the fields the
numerics read and nothing else.

    WeightQuantizationConfig(bits=8, symmetric=True, clipping=1.0)
    ActivationQuantizationConfig(bits=8, per_token=True)

Both are frozen (hashable), so a QuantizedWeight keeps its activation config as a static field:
what a weight's product does with its input is a property of the weight, and `linears.dense`
needs no other argument. The training choice (none | fake_quant | aqt) and the PTQ program are
meant to hold these two, adding which layers, not how a tensor is quantized.

Left out of Praxis' fields, each for a reason: `dtype`/`use_int4_packed_weights`/
`int4_packed_weights_container_dtype` (values are int8, and 4-bit values are always packed two a
byte); `unsigned_int_bounds` (Praxis' quantized layers never set it); `add_scale_eps` (Praxis' PTQ
and fake quantization use its False branch: a zero scale becomes 1; AQT's quantizer, which adds
eps, is later work); the clipping search, sub-channels and block size, variational noise and the
quantization losses (options Praxis' defaults leave off).
"""

from __future__ import annotations

from pax_eqx.config import Config, ConfigError, check_range, config

MIN_BITS = 2
MAX_BITS = 8  # the values are int8


def check_bits(where: str, bits: object) -> None:
    """ConfigError unless `bits` is an int in [2, 8] (a 1-bit grid is Praxis' binarization, another
    method; more than 8 bits would not fit the int8 values)."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not MIN_BITS <= bits <= MAX_BITS:
        raise ConfigError(
            f"{where}={bits!r} is not a number of bits this quantization stores: use an int from {MIN_BITS} to "
            f"{MAX_BITS} (8 for int8, 4 for int4 packed two a byte)."
        )


@config
class WeightQuantizationConfig(Config):
    """A weight's integer grid (Praxis' WeightQuantizationParams).

    bits: the values lie in [-2^(bits-1), 2^(bits-1) - 1]; 4 packs two values a byte.
    symmetric: scale = max|w| / (2^(bits-1) - 1) per output channel, zero at 0 (Praxis' default);
      False: scale = (max w - min w) / (2^bits - 1) and a zero point per channel (Praxis'
      use_symmetric=False), which spends no level on a side a channel does not reach.
    clipping: the channel's bound is multiplied by this before the scale (Praxis' clipping_coeff);
      values beyond it saturate. 1 = the hard max.
    """

    bits: int = 8
    symmetric: bool = True
    clipping: float = 1.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        check_bits("WeightQuantizationConfig.bits", self.bits)
        check_range(self, "clipping", gt=0, le=1, note="1 = the channel's hard max")


@config
class ActivationQuantizationConfig(Config):
    """The activations a quantized weight multiplies, quantized on the fly (Praxis' ActQuantizationParams):
    then the product is an int8 x int8 matmul accumulating in int32, scaled after.

    bits: as the weight's.
    per_token: one scale per row of the activations (per token, over the features the matmul sums:
      Praxis' `per_channel=True`, its default); False: one scale for the whole tensor.

    Symmetric only: Praxis' integer product has no activation zero point (its asymmetric path
    dequantizes both sides into a float matmul "for testing purposes").
    """

    bits: int = 8
    per_token: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        check_bits("ActivationQuantizationConfig.bits", self.bits)
