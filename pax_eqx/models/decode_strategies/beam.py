"""`--decode.strategy beam --decode.beam-size 4`: beam search, an n-best list ranked by the
model's length-normalised log-probs (models/beam_search.py; Praxis' beam_search with
beam_style praxis)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np

from pax_eqx.config import ConfigError, check_range, config
from pax_eqx.models.beam_search import BEAM_STYLES, BeamResult, beam_search, length_penalty_base, nbest_lists
from pax_eqx.models.decode_strategies.greedy import GreedyStrategy
from pax_eqx.models.decode_strategy import DecodeStrategy


@config
class BeamStrategy(DecodeStrategy):
    """beam_size: the hypotheses kept (and listed). length_norm_alpha: hypotheses are ranked by
    log-prob / ((5 + length) / 6) ** alpha (GNMT's length penalty, Pax's
    BeamSearchHParams.length_norm_alpha); 0 = raw log-prob, larger favours longer hypotheses.
    beam_style: "pax_eqx" (this search) or "praxis" (Praxis' beam_search: every hypothesis's EOS
    continuation offered each step, the penalty's base 5, only ended hypotheses returned)."""

    kind: ClassVar[str] = "beam"
    title: ClassVar[str] = "Beam search"
    slides_window: ClassVar[bool] = False  # the hypotheses' caches would have to be re-prefilled

    beam_size: int = 4
    length_norm_alpha: float = 0.8
    beam_style: Literal["pax_eqx", "praxis"] = "pax_eqx"

    def validate(self) -> None:
        check_range(self, "beam_size", ge=1, prefix="decode", fix="Pass e.g. --decode.beam-size 4.")
        check_range(
            self, "length_norm_alpha", ge=0, prefix="decode", note="0 = rank by raw log-prob",
            fix="Pass e.g. --decode.length-norm-alpha 0.8.",
        )  # fmt: skip
        if self.beam_style not in BEAM_STYLES:
            raise ConfigError(f"decode.beam_style={self.beam_style!r} is not one of {BEAM_STYLES}.")

    def describe(self) -> str:
        return f"beam_size {self.beam_size}"

    def beams(self, decoder: Any, cfg: Any, pad_id: int) -> BeamResult:
        return beam_search(
            decoder, beam_size=self.beam_size, max_new_tokens=cfg.max_new_tokens, eos_id=cfg.eos_id, pad_id=pad_id,
            length_norm_alpha=self.length_norm_alpha, style=self.beam_style,
        )  # fmt: skip

    def best(self, decoder: Any, cfg: Any, key: Any, pad_id: int) -> np.ndarray:
        return np.asarray(self.beams(decoder, cfg, pad_id).tokens[:, 0])

    def first_pass(self) -> DecodeStrategy:
        return GreedyStrategy()

    def length_norm(self) -> tuple[float, float]:
        return self.length_norm_alpha, length_penalty_base(self.beam_style)

    def prompt_outputs(self, model, prompt, cfg, num_samples, key, pad_id, bos_id):
        decoder = model.incremental_decoder([prompt], cfg.max_new_tokens, pad_id, bos_id)
        return nbest_lists(self.beams(decoder, cfg, pad_id), cfg.eos_id)[0]

    def heading(self, count: int) -> str:
        alpha, base = self.length_norm()
        score = f"log-prob / ((5 + length) / {base:g}) ** {alpha}"
        return f"beam search: {count} best of beam_size {self.beam_size} (score: {score})"

    def label(self, index: int, score: float | None) -> str:
        return f"{index + 1} (score {score:.4f})"

    @property
    def prints_one_list(self) -> bool:
        return True

    def memory_hint(self) -> str:
        return f"a smaller --decode.beam-size (now {self.beam_size})"
