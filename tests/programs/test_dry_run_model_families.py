"""The dry-run planner for a model that is not a language model: parameters, optimizer state
and gradients are planned; the activation estimate, a language model's formula, is not made
up for it and the plan says so."""

from __future__ import annotations

import re

from pax_eqx.programs.dry_run import plan
from pax_eqx.programs.registry import load_experiment


def gib(text: str, row: str) -> float:
    return float(re.search(rf"^  {re.escape(row)}\s+([\d.]+) GiB", text, re.M).group(1))


def test_a_classifier_is_planned_without_the_language_model_activation_estimate():
    result = plan(load_experiment("digits_mlp"), device_memory_gb=1.0)
    text = str(result)
    assert "activations (estimate)" not in text
    assert "not estimated: the estimate is for language models only (model is a ClassificationModelConfig)" in text
    assert result.fits is True and result.total_bytes > 0
    rows = ("parameters (float32)", "optimizer state", "gradients (float32)")
    assert abs(sum(gib(text, row) for row in rows) - gib(text, "total")) < 0.02


def test_a_language_model_keeps_its_activation_estimate():
    text = str(plan(load_experiment("lm_cloud_spmd_test")))
    assert re.search(r"^  activations \(estimate\)\s+[\d.]+ GiB  \(per-device batch \d+, seq \d+, remat", text, re.M)
