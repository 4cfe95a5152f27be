"""Beam search against Praxis 1.4 itself (`praxis.beam_search.beam_search`).

beam_search/expected.npz is written by beam_search/generate.py in Praxis' own environment: its
beam search through its extend_step callback API on a fixed bigram "model" (next-token logits
`table[last token]`), beam 3 and 4, length_norm_alpha 0.8 and 0: the n-best output ids,
lengths, length-normalised scores and per-step log-probs. pax_eqx drives the same table through
its IncrementalDecoder protocol; with `style="praxis"` (Praxis' EOS handling, two-stage top-k
and ((5 + length) / 5) ** alpha penalty) it returns Praxis' n-best ids exactly and its scores.
Its default search differs on purpose (see pax_eqx/models/beam_search.py), and does here.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_eqx.config import ConfigError
from pax_eqx.models.beam_search import beam_search
from pax_eqx.models.incremental import IncrementalDecoder

EXPECTED = np.load(Path(__file__).resolve().parent / "beam_search" / "expected.npz")
CASES = ("beam3_alpha08", "beam4_alpha08", "beam3_alpha0")


class TableDecoder(IncrementalDecoder):
    """Next-token logits `table[last token]`; the carry is the last token."""

    table: jax.Array  # [vocab, vocab] logits
    prompt_last: jax.Array  # [rows]

    def start(self):
        return self.table[self.prompt_last], self.prompt_last

    def extend(self, tokens, carry, t):
        return self.table[tokens], tokens

    def select(self, carry, rows):
        return carry[rows]


def _run(case: str, style: str):
    e = EXPECTED
    decoder = TableDecoder(jnp.asarray(e["table"]), jnp.asarray(e["prefixes"][:, -1]))
    return beam_search(
        decoder, beam_size=int(e[f"{case}/beam_size"]), max_new_tokens=int(e["max_decode_steps"]),
        eos_id=int(e["eos_id"]), pad_id=0, length_norm_alpha=float(e[f"{case}/alpha"]), style=style,
    )  # fmt: skip


def _praxis_nbest(case: str):
    """Praxis' hypotheses as (new ids including EOS, per-row lengths, summed log-probs)."""
    e = EXPECTED
    prefix = e["prefixes"].shape[1]
    lengths = e[f"{case}/decode_lengths"] - prefix  # new tokens, EOS included
    ids = e[f"{case}/output_ids"][:, :, prefix:]
    steps = np.arange(ids.shape[-1])
    log_probs = np.where(steps < lengths[..., None], e[f"{case}/logprobs"][:, :, prefix:], 0.0).sum(-1)
    return ids, lengths, log_probs


@pytest.mark.parametrize("case", CASES)
def test_praxis_style_gives_praxis_nbest_ids_and_scores(case):
    e = EXPECTED
    ids, lengths, log_probs = _praxis_nbest(case)
    out = _run(case, "praxis")
    np.testing.assert_array_equal(np.asarray(out.lengths), lengths)
    steps = np.arange(ids.shape[-1])
    ours = np.where(steps < lengths[..., None], np.asarray(out.tokens), 0)  # Praxis: zeros after EOS
    np.testing.assert_array_equal(ours, ids)
    assert (ids[np.arange(ids.shape[0])[:, None], np.arange(ids.shape[1]), lengths - 1] == e["eos_id"]).all()
    np.testing.assert_allclose(np.asarray(out.scores), e[f"{case}/scores"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.log_probs), log_probs, rtol=0, atol=1e-5)


def test_default_style_differs_from_praxis_here():
    """pax_eqx's own search is a different algorithm (an EOS finishes a hypothesis only when it is
    among the K best candidates, and the beam then shrinks; unfinished hypotheses are returned;
    GNMT's /6 penalty): on this table it misses Praxis' short hypotheses ([EOS] at once, say),
    so its n-best ids differ."""
    ids, lengths, _ = _praxis_nbest("beam3_alpha08")
    out = _run("beam3_alpha08", "pax_eqx")
    steps = np.arange(ids.shape[-1])
    ours = np.where(steps < np.asarray(out.lengths)[..., None], np.asarray(out.tokens), 0)
    assert (ours != ids).any()


def test_praxis_style_settings_are_refused_by_name():
    e = EXPECTED
    decoder = TableDecoder(jnp.asarray(e["table"]), jnp.asarray(e["prefixes"][:, -1]))
    for kwargs, match in (
        ({"style": "t5x"}, "style"),
        ({"style": "praxis", "eos_id": -1}, "eos_id"),
        ({"style": "praxis", "eos_id": 99}, "eos_id"),
        ({"style": "praxis", "beam_size": 11}, "beam_size"),
    ):
        args = {"beam_size": 3, "max_new_tokens": 2, "eos_id": 1} | kwargs
        with pytest.raises(ConfigError, match=match):
            beam_search(decoder, **args)
