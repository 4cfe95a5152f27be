"""The benchmark and profiling commands as a user runs them, shrunk to CPU smoke runs (untimed).

`benchmarks.mfu` on gpt3_xl's architecture at toy size (its summary and its JSON last line),
`benchmarks.pgle` on CPU (trace written, no profile.pb: CPUs record no instruction latencies),
and `--profile.steps` writing a profiler trace into the job dir.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

from benchmarks import flops, mfu, pgle
from benchmarks.reference_gpt import count_params

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "programs"))
from tiny import tiny_args  # noqa: E402

from pax_eqx import train  # noqa: E402
from pax_eqx.command_line import cli  # noqa: E402

TOY_XL = [
    "--model.num-layers", "2", "--model.model-dims", "64", "--model.hidden-dims", "256", "--model.num-heads", "4",
    "--model.dim-per-head", "16", "--model.vocab-size", "512", "--model.max-seq-len", "32", "--data.seq-len", "32",
    "--data.train.batch-size", "8", "--train.fprop-dtype", "float32",
]  # fmt: skip
KEYS = {
    "exp", "device_kind", "num_devices", "params", "tokens_per_step", "step_time_s", "tokens_per_s",
    "model_tflops_per_s", "mfu", "hfu", "peak_tflops", "compile_s", "peak_mem_gb", "temp_mem_gb",
    "reference_step_time_s", "ratio_to_reference",
}  # fmt: skip


def test_mfu_benchmark_smoke_run_prints_a_summary_and_a_json_last_line(capsys):
    assert (
        mfu.main(["--exp", "gpt3_xl", *TOY_XL, "--mesh.ici-mesh-shape", "8", "1", "1", "--steps", "2", "--warmup", "1"])
        == 0
    )
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert KEYS <= result.keys()
    assert result["exp"] == "gpt3_xl" and result["num_devices"] == 8
    assert result["tokens_per_step"] == 8 * 32
    exp, _, _ = cli.parse(["--exp", "gpt3_xl", *TOY_XL], "t", "", job_dir_required=False)
    expected = count_params(mfu.reference_config(exp, 8))  # the reference's parameter formula
    assert result["params"] == expected  # pax_eqx's model and the plain-JAX reference have the same parameters
    per_token = flops.model_flops_per_token(expected, 2, 64, 32)
    assert result["model_tflops_per_s"] == pytest.approx(result["tokens_per_s"] * per_token / 1e12, rel=1e-6)
    assert result["mfu"] == pytest.approx(result["model_tflops_per_s"] / result["peak_tflops"], rel=1e-6)
    assert 0 < result["mfu"] <= result["hfu"] and result["temp_mem_gb"] > 0
    assert math.isfinite(result["ratio_to_reference"]) and result["ratio_to_reference"] > 0
    assert result["ratio_to_reference"] == pytest.approx(result["step_time_s"] / result["reference_step_time_s"])
    assert any("MFU" in line for line in out[:-1])  # the human summary comes first


TINY_CHAR = [
    "--model.num-layers", "2", "--model.model-dims", "32", "--model.hidden-dims", "64", "--model.num-heads", "2",
    "--data.seq-len", "16", "--data.train.batch-size", "8", "--mesh.ici-mesh-shape", "8", "1", "1",
    "--steps", "2", "--warmup", "1",
]  # fmt: skip


def test_mfu_times_the_loop_of_steps_and_a_reference_of_the_same_model(capsys):
    """shakespeare_char (rotary positions, exact GELU, LayerNorm without bias, no biases, layers
    unrolled, 10 steps per call): the reference makes the same choices -- its parameter count
    formula equals pax_eqx's model -- and the step is timed as the trainer runs it."""
    assert mfu.main(["--exp", "shakespeare_char", *TINY_CHAR]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    exp, _, _ = cli.parse(["--exp", "shakespeare_char", *TINY_CHAR[:-4]], "t", "", job_dir_required=False)
    assert result["reference_mismatch"] == [] and result["ratio_to_reference"] > 0
    assert result["params"] == count_params(mfu.reference_config(exp, 8))
    assert result["steps_per_loop"] == 10 and "10 steps per compiled call" in out
    assert result["ratio_to_reference"] == pytest.approx(
        result["one_step_call_time_s"] / result["reference_step_time_s"]
    )
    assert "measured in this run" in result["peak_source"] and "measured in this run" in out


def test_mfu_refuses_a_ratio_to_a_reference_of_another_model(capsys):
    assert mfu.main(["--exp", "shakespeare_char", *TINY_CHAR, "--model.block.norm-policy", "post"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["ratio_to_reference"] is None and result["reference_step_time_s"] is None
    assert result["reference_mismatch"] == ["model.block.norm_policy='post'"]
    assert "no ratio to the plain-JAX reference" in out


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--model.position-embedding", "sinusoidal"], "model.position_embedding='sinusoidal'"),
        (["--model.block.activation.name", "squared_relu"], "activation='squared_relu'"),
        (["--model.block.activation.gated"], "gated"),
        (["--model.separate-embedding"], "separate_embedding"),
        (["--model.num-kv-heads", "1"], "num_kv_heads=1"),
    ],
)
def test_reference_differences_name_each_choice_the_reference_lacks(flags, named):
    exp, _, _ = cli.parse(["--exp", "shakespeare_char", *flags], "t", "", job_dir_required=False)
    assert any(named in d for d in mfu.reference_differences(exp))


def test_pgle_on_cpu_traces_but_writes_no_profile(tmp_path, capsys):
    job = tmp_path / "pgle"
    args = ["--exp", "shakespeare_char", "--job-log-dir", str(job), "--steps", "1", "--model.num-layers", "1",
            "--mesh.ici-mesh-shape", "8", "1", "1", "--data.train.batch-size", "8"]  # fmt: skip
    assert pgle.main(args) == 0
    assert "no instruction latencies" in capsys.readouterr().out
    assert list((job / "pgle_trace").rglob("*.xplane.pb")) and not (job / "profile.pb").exists()
    assert pgle.NO_COMMAND_BUFFERS in os.environ["XLA_FLAGS"]


def test_profile_steps_write_a_trace_into_the_job_dir(tmp_path):
    job = tmp_path / "job"
    assert train.main(tiny_args(job, "--profile.steps", "2", "3", "--train.no-sample-at-end")) == 0
    traces = list((job / "profile").rglob("*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0
