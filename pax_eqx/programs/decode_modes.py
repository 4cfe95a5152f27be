"""Which decode.* fields a decoding mode reads, and the checks that refuse the others.

Sampling (decode.beam_size 1) reads temperature, top_k, top_p, seed and num_samples; beam search
(> 1) reads length_norm_alpha. A sequence-to-sequence model decoding eval examples (no prompt)
reads num_samples in both modes: it is how many examples are decoded.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from pax_eqx.config import ConfigError


def given_decode_fields(argv: list[str]) -> set[str]:
    """The decode.* fields named on the (expanded) command line: `--decode.top-k 40` -> top_k."""
    return {arg[len("--decode.") :].partition("=")[0].replace("-", "_") for arg in argv if arg.startswith("--decode.")}


# The decode.* fields only one mode reads: sampling (beam_size 1) or beam search (> 1).
SAMPLING_ONLY = ("temperature", "top_k", "top_p", "seed", "num_samples")
BEAM_ONLY = ("length_norm_alpha", "beam_style")


def unused_fields(decode_cfg: Any, examples: bool = False) -> tuple[str, ...]:
    """The decode fields decode_cfg's mode does not read. examples: a sequence-to-sequence model
    decodes `num_samples` eval examples (its prompt is empty), in either mode."""
    if decode_cfg.beam_size == 1:
        return BEAM_ONLY
    return tuple(name for name in SAMPLING_ONLY if not (examples and name == "num_samples"))


def for_mode(decode_cfg: Any, examples: bool = False) -> Any:
    """decode_cfg with the fields its mode does not read put back at their defaults.

    An experiment's decode settings are for its default mode (shakespeare_char samples with
    top_k=40); they must not stop `--decode.beam-size 4`. What the user passes on the command
    line is checked by `check_decode(given=...)` instead: a flag the mode ignores is refused.
    """
    defaults = type(decode_cfg)()
    return decode_cfg.replace(**{name: getattr(defaults, name) for name in unused_fields(decode_cfg, examples)})


def check_decode(decode_cfg: Any, given: Collection[str] = (), examples: bool = False) -> None:
    """ConfigError for bad decode settings (SampleConfig.validate, in the mode's terms) and for
    any field in `given` (the decode.* flags the user passed) that the mode does not read:
    e.g. --top-k or --num-samples with a beam, --length-norm-alpha without one."""
    mode = f"decode.beam_size={decode_cfg.beam_size}"
    for name in unused_fields(decode_cfg, examples):
        if name in given:
            flag = "--decode." + name.replace("_", "-")
            what = "beam search prints one n-best list ranked by the model's log-probs; it does not sample"
            if decode_cfg.beam_size == 1:
                what = "sampling ranks nothing; pass --decode.beam-size > 1 for beam search"
            raise ConfigError(f"decode.{name} ({flag}) has no effect with {mode}: {what}. Drop {flag}.")
    for_mode(decode_cfg, examples).validate()
