"""Praxis' padding numerics against Praxis itself: the Paxml fixtures' TransformerLm
(tests/fixtures/paxml/, imported as tests/checkpoint does) given padded inputs, unpacked and
packed. With `block.attention.mask_mode="praxis"` and `block.ff_paddings=True` (what the Pax
experiments set), pax_eqx gives Praxis' logits at every position, the padded ones included
(TransformerLm's padding folded into the segment mask, TransformerFeedForward's zeroing); with
the defaults, at the real positions only. praxis_padding/expected.npz holds Praxis 1.4's logits
(written by praxis_padding/generate.py, in Praxis' own environment).

And the attention layer alone: Praxis' DotProductAttention's (encoded, atten_probs) under the
masks Praxis' unfolded stack builds (praxis_padding/attention.npz, generate_attention.py) are
`Attention.with_probs` in mask_mode="praxis".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_eqx.checkpoint.pax_import import read_checkpoint, to_model_params
from pax_eqx.layers.base import Context

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "paxml"
sys.path.insert(0, str(FIXTURES))
import pax_experiment  # noqa: E402

EXPECTED = np.load(Path(__file__).resolve().parent / "praxis_padding" / "expected.npz")
FORMS = ("repeated", "repeated_qkv", "layers", "layers_qkv")


def _model(form: str, praxis: bool):
    cfg = pax_experiment.model_config(json.loads((FIXTURES / form / "meta.json").read_text()), repeat=True)
    mode = "praxis" if praxis else "pax_eqx"
    block = cfg.block.replace(ff_paddings=praxis, attention=cfg.block.attention.replace(mask_mode=mode))
    model = cfg.replace(block=block).build(jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_array)
    new = to_model_params(read_checkpoint(FIXTURES / form).params, params)
    return eqx.combine(jax.tree.map(jnp.asarray, new), static)


def _logits(model, packed: bool) -> np.ndarray:
    """The logits from a batch as the data pipeline gives it (padding = segment 0)."""
    paddings = EXPECTED["paddings"]
    segment_ids = EXPECTED["segment_ids"] if packed else (1 - paddings).astype(np.int32)
    batch = dict(ids=EXPECTED["ids"], labels=EXPECTED["ids"], weights=1.0 - paddings, segment_ids=segment_ids)
    if packed:
        batch["segment_pos"] = EXPECTED["segment_pos"]
    hidden, _ = model.compute_predictions(batch, Context())
    return np.asarray(model.logits(hidden))


@pytest.mark.parametrize("form", FORMS)
def test_praxis_forms_give_praxis_logits_at_every_position(form):
    real = EXPECTED["paddings"] < 0.5
    praxis, default = _model(form, praxis=True), _model(form, praxis=False)
    for packed in (False, True):
        expected = EXPECTED[f"{form}/{'packed' if packed else 'unpacked'}"]
        np.testing.assert_allclose(_logits(praxis, packed), expected, rtol=0, atol=1e-5)
        ours = _logits(default, packed)
        np.testing.assert_allclose(ours[real], expected[real], rtol=0, atol=1e-5)
        assert np.abs(ours[~real] - expected[~real]).max() > 0.1  # the padded positions are where they differ


ATTENTION = np.load(Path(__file__).resolve().parent / "praxis_padding" / "attention.npz")


CASES = [("causal", True, False), ("causal_segments", True, True), ("segments", False, True), ("keys", False, False)]


def _praxis_attention(causal: bool):
    """pax_eqx's Attention in mask_mode='praxis' holding attention.npz's weights and biases."""
    from pax_eqx.layers import AttentionConfig

    a = ATTENTION
    d, n, h = a["w_q"].shape
    att = AttentionConfig(causal=causal, mask_mode="praxis", implementation="xla", use_bias=True).build(
        jax.random.PRNGKey(0), input_dims=d, num_heads=n, dim_per_head=h
    )
    w = {k: jnp.asarray(a[f"w_{k}"]) for k in "qkvo"}
    b = {k: jnp.asarray(a[f"b_{k}"]) for k in "qkvo"}
    return eqx.tree_at(
        lambda m: (m.w_q, m.w_k, m.w_v, m.w_o, m.b_q, m.b_k, m.b_v, m.b_o),
        att,
        (w["q"], w["k"], w["v"], w["o"].transpose(1, 2, 0), b["q"], b["k"], b["v"], b["o"]),
    )


def _with_probs(att, x, segments: bool):
    a = ATTENTION
    segment_ids = jnp.asarray(a["segment_ids"]) if segments else None
    return att.with_probs(x, Context(), paddings=jnp.asarray(a["paddings"]), segment_ids=segment_ids)


@pytest.mark.parametrize("case, causal, segments", CASES)
def test_praxis_mask_mode_gives_praxis_attention_and_probabilities(case, causal, segments):
    """Praxis' DotProductAttention given the mask its (unfolded) stack builds from paddings, causal
    and segment masks (merge_masks: padded query rows masked where a [T, T] mask meets padding):
    `with_probs` in mask_mode='praxis' returns its (encoded before `post`, atten_probs)."""
    y, probs, _ = _with_probs(_praxis_attention(causal), jnp.asarray(ATTENTION["x"]), segments)
    np.testing.assert_allclose(probs, ATTENTION[f"{case}/probs"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(y, ATTENTION[f"{case}/encoded"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("case, causal, segments", CASES)
def test_praxis_mask_mode_gives_praxis_gradients_with_fully_masked_rows(case, causal, segments):
    """The gradients of <encoded, cotangent>, a random cotangent at every position, padded rows
    (whose keys are all masked) included, to the input and every weight and bias: Praxis'. Its
    fully masked rows have a uniform softmax that passes nothing to their queries and keys."""
    a = ATTENTION

    def objective(att_and_x):
        y, _, _ = _with_probs(*att_and_x, segments)
        return jnp.sum(y * a[f"{case}/cotangent"])

    grad_att, grad_x = eqx.filter_grad(objective)((_praxis_attention(causal), jnp.asarray(a["x"])))
    np.testing.assert_allclose(grad_x, a[f"{case}/grad_x"], rtol=0, atol=1e-5)
    for k in "qkvo":
        w = getattr(grad_att, f"w_{k}")
        np.testing.assert_allclose(w.transpose(2, 0, 1) if k == "o" else w, a[f"{case}/grad_w_{k}"], rtol=0, atol=1e-5)
        np.testing.assert_allclose(getattr(grad_att, f"b_{k}"), a[f"{case}/grad_b_{k}"], rtol=0, atol=1e-5)
