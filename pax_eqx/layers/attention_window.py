"""Which keys a query may see by distance: global, or a sliding window (local attention).

A choice of configs (`--model.block.attention.window sliding --model.block.attention.window.left-context 8`):

  global   every key the other masks allow (causal, segments, padding): the default.
  sliding  Praxis' LocalSelfAttention window: query t sees keys s with
           t - (left_context - 1) <= s <= t + right_context, so `left_context` counts the query's
           own position (Praxis' meaning, and Hugging Face's `sliding_window`: Mistral's 4096 is
           left_context=4096). right_context is the keys after the query a bidirectional layer
           sees; a causal layer sees none after it, so it must be 0 there.

The window is one more term of the attention mask (`attention_kernels.make_mask`), so it composes
with every other mask and position bias. Distances are token indices, as the causal mask's are:
within a document, packed or left-padded, they are the positions' distances.
"""

from __future__ import annotations

from typing import ClassVar

from pax_eqx.config import ConfigError, Variant, check_range, config


@config
class GlobalWindowConfig(Variant):
    """No window: every key the other masks allow."""

    kind: ClassVar[str] = "global"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Nothing to check: no fields."""

    def bounds(self) -> tuple[int, int]:
        """(left, right): 0 = unbounded on that side."""
        return 0, 0

    def check_direction(self, causal: bool) -> None:
        """Nothing to check: a global window suits either direction."""


@config
class SlidingWindowConfig(Variant):
    """A sliding window of keys around each query (Praxis' LocalSelfAttention).

    left_context: keys at or before the query it sees, its own position included (>= 1).
    right_context: keys after the query it sees (a bidirectional layer only; 0 when causal).
    """

    kind: ClassVar[str] = "sliding"
    left_context: int = 128
    right_context: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        check_range(self, "left_context", ge=1, prefix="window sliding", note="it counts the query's own position")
        check_range(self, "right_context", ge=0, prefix="window sliding")

    def bounds(self) -> tuple[int, int]:
        """(left, right): the keys seen before and including the query, and after it."""
        return self.left_context, self.right_context

    def check_direction(self, causal: bool) -> None:
        """A causal layer sees no key after its query, so right_context > 0 would do nothing."""
        if causal and self.right_context:
            raise ConfigError(
                f"window sliding: right_context={self.right_context} with a causal attention, which sees no key after "
                "its query; set right_context=0, or causal=False for a bidirectional window."
            )


AttentionWindowConfig = GlobalWindowConfig | SlidingWindowConfig
"""The choice of an attention window (`--model.block.attention.window sliding`)."""
