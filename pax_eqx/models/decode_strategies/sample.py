"""`--decode.strategy sample`: draw each token from the model's distribution, sharpened by a
temperature and cut to the top-k / nucleus (Praxis' sample_decode)."""

from __future__ import annotations

from typing import ClassVar

from pax_eqx.config import SEED_MAX, check_range, config
from pax_eqx.models.decode_strategy import DecodeStrategy
from pax_eqx.models.sampler import Draw


@config
class SampleStrategy(DecodeStrategy):
    """temperature: divides the logits before sampling (0 = greedy, the argmax). top_k: sample
    among the k most likely tokens (0 = off). top_p: nucleus sampling, among the fewest tokens
    holding this probability (1.0 = off). seed: the sampling seed."""

    kind: ClassVar[str] = "sample"
    title: ClassVar[str] = "Sampling"

    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        check_range(self, "temperature", ge=0, prefix="decode", note="0 = greedy")
        check_range(self, "top_p", gt=0, le=1, prefix="decode", note="1 = off")
        check_range(self, "top_k", ge=0, prefix="decode", note="0 = off")
        check_range(self, "seed", ge=0, le=SEED_MAX, prefix="decode")

    def inert_fields(self) -> dict[str, str]:
        if self.temperature == 0:
            why = "decode.temperature=0 decodes greedily (argmax), which does not sample"
            return {"top_k": why, "top_p": why, "seed": why}
        return {}

    def draw(self, eos_id: int) -> Draw:
        return Draw.of(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, eos_id=eos_id)

    def key(self):
        import jax

        return jax.random.PRNGKey(self.seed)

    def describe(self) -> str:
        return f"temperature {self.temperature}, top_k {self.top_k}, top_p {self.top_p}"
