"""The masked-LM augmenter's own draws, by their statistics (layers.masked_lm).

The decisions from given draws are Praxis' exactly (tests/praxis/test_praxis_bert.py); here pax_eqx's
own draws, over 65k tokens, give what BERT asks: 15% of the real tokens chosen, 80 / 10 / 10
of them masked / random / kept, random ids uniform over the vocabulary, padding never chosen. The
bounds are about 5 standard deviations of a binomial at these counts, so a correct augmenter
fails about once in a few million runs and a wrong one (a probability off by a tenth of itself)
fails every time. And training draws from the Context's key, eval from fixed per-row keys.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_eqx.config import ConfigError
from pax_eqx.layers import Context, MaskedLmConfig, Mode

VOCAB, MASK = 64, 63
B, T = 256, 256


AUGMENTER = MaskedLmConfig().build(vocab_size=VOCAB, mask_token_id=MASK)


@functools.partial(jax.jit, static_argnames="mode")
def _run(ids, paddings, key, mode):
    (augmented, chosen), _ = AUGMENTER(ids, Context(key=key, mode=mode), paddings=paddings)
    return augmented, chosen


def _augment(key=0, mode=Mode.TRAIN, ids=None, paddings=None):
    """(ids, paddings, augmented ids, chosen) as numpy; 25% of the positions padded by default."""
    if ids is None:
        ids = jax.random.randint(jax.random.PRNGKey(100), (B, T), 4, MASK)
    if paddings is None:
        paddings = (jnp.arange(T)[None, :] % 4 == 3).astype(jnp.float32) * jnp.ones((B, 1))
    augmented, chosen = _run(ids, paddings, jax.random.PRNGKey(key) if mode is Mode.TRAIN else None, mode)
    return np.asarray(ids), np.asarray(paddings), np.asarray(augmented), np.asarray(chosen)


def _within(count: int, n: int, p: float, what: str) -> None:
    sd = np.sqrt(n * p * (1 - p))
    assert abs(count - n * p) < 5 * sd, f"{what}: {count} of {n}, expected {n * p:.0f} +- {5 * sd:.0f}"


def test_fifteen_percent_of_the_real_tokens_are_chosen_eighty_ten_ten():
    ids, paddings, augmented, chosen = _augment()
    real = paddings < 0.5
    assert not chosen[~real].any(), "a padded position was chosen"
    assert (augmented[~real] == ids[~real]).all(), "a padded position was changed"
    assert (augmented[~chosen] == ids[~chosen]).all(), "a position not chosen was changed"
    n_real, n_chosen = int(real.sum()), int(chosen.sum())
    _within(n_chosen, n_real, 0.15, "chosen")
    masked = chosen & (augmented == MASK)  # the ids never hold MASK themselves (drawn in [4, 63))
    changed = chosen & (augmented != ids) & ~masked
    _within(int(masked.sum()), n_chosen, 0.8, "masked among chosen")
    # A random replacement draws the original id 1 time in VOCAB (and the mask 1 in VOCAB):
    # the visibly changed ones are random * (1 - 2 / VOCAB), the kept ones same + random / VOCAB.
    _within(int(changed.sum()), n_chosen, 0.1 * (1 - 2 / VOCAB), "replaced by another id among chosen")
    kept = chosen & (augmented == ids)
    _within(int(kept.sum()), n_chosen, 0.1 + 0.1 / VOCAB, "kept among chosen")
    # The random ids are uniform over the whole vocabulary, specials included.
    counts = np.bincount(augmented[changed], minlength=VOCAB)
    expected = changed.sum() / (VOCAB - 1)  # the mask id is counted as masked, not changed
    assert counts[:4].sum() > 0, "a random id never drew a special id (Praxis draws from all of them)"
    chi2 = float(np.sum((counts[:MASK] - expected) ** 2 / expected))
    assert chi2 < 140, f"random ids not uniform: chi2 {chi2:.0f} over {MASK - 1} degrees of freedom"


def test_training_draws_from_the_context_and_eval_from_the_rows():
    a, b = _augment(key=1)[3], _augment(key=2)[3]
    assert (a != b).any(), "two training keys chose the same positions"
    ids, paddings, aug_eval, chosen_eval = _augment(mode=Mode.EVAL)
    again = _augment(mode=Mode.EVAL)
    np.testing.assert_array_equal(aug_eval, again[2])
    _within(int(chosen_eval.sum()), int((paddings < 0.5).sum()), 0.15, "chosen in eval")
    # Each row's mask depends on that row alone: the same rows in another order, or beside
    # other rows, are masked the same way.
    order = np.random.default_rng(0).permutation(B)
    shuffled = _augment(mode=Mode.EVAL, ids=jnp.asarray(ids[order]), paddings=jnp.asarray(paddings[order]))
    np.testing.assert_array_equal(shuffled[2], aug_eval[order])
    # Two different rows draw differently.
    assert (chosen_eval[0] != chosen_eval[1]).any()


@pytest.mark.parametrize(
    "fields, named",
    [
        (dict(mask_prob=0.9, random_prob=0.1, same_prob=0.1), "mask_prob + random_prob + same_prob"),
        (dict(mask_prob=0.0, random_prob=0.0, same_prob=0.0), "mask_prob + random_prob + same_prob"),
        (dict(random_prob=0.0, same_prob=0.0), "random_prob + same_prob"),
        (dict(mask_prob=-0.1), "mask_prob"),
    ],
)
def test_bad_probabilities_are_refused_by_name(fields, named):
    with pytest.raises(ConfigError, match=named.replace("+", r"\+")):
        MaskedLmConfig(**fields)
