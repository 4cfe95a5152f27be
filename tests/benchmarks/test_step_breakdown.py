"""`benchmarks.step_breakdown` and the HLO index under it, checked against arithmetic.

The matmul FLOPs read off a compiled train step must equal the model's formula exactly, and a
scan's instructions must run once per layer; the command itself runs as a CPU smoke test.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from benchmarks import hlo_ops, step_breakdown
from benchmarks.mfu import synthetic_step
from pax_eqx.command_line import cli
from pax_eqx.command_line.cli import CliError

L, D, F, N, H, V, S, B = 2, 64, 256, 4, 16, 512, 32, 8
TOY_XL = [
    "--exp", "gpt3_xl", "--model.num-layers", str(L), "--model.model-dims", str(D), "--model.hidden-dims", str(F),
    "--model.num-heads", str(N), "--model.dim-per-head", str(H), "--model.vocab-size", str(V),
    "--model.max-seq-len", str(S), "--data.seq-len", str(S), "--data.train.batch-size", str(B),
    "--train.fprop-dtype", "float32", "--mesh.ici-mesh-shape", "8", "1", "1",
]  # fmt: skip


def test_a_scans_dots_run_once_per_layer_and_count_2mnk_flops():
    layers, batch, d = 4, 8, 64

    def loss(w, x):
        h, _ = jax.lax.scan(lambda h, wl: (jnp.tanh(h @ wl), None), x, w)
        return h.sum()

    hlo = jax.jit(jax.grad(loss)).lower(jnp.ones((layers, d, d)), jnp.ones((batch, d))).compile().as_text()
    ops = hlo_ops.index_module(hlo)
    matmuls = [op for op in ops.values() if op.category == "matmul"]
    assert matmuls and all(op.executions == layers for op in matmuls)
    # forward h @ w, backward dh @ w.T and h.T @ dh: three [8,64]x[64,64]-sized products per layer
    assert sum(op.flops * op.executions for op in matmuls) == 3 * layers * 2 * batch * d * d
    assert {op.category for op in ops.values() if op.opcode == "while"} == {hlo_ops.CONTROL_FLOW}


# What XLA:GPU prints (operand shapes inline, cuBLAS and Triton GEMMs, cuDNN attention, a scan's
# while loop), written by hand.
GPU_HLO = (Path(__file__).parent / "gpu_step.hlo.txt").read_text()


def test_gpu_style_hlo_kernels_get_their_kind_flops_and_trip_count():
    ops = hlo_ops.index_module(GPU_HLO)
    kinds = {name: (op.category, op.flops, op.executions) for name, op in ops.items()}
    assert kinds == {
        "gemm_fusion_dot.1": ("matmul", 2 * 64 * 16 * 32, 24),  # a Triton GEMM: the dot inside the fusion
        "custom-call.2": ("matmul", 2 * 64 * 32 * 16, 24),  # cuBLAS: dimension numbers from the backend config
        "fmha.3": ("attention", 0.0, 24),
        "loop_add_fusion": ("elementwise fusion", 0.0, 24),
        "lt": ("other", 0.0, 25),  # the loop condition runs once more than the body
        "while.1": (hlo_ops.CONTROL_FLOW, 0.0, 1),
        "all-reduce.4": ("collective", 0.0, 1),
        "input_reduce_fusion": ("reduction fusion", 0.0, 1),
        "copy.5": ("copy/transpose", 0.0, 1),
    }  # and nothing from %add, a reducer, or the fused computation: they launch no kernel
    assert ops["gemm_fusion_dot.1"].source == "jit(train_step)/jvp()/while/body/dot_general"
    assert step_breakdown.module_name(GPU_HLO) == "jit_train_step"


def test_a_loop_without_a_trip_count_is_flagged_and_a_quoted_backend_config_parses():
    no_count = GPU_HLO.replace(', backend_config={"known_trip_count":{"n":"24"}}', "")
    ops = hlo_ops.index_module(no_count)
    assert ops["custom-call.2"].executions == 1 and not ops["custom-call.2"].counted
    assert ops["copy.5"].counted  # outside the loop: exact
    quoted = GPU_HLO.replace('backend_config={"known_trip_count":{"n":"24"}}',
                             'backend_config="{\\"known_trip_count\\":{\\"n\\":\\"24\\"}}"')  # fmt: skip
    assert hlo_ops.index_module(quoted)["custom-call.2"].executions == 24


def test_matmul_flops_of_the_compiled_train_step_equal_the_model_formula():
    exp, _, _ = cli.parse(TOY_XL, "t", "", job_dir_required=False)
    assert exp.model.remat_policy == "dots_with_no_batch_dims_saveable" and exp.model.block.attention.use_bias
    programs, state, batch = synthetic_step(exp)
    ops = hlo_ops.index_module(programs.train_step.lower(state, batch).compile().as_text())
    tokens = B * S
    # Weights that are matmul operands: QKV, output projection, the MLP, and the tied softmax.
    matmul_params = L * (3 * D * N * H + N * H * D + 2 * D * F) + V * D
    # 6 flops per weight per token (forward, two in the backward); attention's QK^T and PV are
    # 4·S·N·H flops per token per layer forward, done 4 times: forward, the remat's recompute
    # (this policy saves no batched dot), and twice in the backward.
    expected = 6 * matmul_params * tokens + 4 * (4 * S * N * H) * L * tokens
    # The compiled module is one device's program: data parallel over 8 devices, an eighth each.
    assert sum(op.flops * op.executions for op in ops.values()) == expected / 8


def test_a_chunked_loss_costs_no_extra_matmul_and_keeps_the_whole_logits_out_of_memory():
    """`model.loss_chunk_size` computes the loss's gradient chunk by chunk in the forward
    (`layers.chunked_xent`): the compiled step has exactly the unchunked step's matmul FLOPs
    (a rematerialised chunk would add the logits matmul again) and far smaller temporaries."""
    big_vocab = [*TOY_XL, "--model.vocab-size", "4096", "--model.max-seq-len", "128", "--data.seq-len", "128",
                 "--data.train.batch-size", "64"]  # fmt: skip
    measured = []
    for chunk in ("0", "32"):
        exp, _, _ = cli.parse([*big_vocab, "--model.loss-chunk-size", chunk], "t", "", job_dir_required=False)
        programs, state, batch = synthetic_step(exp)
        compiled = programs.train_step.lower(state, batch).compile()
        flops = sum(op.flops * op.executions for op in hlo_ops.index_module(compiled.as_text()).values())
        measured.append((flops, compiled.memory_analysis().temp_size_in_bytes))
    (whole_flops, whole_temp), (chunked_flops, chunked_temp) = measured
    assert chunked_flops == whole_flops
    # per device: 8 rows x 128 positions x 4096 float32 logits = 16.8 MB, and their gradient
    assert chunked_temp < 0.6 * whole_temp


def test_busy_time_is_the_union_of_the_kernel_intervals():
    events = [("a", "gpu0", 0, 10), ("b", "gpu0", 5, 15), ("c", "gpu0", 20, 25), ("d", "gpu0", 21, 22)]
    assert step_breakdown.busy_ns(events) == 15 + 5
    assert step_breakdown.busy_ns([*events, ("a", "gpu1", 0, 10)]) == 15 + 5 + 10  # summed over devices


def test_breakdown_command_prints_categories_top_ops_and_a_json_last_line(capsys):
    assert step_breakdown.main([*TOY_XL, "--steps", "2", "--top", "5", "--reference"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    reference = result.pop("reference")  # the plain-JAX step, broken down the same way
    assert reference["categories"]["matmul"]["tflops_per_s"] > 0 and len(reference["top_ops"]) == 5
    assert any(line.startswith("kernels busy") for line in out)  # the side-by-side table
    categories = result["categories"]
    assert categories["matmul"]["tflops_per_s"] > 0 and categories["matmul"]["time_s"] > 0
    assert hlo_ops.CONTROL_FLOW not in categories  # a loop's event spans its body's: not added twice
    assert "not in the module" not in categories  # every kernel was joined to its instruction
    times = [row["time_s"] for row in result["top_ops"]]
    assert len(times) == 5 and times == sorted(times, reverse=True)
    assert 0 < result["busy_s"] and result["step_time_s"] > 0
    assert any(line.startswith("matmul") for line in out[:-1])  # the human table comes first


def test_breakdown_refuses_zero_steps(capsys):
    with pytest.raises(CliError) as e:
        step_breakdown.main([*TOY_XL, "--steps", "0"])
    assert e.value.code == 2
    assert "--steps must be >= 1, got 0" in capsys.readouterr().err


def test_module_name_of_text_that_is_not_hlo_is_an_error():
    with pytest.raises(ValueError, match="not an HLO module"):
        step_breakdown.module_name("hello")
