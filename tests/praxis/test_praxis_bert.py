"""BertModel against Praxis 1.4's own (`layers.models.BertModel`, `augmentations.MaskedLmDataAugmenter`).

tests/fixtures/praxis_bert/expected.npz is written by generate.py there, in Praxis' environment: a
tiny BIDIRECTIONAL packed TransformerLm (Paxml's TransformerBertSpmdAdafactor form) with its
weights, a batch of two rows (one packing two documents, one padded), the augmenter's draws and
decisions, and the forward's logits, per-token cross-entropy and metrics; also a pre-masked batch
(`masked_ids` / `masked_pos`) and the augmenter alone on a 16 x 64 batch.

The weights go into pax_eqx's BertModel by the Paxml checkpoint import's name mapping
(`checkpoint.pax_import.to_model_params`: a BertModel's parameters are a LanguageModel's), Praxis'
masking decisions are injected as the batch's `masked_ids` / `masked_pos` (the path Praxis' own
BertModel takes for pre-masked data), and the draws Praxis' augmenter made are fed to pax_eqx's
`decide` (JAX's random bits differ between versions; the decisions from given draws must not).
"""

from __future__ import annotations

import json
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import assert_matches_reference

from pax_eqx.checkpoint.pax_import import to_model_params
from pax_eqx.layers import AttentionConfig, Context, MaskedLmConfig, TransformerConfig
from pax_eqx.layers.masked_lm import Draws
from pax_eqx.models import BertModelConfig

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "praxis_bert"
E = dict(np.load(HERE / "expected.npz"))
META = json.loads((HERE / "meta.json").read_text())
# Float32 forwards in two orders of the same math: Praxis' reference held to 1e-5.
TOL = dict(rtol=1e-5, atol=1e-5)


def _model(praxis_mask_mode: bool):
    """pax_eqx's BERT with the fixture's weights; `praxis_mask_mode`: Praxis' numerics at padded
    positions too (padding folded into the segment mask, the feed-forward zeroing them)."""
    attention = AttentionConfig(
        causal=False, combine_qkv=True, use_bias=False, per_dim_scale=True, logit_cap=META["atten_logit_cap"],
        mask_mode="praxis" if praxis_mask_mode else "pax_eqx",
    )  # fmt: skip
    cfg = BertModelConfig(
        vocab_size=META["vocab_size"], max_seq_len=META["seq_len"], num_layers=META["num_layers"],
        model_dims=META["model_dims"], hidden_dims=META["hidden_dims"], num_heads=META["num_heads"],
        position_embedding="trainable", repeat=False,
        block=TransformerConfig(attention=attention, ff_paddings=praxis_mask_mode),  # ReLU: the default
        scale_embedding_sqrt_depth=True, softmax_bias=True, soft_cap_logits=META["softmax_cap_logits"],
        mask_token_id=META["mask_token_id"], masking=MaskedLmConfig(**META["augmenter"]),
    )  # fmt: skip
    model = eqx.filter_eval_shape(cfg.build, jax.random.PRNGKey(0))  # shapes only: Praxis gives the values
    params, static = eqx.partition(model, lambda x: isinstance(x, jax.ShapeDtypeStruct))
    pax = {k.removeprefix("params/"): v for k, v in E.items() if k.startswith("params/")}
    return eqx.combine(jax.tree.map(jnp.asarray, to_model_params(pax, params)), static)


def _batch(prefix: str) -> dict:
    """The fixture's batch with Praxis' masking decisions as `masked_ids` / `masked_pos`."""
    return {
        "ids": E["labels"], "segment_ids": E["segment_ids"], "segment_pos": E["segment_pos"],
        "masked_ids": E[prefix + "augmented_ids"], "masked_pos": E[prefix + "augmented_pos"],
    }  # fmt: skip


