"""The eval metrics an input declares (pax_eqx.metric_fns), against the arithmetic of their
definitions on fixed strings: BLEU and chrF through sacrebleu, ROUGE through rouge-score, exact
match, and bits per byte with the byte and SentencePiece tokenizers' byte counts."""

import math

import numpy as np
import pytest

from pax_eqx.config import ConfigError
from pax_eqx.data import ByteTokenizer, SentencePieceTokenizer
from pax_eqx.data.tokenizers import SentencePieceConfig, train_sentencepiece
from pax_eqx.metric_fns import (
    EvalContext,
    bits_per_byte,
    bleu,
    check_metric_names,
    chrf,
    exact_match,
    rouge,
    unfeedable,
)
from pax_eqx.metrics import Weighted


def test_bleu_is_the_geometric_mean_of_precisions_times_the_brevity_penalty():
    """Every n-gram of the hypothesis is in the reference (precisions 1), the hypothesis is 6
    words to the reference's 7: BLEU = 100 exp(1 - 7/6)."""
    got = bleu(["the cat sat on the mat today"], ["the cat sat on the mat"])["bleu"]
    assert got == pytest.approx(100 * math.exp(1 - 7 / 6), abs=1e-4)
    assert bleu(["a b c d e"], ["a b c d e"])["bleu"] == pytest.approx(100.0)


def test_chrf_is_100_on_identical_text_and_lower_otherwise():
    assert chrf(["the cat sat"], ["the cat sat"])["chrf"] == pytest.approx(100.0)
    assert 0 < chrf(["the cat sat"], ["the dog sat"])["chrf"] < 100


def test_rouge_f_measures_from_unigram_bigram_and_lcs_overlap():
    """Prediction "the cat sat" against "the cat sat on the mat": unigram P 1, R 3/6; bigram P 1,
    R 2/5; LCS 3 words: P 1, R 1/2."""
    f = lambda p, r: 2 * p * r / (p + r)
    got = rouge(["the cat sat on the mat"], ["the cat sat"])
    assert got["rouge1"] == pytest.approx(100 * f(1, 3 / 6))
    assert got["rouge2"] == pytest.approx(100 * f(1, 2 / 5))
    assert got["rougeL"] == pytest.approx(100 * f(1, 1 / 2))


def test_exact_match_ignores_outer_whitespace_only():
    assert exact_match(["a b", "c", "d"], [" a b\n", "c ", "D"])["exact_match"] == pytest.approx(2 / 3)


def test_bits_per_byte_of_a_byte_model_is_its_loss_in_bits():
    labels = np.array([[10, 11, 12, 0]])
    weights = np.array([[1.0, 1.0, 1.0, 0.0]])
    merged = {"avg_xent": Weighted(np.float32(2.0), np.float32(3.0))}
    rows = {"labels": labels, "token_weights": weights}
    got = bits_per_byte(rows, merged, EvalContext(ByteTokenizer(), None, 0))["bits_per_byte"]
    assert got == pytest.approx(2.0 / math.log(2))


def test_sentencepiece_pieces_count_the_bytes_of_the_text():
    """The pieces of a text add up to its UTF-8 bytes (pax_eqx trains without a dummy prefix):
    what bits per byte divides by."""
    lines = ["O Romeo, Romeo! wherefore art thou Romeo?", "Deny thy father and refuse thy name; café"]
    spm = SentencePieceTokenizer(train_sentencepiece(lines * 8, SentencePieceConfig(vocab_size=36)))
    token_bytes = spm.token_bytes()
    for line in lines:
        assert token_bytes[spm.encode(line)].sum() == len(line.encode("utf-8"))
    assert token_bytes[[spm.pad_id, spm.bos_id, spm.eos_id]].sum() == 0


def test_what_a_model_or_its_data_cannot_feed_is_named_with_the_reason():
    lm = ("labels", "token_weights", "weight")
    unfed = unfeedable(("bleu", "balanced_accuracy", "bits_per_byte"), lm, False, True, "LanguageModelConfig")
    assert set(unfed) == {"bleu", "balanced_accuracy"}
    assert "does not decode its inputs" in unfed["bleu"] and "per-example outputs" in unfed["balanced_accuracy"]
    assert "token ids" in unfeedable(("bits_per_byte",), lm, False, False, "LanguageModelConfig")["bits_per_byte"]
    with pytest.raises(ConfigError, match="has no function 'nope'"):
        check_metric_names(("pax_eqx.metric_fns.nope",))
    with pytest.raises(ConfigError, match=r"'blue', which is not an eval metric: use one of \[.*'bleu'"):
        check_metric_names(("blue",))
