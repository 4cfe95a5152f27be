"""`--decode.strategy greedy`: the most likely token every step (the argmax; what a beam of one
finds)."""

from __future__ import annotations

from typing import ClassVar

from pax_eqx.config import config
from pax_eqx.models.decode_strategy import DecodeStrategy
from pax_eqx.models.sampler import Draw


@config
class GreedyStrategy(DecodeStrategy):
    """The argmax every step; nothing to set."""

    kind: ClassVar[str] = "greedy"
    title: ClassVar[str] = "Greedy decoding"

    def draw(self, eos_id: int) -> Draw:
        return Draw.of(temperature=0.0, top_k=0, top_p=1.0, eos_id=eos_id)

    def describe(self) -> str:
        return "greedy"

    def label(self, index: int, score: float | None) -> str:
        return f"greedy {index}"
