"""The dry-run planner for a model that is not a language model: parameters, optimizer state
and gradients are planned; the activation estimate, a language model's formula, is not made
up for it and the plan says so."""

from __future__ import annotations

import re

from pax_eqx.command_line.registry import load_experiment
from pax_eqx.programs.plan.dry_run import plan


def gib(text: str, row: str) -> float:
    return float(re.search(rf"^  {re.escape(row)}\s+([\d.]+) GiB", text, re.M).group(1))


def test_a_classifier_is_planned_without_the_language_model_activation_estimate():
    result = plan(load_experiment("digits_mlp"), device_memory_gb=1.0)
    text = str(result)
    assert "activations (estimate)" not in text
    assert "activations               not estimated for a ClassificationModelConfig; leave headroom" in text
    assert result.fits is True and result.total_bytes > 0
    rows = ("parameters (float32)", "optimizer state", "gradients (float32)")
    assert abs(sum(gib(text, row) for row in rows) - gib(text, "total")) < 0.02


def test_a_language_model_keeps_its_activation_estimate():
    text = str(plan(load_experiment("lm_cloud_spmd_test")))
    assert re.search(r"^  activations \(estimate\)\s+[\d.]+ GiB  \(per-device batch \d+, seq \d+, remat", text, re.M)


def test_an_moe_plan_counts_expert_weights_and_the_all_to_all_bytes():
    """shakespeare_moe with experts on fsdp = 8: 2 MoE layers x 4 buffers (dispatch and combine,
    forward and backward) of [8 experts, 16 groups (one per row), capacity 16, 128] float32;
    capacity = round_up_4(64 tokens x 2.0 / 8 experts) = 16."""
    exp = load_experiment("shakespeare_moe")
    exp = exp.replace(
        mesh=exp.mesh.replace(ici_mesh_shape=(1, 8, 1)),
        data=exp.data.replace(train=exp.data.train.replace(batch_size=16), eval=exp.data.eval.replace(batch_size=16)),
    )
    text = str(plan(exp))
    assert re.search(r"^Expert weights: [\d,]+ .*expert axis -> fsdp; dispatch/combine are all-to-alls", text, re.M)
    total = 2 * 4 * 8 * 16 * 16 * 128 * 4
    assert total == 8 * 2**20
    assert (
        "All-to-all per step: 8.00 MiB over the expert axis (2 MoE layers x 4 buffers of [8 experts, 16 groups, "
        in text
    )
    assert f"each of the 8 devices sends {total * 7 / 64 / 2**20:.2f} MiB" in text