@pytest.mark.parametrize("prefix", ["", "premasked_"], ids=["augmented", "premasked"])
@pytest.mark.parametrize("praxis_mask_mode", [True, False], ids=["praxis_mask_mode", "default_mask_mode"])
def test_logits_loss_and_accuracy_are_praxis(prefix, praxis_mask_mode):
    model = _model(praxis_mask_mode)
    batch = _batch(prefix)
    predictions, _ = model.compute_predictions(batch, Context())
    logits = np.asarray(model.logits(predictions.hidden))
    # Praxis' mode computes what Praxis does at every position; the default at the real ones
    # (padding: segment 0), the only ones a loss or a prediction reads.
    where = np.ones(logits.shape[:2], bool) if praxis_mask_mode else E["paddings"] < 0.5
    assert_matches_reference(logits[where], E[prefix + "logits"][where], **TOL)
    xent = np.asarray(model.xent(jnp.asarray(logits), jnp.asarray(E["labels"])))
    assert_matches_reference(xent[where], E[prefix + "per_token_xent"][where], **TOL)
    metrics = model.compute_loss(predictions, batch)
    np.testing.assert_array_equal(np.asarray(predictions.weights), E[prefix + "augmented_pos"])
    assert float(metrics["avg_xent"].weight) == float(E[prefix + "num_predictions"])
    assert_matches_reference(float(metrics["avg_xent"].value), float(E[prefix + "avg_xent"]), **TOL)
    assert_matches_reference(float(metrics["log_pplx"].value), float(E[prefix + "avg_xent"]), **TOL)
    accuracy = float(metrics["accuracy"].value)
    assert_matches_reference(accuracy, float(E[prefix + "fraction_of_correct_preds"]), rtol=0, atol=1e-6)
    if prefix:  # every real token predicted, most shown as themselves: an accuracy that is not trivially 0
        assert 0.0 < accuracy < 1.0 and float(metrics["accuracy"].weight) == 14.0


def _diffs() -> dict[str, float]:
    """Max abs differences to Praxis (Praxis' mask mode, every position), for the report."""
    model, batch = _model(True), _batch("")
    predictions, _ = model.compute_predictions(batch, Context())
    logits = model.logits(predictions.hidden)
    metrics = model.compute_loss(predictions, batch)
    xent = model.xent(logits, jnp.asarray(E["labels"]))
    return {
        "logits": float(np.max(np.abs(np.asarray(logits) - E["logits"]))),
        "per_token_xent": float(np.max(np.abs(np.asarray(xent) - E["per_token_xent"]))),
        "avg_xent": abs(float(metrics["avg_xent"].value) - float(E["avg_xent"])),
        "accuracy": abs(float(metrics["accuracy"].value) - float(E["fraction_of_correct_preds"])),
    }  # fmt: skip


@pytest.mark.parametrize("prefix, ids, paddings, augmented, pos", [
    ("", "labels", "paddings", "augmented_ids", "augmented_pos"),
    ("aug_", "aug_ids", "aug_paddings", "aug_augmented", "aug_pos"),
], ids=["model_batch", "augmenter_16x64"])  # fmt: skip
def test_decisions_from_praxis_draws_are_praxis(prefix, ids, paddings, augmented, pos):
    augmenter = MaskedLmConfig(**META["augmenter"]).build(
        vocab_size=META["vocab_size"], mask_token_id=META["mask_token_id"]
    )
    draws = Draws(*(jnp.asarray(E[f"{prefix}draw_{n}"]) for n in ("chosen", "masked", "random", "random_ids")))
    choices = augmenter.decide(draws, jnp.asarray(E[paddings]))
    np.testing.assert_array_equal(np.asarray(choices.chosen, np.float32), E[pos])
    np.testing.assert_array_equal(np.asarray(augmenter.apply(jnp.asarray(E[ids]), choices)), E[augmented])
    if prefix:  # the big batch takes every branch many times
        assert min(int(np.sum(c)) for c in (choices.masked, choices.random, choices.same)) > 0


if __name__ == "__main__":
    print(json.dumps(_diffs(), indent=2))
