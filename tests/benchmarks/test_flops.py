"""MFU arithmetic: PaLM's formula by hand for GPT3-XL, HFU under each remat policy, peaks, mfu()."""

import math

import pytest

from benchmarks import flops
from benchmarks.flops import (
    attention_flops_per_token,
    hardware_flops_per_token,
    measure_cpu_peak_tflops,
    mfu,
    model_flops_per_token,
    peak_tflops,
)
from benchmarks.reference_config import ReferenceConfig
from benchmarks.reference_gpt import count_params

# GPT3-XL as issue 7 fixes it: 24 layers, d 2048, S 2048, V 50304 (tied embedding, learned positions).
L, D, S, V = 24, 2048, 2048, 50304
# Parameters by hand: per layer 2 LayerNorms (4d) + QKV (3d^2 + 3d) + out (d^2 + d) + MLP (8d^2 + 4d + d);
# plus the tied embedding V*d, positions S*d and the final LayerNorm 2d.
PER_LAYER = 12 * D * D + 13 * D  # 50,358,272
N_GPT3_XL = L * PER_LAYER + V * D + S * D + 2 * D  # 1,315,819,520


def test_gpt3_xl_model_flops_by_hand():
    assert PER_LAYER == 50_358_272 and N_GPT3_XL == 1_315_819_520
    assert count_params(ReferenceConfig()) == N_GPT3_XL
    # 6N = 7,894,917,120; 12 L d S = 12 * 24 * 2048 * 2048 = 1,207,959,552.
    assert model_flops_per_token(N_GPT3_XL, L, D, S) == 9_102_876_672


def test_mfu_arithmetic():
    assert mfu(1e5, 1e10, 1000.0) == pytest.approx(1.0)
    assert mfu(1e5, 1e10, 1000.0, num_devices=4) == pytest.approx(0.25)
    # Batch 16 x 2048 tokens in 0.580 s on an H100: the DESIGN.md scan-over-layers row (~52%).
    tokens_per_s = 16 * 2048 / 0.580
    assert mfu(tokens_per_s, model_flops_per_token(N_GPT3_XL, L, D, S), 989.4) == pytest.approx(0.5198, abs=1e-4)
    with pytest.raises(ValueError, match="peak > 0"):
        mfu(1.0, 1.0, 0.0)


def test_hardware_flops_per_remat_policy():
    model = model_flops_per_token(N_GPT3_XL, L, D, S)
    attention = 4 * L * D * S
    assert attention_flops_per_token(L, D, S) == attention
    hfu = lambda policy, **kw: hardware_flops_per_token(N_GPT3_XL, L, D, S, policy, **kw)
    assert hfu("none") == model
    assert hfu("everything_saveable") == model
    assert hfu("dots_with_no_batch_dims_saveable") == model + attention
    assert hfu("dots_saveable", attention_impl="xla") == model
    assert hfu("dots_saveable", attention_impl="cudnn") == model + attention
    assert hfu("dots_with_no_batch_dims_and_context", attention_impl="cudnn") == model
    assert hfu("dots_with_no_batch_dims_and_context", attention_impl="xla") == model + attention
    # Full remat: the layers' forward again. With every parameter counted: 8N + 16 L d S.
    assert hfu("full") == 8 * N_GPT3_XL + 16 * L * D * S
    assert hfu("nothing_saveable", layer_params=L * PER_LAYER) == model + 2 * L * PER_LAYER + attention
    with pytest.raises(ValueError, match="remat_policy='dots' is unknown"):
        hfu("dots")
    with pytest.raises(ValueError, match="attention_impl='flash'"):
        hfu("none", attention_impl="flash")


@pytest.mark.parametrize(
    "kind, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.4),
        ("NVIDIA H200", 989.4),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("TPU v5 lite", 197.0),
        ("TPU v4", 275.0),
        ("cpu", None),
        ("NVIDIA GeForce RTX 3090", None),
    ],
)
def test_peak_table(kind, peak):
    assert peak_tflops(kind) == peak


def test_measured_cpu_peak_is_a_positive_rate():
    tflops = measure_cpu_peak_tflops(size=256, repeats=2)
    assert math.isfinite(tflops) and 0 < tflops < 100  # two CPU cores do not reach 100 TF/s
    with pytest.raises(ValueError, match="size > 0"):
        measure_cpu_peak_tflops(size=0)


def test_rates_read_in_the_unit_that_fits_them():
    assert flops.rate_text(0.21) == "210.0 GF/s"  # a CPU: not "0.2 TF/s", nor "0.0 TF/s"
    assert flops.rate_text(989.4) == "989.4 TF/s"
    assert flops.rate_text(1.0) == "1.0 TF/s"


def test_a_loaded_machine_is_named_beside_the_measured_peak(monkeypatch):
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (0.4, 0.4, 0.4))
    assert flops.load_note(cores=2) == ""
    monkeypatch.setattr(os, "getloadavg", lambda: (3.5, 3.0, 2.0))
    note = flops.load_note(cores=2)
    assert note.startswith("the machine's load average was 3.5 on 2 cores") and "unreliable" in note
