"""QuantizedWeight: a weight stored as integers and per-channel scales, put in a float weight's place.

Praxis' MATERIALIZE writes, for a weight `w`, the variables `w` (int8), `w_quantized_scale` and
`w_quantized_zp`; its INFERENCE layers read them. Here the three are one pytree, in the weight's
own field, so no layer class changes: `linears.dense` (Linear, the attention projections, the
softmax), the embedding lookup and Conv2D multiply by it where they multiply by a float weight
(`quantization.products`):

    values      int8, the weight's shape (bits = 4: two values a byte along `packed_axis`, the
                first contraction axis, halved there: Praxis' _PACK_4BIT_DIM of every layer)
    scale       float32, the weight's rank with size 1 on the contraction axes (per output channel)
    zero_point  float32 like scale, or None (symmetric); W ~ values * scale - zero_point

The contraction axes are counted from the end (-2 for a linear's [in, out]), so a scanned stack's
[layers, in, out] weight and the [in, out] slice its step sees read the same. The activation
config (None: float activations) travels with the weight as a static field: the product
quantizes its input then (int8 x int8, int32 accumulation).

Scales keep the weight's rank rather than Praxis' squeezed [out]: they broadcast against the
values as they are, and the two reshapes a layer does before its product (`w_q.reshape(embed,
heads * head_dim)`, the softmax's `.T`) apply to them unchanged. Any other use as an array (jnp
functions, indexing, a cast) raises a ConfigError naming the fix, so a layer that reads its
weight some other way can never compute with the integers as if they were the weight.
`param_axes` names each array's logical axes (from the float weight's), for the sharding rules.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int8

from pax_eqx.config import ConfigError
from pax_eqx.quantization.operations import pack_int4, quantize, unpack_int4
from pax_eqx.quantization.quantization_config import ActivationQuantizationConfig, WeightQuantizationConfig

AxisNames = tuple[str | None, ...]


class QuantizedWeight(eqx.Module):
    """A weight as integers and scales (module doc). Made by `quantize_weight`."""

    values: Int8[Array, "..."]
    scale: Float[Array, "..."]
    zero_point: Float[Array, "..."] | None
    bits: int = eqx.field(static=True)
    contract_axes: tuple[int, ...] = eqx.field(static=True)  # negative: counted from the end
    packed_axis: int | None = eqx.field(static=True)  # negative; None: one value a byte
    activations: ActivationQuantizationConfig | None = eqx.field(static=True, default=None)
    axes: AxisNames | None = eqx.field(static=True, default=None)  # the float weight's logical axes

    @property
    def shape(self) -> tuple[int, ...]:
        """The float weight's shape (the values' with the packed axis unpacked)."""
        shape = list(self.values.shape)
        if self.packed_axis is not None:
            shape[self.packed_axis] *= 2
        return tuple(shape)

    @property
    def ndim(self) -> int:
        return self.values.ndim

    @property
    def symmetric(self) -> bool:
        return self.zero_point is None

    def int_values(self) -> Int8[Array, "..."]:
        """The integers at the weight's shape (4-bit ones unpacked to int8)."""
        return self.values if self.packed_axis is None else unpack_int4(self.values, self.packed_axis)

    def dequantize(self) -> Float[Array, "..."]:
        """values * scale - zero_point, float32: the float weight the integers stand for."""
        w = self.int_values() * self.scale
        return w if self.zero_point is None else w - self.zero_point

    def param_axes(self) -> dict[str, AxisNames]:
        """The logical axes of each array (`sharding.logical`): the values take the float
        weight's, the scales and zero points the same with None on the contraction axes (size 1)."""
        if self.axes is None:
            raise ValueError(
                "a QuantizedWeight made without `axes` has no logical axis names: pass the float weight's "
                "(its layer's param_axes()) to quantize_weight(..., axes=...)."
            )
        contract = {a % len(self.axes) for a in self.contract_axes}
        per_channel = tuple(None if i in contract else name for i, name in enumerate(self.axes))
        return {"values": self.axes, "scale": per_channel, "zero_point": per_channel}

    # The two views a layer takes of its weight before the product. -----------------------------
    def reshape(self, *shape: int | Sequence[int]) -> QuantizedWeight:
        """The weight reshaped with its input side and its output side kept apart (the only
        reshape a projection does: [embed, heads, head_dim] -> [embed, heads * head_dim], [heads,
        head_dim, embed] -> [heads * head_dim, embed]). The contraction axes must lead; the new
        shape's leading dims whose product is the input side's become its contraction axes."""
        new = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
        old, k_old = self.shape, len(self.contract_axes)
        if self.contract_axes != tuple(range(-len(old), -len(old) + k_old)):
            self._refuse(f"a reshape to {new} with the contraction axes {self.contract_axes} not leading")
        fan_in, fan_out = math.prod(old[:k_old]), math.prod(old[k_old:])
        k = next(
            (i for i in range(len(new) + 1) if math.prod(new[:i]) == fan_in and math.prod(new[i:]) == fan_out), None
        )
        if k is None:
            self._refuse(f"a reshape to {new}, which mixes its input side {old[:k_old]} with its output side")
        values, packed = self.values, self.packed_axis
        if packed is not None and new[:k] != old[:k_old]:
            values, packed = self.int_values(), None  # the pairs would straddle the new axes
        if packed is not None:
            packed = packed % len(old) - len(new)  # the input side is unchanged: same position from the start
            values = values.reshape(tuple(n // 2 if i == packed % len(new) else n for i, n in enumerate(new)))
        else:
            values = values.reshape(new)
        per_channel = (1,) * k + new[k:]
        return QuantizedWeight(
            values,
            self.scale.reshape(per_channel),
            None if self.zero_point is None else self.zero_point.reshape(per_channel),
            self.bits,
            tuple(range(-len(new), -len(new) + k)),
            packed,
            self.activations,
            None,
        )

    @property
    def T(self) -> QuantizedWeight:  # noqa: N802 (numpy's name)
        """A matrix's transpose (the tied softmax's [vocab, embed] table as [embed, vocab]); the
        scales go with their channels."""
        if self.ndim != 2:
            self._refuse(f"a transpose of a weight of shape {self.shape} (only a matrix's)")
        swap = {-1: -2, -2: -1}
        return QuantizedWeight(
            self.values.T,
            self.scale.T,
            None if self.zero_point is None else self.zero_point.T,
            self.bits,
            tuple(sorted(swap[a] for a in self.contract_axes)),
            None if self.packed_axis is None else swap[self.packed_axis],
            self.activations,
            None if self.axes is None else self.axes[::-1],
        )

    # Every other use of a weight is refused: the layer would compute with the integers. --------
    def _refuse(self, use: str) -> None:
        raise ConfigError(
            f"a {self.bits}-bit quantized weight of shape {self.shape} reaches {use}; a quantized weight is "
            "multiplied where a layer multiplies through linears.dense (Linear, the attention projections, the "
            "softmax), looks up embeddings, or convolves (Conv2D). Leave this weight in float (drop its layer from "
            "the quantized ones), or call .dequantize() where a float array is meant."
        )

    def __jax_array__(self):
        self._refuse("a function that converts it to an array")

    def __array__(self, *args, **kwargs):
        self._refuse("numpy, which converts it to an array")

    def __getitem__(self, index):
        """w[i] for an int i on a leading axis the product does not sum over (the combined
        projection's [3, embed, heads, head_dim] taken apart into q, k, v): that axis's slice of
        the values and of the scales, which are per channel along it. Any other index is refused."""
        lead = -self.ndim
        if not isinstance(index, int) or lead in self.contract_axes or lead == self.packed_axis or self.ndim < 3:
            self._refuse(f"indexing ([{index}])")
        pick = lambda a: None if a is None else a[index]
        return QuantizedWeight(
            self.values[index],
            self.scale[index],
            pick(self.zero_point),
            self.bits,
            self.contract_axes,
            self.packed_axis,
            self.activations,
            None if self.axes is None else self.axes[1:],
        )

    def astype(self, dtype):
        self._refuse(f"a cast to {dtype}")


def quantize_weight(
    w: Float[Array | np.ndarray, "..."],
    contract_axes: Sequence[int],
    spec: WeightQuantizationConfig = WeightQuantizationConfig(),
    *,
    activations: ActivationQuantizationConfig | None = None,
    axes: AxisNames | None = None,
) -> QuantizedWeight:
    """`w` quantized over `contract_axes` (its input side: (0,) for a linear's [in, out], (0, 1, 2)
    for a conv's HWIO) with one scale per output channel, as Praxis' quantize_weight (PTQ)
    computes it, in float32. spec: bits, symmetric, clipping. activations: quantize the
    product's input too (None: float activations). axes: the float weight's logical axis names,
    for the sharding rules. 4-bit values are packed along the first contraction axis."""
    w = jnp.asarray(w)
    ndim = w.ndim
    if not contract_axes or any(not -ndim <= a < ndim for a in contract_axes):
        raise ConfigError(
            f"quantize_weight: contract_axes={tuple(contract_axes)} are not axes of a weight of shape {w.shape}; "
            "name its input side (the axes its product sums over), e.g. (0,) for a [in, out] matrix."
        )
    contract = tuple(sorted({a % ndim - ndim for a in contract_axes}))
    if len(contract) == ndim:
        raise ConfigError(
            f"quantize_weight: contract_axes={tuple(contract_axes)} cover every axis of the weight of shape "
            f"{w.shape}; leave the output axes out, each of their channels gets its own scale."
        )
    if axes is not None and len(axes) != ndim:
        raise ConfigError(f"quantize_weight: axes={axes} name {len(axes)} axes of a weight of shape {w.shape}.")
    q, scale, zero_point = quantize(w, spec.bits, contract, spec.symmetric, spec.clipping)
    packed = contract[0] if spec.bits == 4 else None
    if packed is not None:
        q = pack_int4(q, packed)
    return QuantizedWeight(q, scale, zero_point, spec.bits, contract, packed, activations, axes)


def dequantize(w: QuantizedWeight) -> Float[Array, "..."]:
    """The float32 weight a QuantizedWeight stands for (values * scale - zero_point)."""
    return w.dequantize()
