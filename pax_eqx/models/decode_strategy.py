"""DecodeStrategy: how a model that decodes chooses its continuation, a choice of configs
(`--decode.strategy sample | greedy | beam`).

Each strategy is one config class in one file of `pax_eqx/models/decode_strategies/`, holding
only the fields it reads and registered by its own definition (`config.OpenChoice`), so a new
strategy is one file. The class answers what the programs ask of a strategy -- the best output
of every row, an n-best list or samples of a prompt, how its outputs are labelled -- so no code
outside a strategy asks which strategy it is.

The defaults here are those of a strategy that draws one token a step (`Draw`): sampling and
greedy decoding share them; a search (beam) overrides them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import jax
import numpy as np
from jaxtyping import PRNGKeyArray

from pax_eqx.config import ConfigError, OpenChoice, config
from pax_eqx.models.incremental import IncrementalDecoder
from pax_eqx.models.sampler import Draw, cut_at_eos, draw_tokens

if TYPE_CHECKING:
    from pax_eqx.models.beam_search import BeamResult

# The length penalty greedy and sampled outputs are scored with beside a beam's (GNMT's).
DEFAULT_LENGTH_NORM_ALPHA = 0.8
DEFAULT_LENGTH_PENALTY_BASE = 6.0


@config
class DecodeStrategy(OpenChoice):
    """The contract every strategy answers. `title`: how a run announces it ("Sampling").
    `slides_window`: whether a language model's continuation may run past its max_seq_len by
    sliding a window (decoding.generate): a token drawn at a time can, a search cannot."""

    title: ClassVar[str] = ""
    slides_window: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """The strategy's own fields (ConfigError naming the field, the value and the fix)."""

    def draw(self, eos_id: int) -> Draw:
        """How one token is chosen from the logits, for a strategy that draws a token a step."""
        raise ConfigError(
            f"decode.strategy={self.kind!r} does not draw one token a step; use its own search, or "
            "--decode.strategy sample / greedy."
        )

    def describe(self) -> str:
        """The settings, as an output's heading shows them ("temperature 0.8, top_k 40, top_p 1.0")."""
        return self.kind

    def key(self) -> PRNGKeyArray:
        """The random key decoding starts from (a sampling strategy's seed; unused by the others)."""
        return jax.random.PRNGKey(0)

    # What the programs ask ------------------------------------------------------------------
    def best(self, decoder: IncrementalDecoder, cfg: Any, key: PRNGKeyArray, pad_id: int) -> np.ndarray:
        """Each row's output tokens [B, new] (pad_id after its EOS; `cfg` a SampleConfig: the
        length and EOS): what decoded metrics score."""
        return np.asarray(draw_tokens(decoder, self.draw(cfg.eos_id), key, pad_id, cfg.max_new_tokens)[0])

    def first_pass(self) -> DecodeStrategy:
        """The strategy of a sequence-to-sequence decode's first line (a search shows greedy
        decoding's beside its own lines)."""
        return self

    def beams(self, decoder: IncrementalDecoder, cfg: Any, pad_id: int) -> BeamResult | None:
        """The n-best hypotheses of every row, for a strategy that searches; None otherwise."""
        return None

    def length_norm(self) -> tuple[float, float]:
        """(alpha, base) of the length penalty outputs are scored with, log-prob / ((5 + length) /
        base) ** alpha: a beam's own, else GNMT's defaults, so scores compare with a beam's."""
        return DEFAULT_LENGTH_NORM_ALPHA, DEFAULT_LENGTH_PENALTY_BASE

    def prompt_outputs(
        self, model: Any, prompt: list[int], cfg: Any, num_samples: int, key: PRNGKeyArray, pad_id: int, bos_id: int
    ) -> list[tuple[list[int], float | None]]:
        """What decoding one prompt prints: (continuation ids, score or None), in order."""
        outs = model.continue_prompts([prompt] * num_samples, cfg, key, pad_id)
        return [(ids, None) for ids in outs]

    def heading(self, count: int) -> str | None:
        """A line above a prompt's `count` outputs, or None."""
        return None

    def label(self, index: int, score: float | None) -> str:
        """The line above output `index` of a prompt."""
        return f"sample {index} ({self.describe()})"

    @property
    def prints_one_list(self) -> bool:
        """Whether a prompt gives one list of outputs whatever decode.num_samples (a beam's n-best)."""
        return False

    def memory_hint(self) -> str | None:
        """A flag that would make decoding need less memory, for an out-of-memory message."""
        return None


def cut_rows(tokens: np.ndarray, eos_id: int) -> list[list[int]]:
    """Rows of token ids [B, new] as lists cut before EOS."""
    return cut_at_eos(np.asarray(tokens).tolist(), eos_id)
