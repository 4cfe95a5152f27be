"""Which layers of a Hugging Face model attend through a sliding window -> pax_eqx's
`block.attention.window` and `model.global_layer_interval`.

    windows = layer_windows(["sliding_attention", "full_attention"] * 13, sliding_window=4096, max_len=8192)
    windows.window, windows.global_layer_interval     # SlidingWindowConfig(left_context=4096), 2

transformers 5 writes each layer's kind into config.json (`layer_types`: "sliding_attention" or
"full_attention"); the published checkpoints' config.json files leave it implicit, each family by
its own rule (`implicit_types`): Gemma 2 alternates from a sliding layer 0, Qwen2 slides the
layers from `max_window_layers` on when `use_sliding_window` is set, Mistral slides every layer.
A sliding layer's query sees the `sliding_window` keys ending at its own position (transformers'
mask keeps key s for query t when t - s < sliding_window), which is SlidingWindowConfig's
left_context exactly.

pax_eqx builds three patterns, so these are what import:

    every layer full                          window global
    every layer sliding                       window sliding, global_layer_interval 0
    full at layers n-1, 2n-1, ..., else slide window sliding, global_layer_interval n (Gemma 2: 2)

Any other list (a full layer 0, a block of full layers first) is not expressible: `layer_windows`
returns None and the family refuses the field the list came from. A window at least as long as
the context never excludes a key, so such a model is all-global whatever its list (one pattern
fewer to refuse, and the cheaper attention).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pax_eqx.layers.attention_window import AttentionWindowConfig, GlobalWindowConfig, SlidingWindowConfig

SLIDING, FULL = "sliding_attention", "full_attention"
KINDS = (SLIDING, FULL)


@dataclass(frozen=True)
class LayerWindows:
    """The window of the sliding layers (global: none slides) and which layers are global."""

    window: AttentionWindowConfig
    global_layer_interval: int  # 0: every layer uses `window`; n: layers n-1, 2n-1, ... are global


ALL_GLOBAL = LayerWindows(GlobalWindowConfig(), 0)


def layer_windows(types: Sequence[str], sliding_window: int | None, max_len: int) -> LayerWindows | None:
    """The pax_eqx form of `types` (one kind per layer, each one of KINDS), or None when pax_eqx
    has no such pattern. `sliding_window` None (no window) or >= max_len: all global."""
    full = [i for i, kind in enumerate(types) if kind == FULL]
    if sliding_window is None or sliding_window >= max_len or len(full) == len(types):
        return ALL_GLOBAL
    window = SlidingWindowConfig(left_context=int(sliding_window))
    if not full:
        return LayerWindows(window, 0)
    n = full[0] + 1  # the first global layer is n - 1
    if n < 2 or len(types) % n or full != list(range(n - 1, len(types), n)):
        return None
    return LayerWindows(window, n)


def describe(types: Sequence[str]) -> str:
    """The list in a line, for an error: which layers are full (the long lists repeat a kind)."""
    full = [i for i, kind in enumerate(types) if kind == FULL]
    return f"{len(types)} layers, full attention at {full or 'none'}, sliding at the others"


def implicit_types(family: str, num_layers: int, *, use_sliding: bool = True, max_window_layers: int = 0) -> list[str]:
    """The layer kinds an older config.json (no `layer_types`) means, as transformers 5 fills them
    in: gemma2 sliding at even layers; qwen2 sliding from max_window_layers on; mistral every
    layer. `use_sliding` False (no window): qwen2 and mistral have none sliding."""
    if family == "gemma2":
        return [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)]
    if family == "qwen2":
        return [SLIDING if use_sliding and i >= max_window_layers else FULL for i in range(num_layers)]
    return [SLIDING if use_sliding else FULL] * num_layers
