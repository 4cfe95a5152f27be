"""Writes expected.npz here: Praxis 1.4's `beam_search.beam_search` on a fixed bigram "model".

The model is a [V, V] table of logits: the next token's logits are `table[last token]`, whatever
came before (no decode state), which pax_eqx can drive identically through its
IncrementalDecoder protocol. Praxis' beam search runs on it through its own callback API
(`extend_step_fn(model, extend_ids, segment_pos)`, with `fprop_fn` and `transform_state_fn`
that have no state to fill or shuffle), with BeamSearchHParams(beam_size, max_decode_steps,
eos_id, length_norm_alpha) and the defaults otherwise (tokens_per_beam = beam_size,
early_exit=False, min_decode_steps=0). Recorded per case: the prefixes, the n-best output ids
(prefix + new tokens + EOS, zero after), their lengths (prefix included), their length-normalised
scores and per-step log-probs.

Cases: beam 3 and 4, alpha 0.8 and 0.0, over the same table (EOS=1 never among the first
step's top tokens, so every returned hypothesis is a real one, not one of Praxis' -1e9
placeholders or penalised EOS continuations).

Runs only in Praxis' Python 3.10 environment (see tests/fixtures/paxml/generate_fixtures.py):

    cd /tmp && JAX_PLATFORMS=cpu /tmp/paxenv/bin/python /path/to/tests/praxis/beam_search/generate.py
"""

from __future__ import annotations

import functools
import os
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from praxis import base_layer, beam_search, decoder_hparams, pax_fiddle  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
V, EOS = 10, 1
PREFIXES = np.asarray([[3, 2], [5, 4], [0, 6], [7, 9]], np.int32)
MAX_DECODE_STEPS = 6
# name: (beam_size, length_norm_alpha)
CASES = {"beam3_alpha08": (3, 0.8), "beam4_alpha08": (4, 0.8), "beam3_alpha0": (3, 0.0)}


class TableLm(base_layer.BaseLayer):
    """Next-token logits `table[last token]`; nothing cached."""

    table: Any = None

    def decode(self, prefix_ids, prefix_paddings, hparams):
        table = jnp.asarray(self.table, jnp.float32)

        def extend_step_fn(model, extend_ids, segment_pos):
            del model, segment_pos
            return jnp.take(table, extend_ids, axis=0)

        def fprop_fn(model, prefix_ids, prefix_paddings):
            del model, prefix_ids, prefix_paddings

        def transform_state_fn(model, fn):
            del model, fn

        return beam_search.beam_search(
            self, extend_step_fn, fprop_fn, transform_state_fn, prefix_ids, prefix_paddings, hparams
        )


def make_table(rng) -> np.ndarray:
    """Random logits, spread enough that beams differ; EOS's logit is moderate (hypotheses end at
    various lengths) but never among a first step's top tokens."""
    table = (rng.standard_normal((V, V)) * 1.5).astype(np.float32)
    table[:, EOS] = rng.uniform(-1.0, 1.5, V).astype(np.float32)
    # EOS is the likeliest token after 5 and after EOS itself: Praxis' two-stage top-k must keep
    # "... 5 EOS" out of the alive beam (else "... 5 EOS EOS" would finish, and well).
    table[[5, EOS], EOS] = 3.0
    for last in PREFIXES[:, -1]:
        row = table[last]
        row[EOS] = min(row[EOS], np.sort(np.delete(row, EOS))[-5] - 0.1)
    return table


def main() -> None:
    rng = np.random.default_rng(0)
    table = make_table(rng)
    out = {"table": table, "prefixes": PREFIXES, "eos_id": np.int32(EOS)}
    out["max_decode_steps"] = np.int32(MAX_DECODE_STEPS)
    layer = base_layer.instantiate(pax_fiddle.Config(TableLm, name="lm", table=table.tolist()))
    for name, (beam_size, alpha) in CASES.items():
        hparams = decoder_hparams.BeamSearchHParams(
            beam_size=beam_size, max_decode_steps=MAX_DECODE_STEPS, eos_id=EOS, length_norm_alpha=alpha
        )
        paddings = jnp.zeros(PREFIXES.shape, jnp.float32)
        with base_layer.JaxContext.new_context(hparams=base_layer.JaxContext.HParams(do_eval=True)):
            result, _ = layer.apply(
                {}, jnp.asarray(PREFIXES), paddings, hparams,
                method=functools.partial(TableLm.decode), mutable=[base_layer.DECODE_CACHE],
            )  # fmt: skip
        scores = np.asarray(result.scores)
        assert (scores > -1e8).all(), f"{name}: a returned hypothesis is a placeholder: {scores}"
        out[f"{name}/beam_size"] = np.int32(beam_size)
        out[f"{name}/alpha"] = np.float32(alpha)
        out[f"{name}/output_ids"] = np.asarray(result.output_ids)
        out[f"{name}/decode_lengths"] = np.asarray(result.decode_lengths)
        out[f"{name}/scores"] = scores
        out[f"{name}/logprobs"] = np.asarray(result.logprobs)
        print(name, np.asarray(result.output_ids)[0], np.asarray(result.decode_lengths)[0], scores[0])
    np.savez(os.path.join(HERE, "expected.npz"), **out)


if __name__ == "__main__":
    jax.config.update("jax_default_matmul_precision", "float32")
    main()
