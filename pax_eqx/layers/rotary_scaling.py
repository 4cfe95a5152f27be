"""Rotary frequency scaling: how a model trained at one context length stretches its rotary
position embedding to a longer one. A choice of configs (`--model.block.attention.rotary-scaling
llama3`), each holding only what it reads:

  none     the frequencies 1 / max_timescale^(2i/d) as they are (Praxis', and Llama 2's).
  llama3   Llama 3.1's: frequencies whose wavelength 2 pi / f is longer than
           original_max_position / low_freq_factor are divided by `factor`, those shorter than
           original_max_position / high_freq_factor are kept, and those between are interpolated
           with s = (original_max_position / wavelength - low_freq_factor) /
           (high_freq_factor - low_freq_factor):  f' = (1 - s) f / factor + s f.
           (Meta's reference `apply_scaling`, and transformers' `_compute_llama3_parameters`.)

Only the frequencies change; the rotation itself is `position_embeddings.apply_rotary`'s.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from pax_eqx.config import ConfigError, Variant, check_range, config


def base_inverse_timescales(head_dim: int, max_timescale: float) -> np.ndarray:
    """[head_dim / 2] float32: 1 / max_timescale^(2i / head_dim), the unscaled frequencies."""
    fraction = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    return (1.0 / np.power(np.float32(max_timescale), fraction)).astype(np.float32)


@config
class NoRotaryScalingConfig(Variant):
    """The rotary frequencies as they are."""

    kind: ClassVar[str] = "none"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Nothing to check: no fields."""

    def describe(self) -> str:
        return "none"

    def inverse_timescales(self, head_dim: int, max_timescale: float) -> np.ndarray | None:
        """None: `apply_rotary`'s own timescales (the default path, unchanged)."""
        return None


@config
class Llama3RotaryScalingConfig(Variant):
    """Llama 3.1's rotary scaling (module doc); the defaults are Llama 3.1's published values.

    factor: how much the lowest frequencies are slowed down.
    low_freq_factor / high_freq_factor: the wavelength band, as divisors of original_max_position,
      between which the frequencies are interpolated.
    original_max_position: the context length the model was first trained at.
    """

    kind: ClassVar[str] = "llama3"
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        where = "rotary_scaling llama3"
        check_range(self, ("factor", "low_freq_factor", "high_freq_factor"), gt=0, prefix=where)
        check_range(self, "original_max_position", gt=0, prefix=where)
        if self.high_freq_factor <= self.low_freq_factor:
            raise ConfigError(
                f"{where}: high_freq_factor={self.high_freq_factor} must be above low_freq_factor="
                f"{self.low_freq_factor} (the band between them is interpolated); Llama 3.1 uses 4 and 1."
            )

    def describe(self) -> str:
        """ "llama3 (factor=8.0, low_freq_factor=1.0, ...)": every field, for the refusals."""
        return (
            f"llama3 (factor={self.factor}, low_freq_factor={self.low_freq_factor}, high_freq_factor="
            f"{self.high_freq_factor}, original_max_position={self.original_max_position})"
        )

    def inverse_timescales(self, head_dim: int, max_timescale: float) -> np.ndarray:
        """[head_dim / 2] float32, computed in float32 as transformers does."""
        f32 = np.float32
        inv = base_inverse_timescales(head_dim, max_timescale)
        old = f32(self.original_max_position)
        low_wavelen, high_wavelen = old / f32(self.low_freq_factor), old / f32(self.high_freq_factor)
        wavelen = f32(2 * math.pi) / inv
        scaled = np.where(wavelen > low_wavelen, inv / f32(self.factor), inv)
        smooth = (old / wavelen - f32(self.low_freq_factor)) / (f32(self.high_freq_factor) - f32(self.low_freq_factor))
        smoothed = (1 - smooth) * scaled / f32(self.factor) + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)

    def check_effect(self, head_dim: int, max_timescale: float) -> None:
        """ConfigError when no frequency of this head dim changes (every wavelength shorter than
        original_max_position / high_freq_factor): the scaling would do nothing."""
        if np.array_equal(
            self.inverse_timescales(head_dim, max_timescale), base_inverse_timescales(head_dim, max_timescale)
        ):
            longest = 2 * math.pi / float(base_inverse_timescales(head_dim, max_timescale)[-1])
            raise ConfigError(
                f"rotary_scaling {self.describe()} changes no rotary frequency of a head dim of {head_dim} "
                f"with rotary_max_timescale={max_timescale} (the longest wavelength, {longest:.0f}, is under "
                f"original_max_position / high_freq_factor): it has no effect; use rotary_scaling none."
            )


RotaryScalingConfig = NoRotaryScalingConfig | Llama3RotaryScalingConfig
"""The choice of a rotary frequency scaling (`--model.block.attention.rotary-scaling llama3`)."""
