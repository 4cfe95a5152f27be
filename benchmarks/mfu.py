"""`python -m benchmarks.mfu --exp NAME [--steps N] [--warmup N] [--no-reference] [--section.field VALUE ...]`

Times the real pax_eqx train step (the same `Programs.train_step` the trainer runs: sharded,
donated, mixed precision) on synthetic tokens of the experiment's shapes -- with
`train.steps_per_loop` K > 1 as the trainer runs it, K steps per compiled call
(`Programs.train_steps`), each call's time divided by K; `--steps` then counts calls -- then a
hand-written plain-JAX GPT of the same model (`benchmarks/reference_gpt.py`, no pax_eqx
imports) in the same process on the same shapes. The reference makes the experiment's model
choices (positions, activation, norm and its bias, projection biases, scanned or listed
layers); where the experiment makes one it cannot (`reference_differences`), no ratio is
reported and the JSON's `reference_mismatch` says why. The ratio compares one step per call
on both sides. Prints a human summary and, as its last line, one JSON object:

    exp, device_kind, num_devices, params, tokens_per_step, step_time_s (median),
    tokens_per_s, model_tflops_per_s, mfu, hfu, peak_tflops, compile_s, peak_mem_gb,
    temp_mem_gb (XLA's temporary buffers of the compiled step, any backend),
    reference_step_time_s, ratio_to_reference, reference_mismatch, steps_per_loop,
    one_step_call_time_s, fp8_gemms (GEMMs with fp8 operands in the compiled step)

The `_gb` fields are GiB (2^30 bytes), as the dry-run planner prints them. MFU uses PaLM's
6N + 12·L·d·S model FLOPs per token (N = all parameters; see `benchmarks/flops.py`), HFU adds
what the remat policy recomputes. On CPU the peak is measured in the same run (the best of 5
jitted 1024x1024 float32 matmuls of this process) and `peak_source` says so.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from benchmarks import flops
from benchmarks.reference_config import ACTIVATIONS, NORMS, ReferenceConfig
from benchmarks.reference_gpt import make_train_step
from pax_eqx.command_line import cli
from pax_eqx.data.lm_examples import FIELDS, RandomTokens
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.models.language_model import LanguageModelConfig


def time_steps(step: Callable[[Any], Any], state: Any, warmup: int, steps: int) -> tuple[list[float], Any]:
    """Median-ready per-step wall times; each step is waited for (no overlap across steps)."""
    for _ in range(warmup):
        state, out = step(state)
        jax.block_until_ready(out)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        state, out = step(state)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - start)
    return times, state


def synthetic_tokens(batch: int, seq: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """`batch` rows of the data pipeline's own random tokens (`RandomTokens`), with every field
    the trainer's language-model input feeds, segment_ids and segment_pos included: the step is
    not the same without them (positions that come from the data make the rotary tables a
    computation of the step, positions the model makes from an iota are constants: +14% for
    shakespeare_char on the 2-core CPU, docs/performance.md)."""
    tokens = RandomTokens(batch, seq, vocab, seed)
    rows = [tokens[i] for i in range(batch)]
    return {k: np.stack([row[k] for row in rows]) for k in FIELDS}


def reference_differences(exp: ExperimentConfig) -> list[str]:
    """The experiment's model choices the plain-JAX reference cannot make (empty: it times the
    same model). With any, `run` reports no ratio: a reference of another model says nothing.
    Implementation choices (fused QKV, the chunked loss, the kernels) are not listed: those are
    what the ratio measures."""
    m = exp.model
    if not isinstance(m, LanguageModelConfig):
        return [f"model: {type(m).__name__} (the reference is a decoder-only language model)"]
    block, att, norm = m.block, m.block.attention, m.block.norm
    checks = [
        (m.position_embedding in ("trainable", "rotary"), f"model.position_embedding={m.position_embedding!r}"),
        (block.activation.name in ACTIVATIONS and not block.activation.gated,
         f"model.block.activation={block.activation.name!r}{' gated' if block.activation.gated else ''}"),
        (block.norm_policy == "pre", f"model.block.norm_policy={block.norm_policy!r}"),
        (norm.kind in NORMS and norm.has_scale, f"model.block.norm: {norm.kind!r}, has_scale={norm.has_scale}"),
        (m.final_norm == norm, "model.final_norm differs from model.block.norm"),
        (not m.separate_embedding, "model.separate_embedding=True (the reference ties embedding and softmax)"),
        (not m.scale_embedding_sqrt_depth, "model.scale_embedding_sqrt_depth=True"),
        (not m.softmax_bias, "model.softmax_bias=True"),
        (m.soft_cap_logits == 0 and m.label_smoothing_prob == 0, "model soft-capped logits or label smoothing"),
        (m.num_kv_heads in (0, m.num_heads), f"model.num_kv_heads={m.num_kv_heads} (grouped-query attention)"),
        (m.dim_per_head in (0, m.model_dims // m.num_heads), f"model.dim_per_head={m.dim_per_head}"),
        (m.moe_layer_interval == 0, "model.moe_layer_interval > 0 (Mixture-of-Experts layers)"),
        (not att.per_dim_scale and att.logit_cap == 0, "model.block.attention per_dim_scale or logit_cap"),
        (att.rotary_max_timescale == 10_000.0, f"attention.rotary_max_timescale={att.rotary_max_timescale}"),
        (att.causal, "model.block.attention.causal=False"),
        (att.dropout_prob == 0 and block.residual_dropout_prob == 0 and block.relu_dropout_prob == 0, "dropout"),
        (exp.learner.optimizer.kind == "adamw",
         f"learner.optimizer {exp.learner.optimizer.kind!r} (the reference: AdamW)"),
        (not block.fp8, "model.block.fp8=True (the reference's matmuls are in the activation dtype)"),
    ]  # fmt: skip
    return [what for ok, what in checks if not ok]


def reference_config(exp: ExperimentConfig, batch: int) -> ReferenceConfig:
    """The reference of the experiment's shapes, numerics, optimizer and model choices (those
    `reference_differences` does not list)."""
    m = exp.model
    block = m.block
    return ReferenceConfig(
        num_layers=m.num_layers,
        model_dims=m.model_dims,
        num_heads=m.num_heads,
        hidden_dims=m.hidden_dims,
        seq_len=exp.data.seq_len,
        vocab_size=m.vocab_size,
        batch_size=batch,
        remat_policy=m.remat_policy,
        unroll=m.unroll,
        attention_impl=m.block.attention.implementation,
        dtype=exp.train.fprop_dtype,
        use_bias=block.attention.use_bias,
        mlp_bias=block.ff_has_bias,
        position_embedding="learned" if m.position_embedding == "trainable" else m.position_embedding,
        activation=block.activation.name,
        norm=block.norm.kind,
        norm_bias=getattr(block.norm, "use_bias", False),
        scan_layers=m.repeat,
        layer_norm_epsilon=block.norm.epsilon,
        learning_rate=exp.learner.learning_rate,
        weight_decay=exp.learner.weight_decay,
        adam_b1=getattr(exp.learner.optimizer, "b1", 0.9),
        adam_b2=getattr(exp.learner.optimizer, "b2", 0.999),
        adam_eps=getattr(exp.learner.optimizer, "eps", 1e-8),
        grad_clip_norm=exp.learner.clip_grad_norm,
        num_microbatches=exp.learner.num_microbatches,
    )


def peak_memory_gb() -> float | None:
    stats = [d.memory_stats() or {} for d in jax.local_devices()]
    peaks = [s.get("peak_bytes_in_use") for s in stats if s.get("peak_bytes_in_use") is not None]
    return max(peaks) / 1024**3 if peaks else None


def synthetic_step(exp: ExperimentConfig) -> tuple[Any, Any, dict[str, jax.Array]]:
    """(programs, train state, global batch): the experiment's real train step, ready to run on
    synthetic tokens of its shapes. What every benchmark command times or traces."""
    from pax_eqx.programs.compiled import Programs
    from pax_eqx.programs.runtime import build_task
    from pax_eqx.sharding.mesh import build_mesh

    exp.validate(num_devices=jax.device_count())
    programs = Programs(build_task(exp), build_mesh(exp.mesh), exp.mesh.rules)
    state = programs.init_state(exp.train.seed)
    if isinstance(exp.model, LanguageModelConfig):
        local = synthetic_tokens(exp.data.train.batch_size, exp.data.seq_len, exp.model.vocab_size)
    else:  # another family's fields and shapes: the first batch of its own train input
        local = first_train_batch(exp)
    return programs, state, programs.global_batch(local)


def first_train_batch(exp: ExperimentConfig) -> dict[str, np.ndarray]:
    """This host's first batch of the experiment's train input, built as the trainer builds it
    (tokenizer included) in a throwaway job dir: the batch an encoder-decoder or a user's model
    takes has the fields and shapes only its input knows."""
    import tempfile
    from pathlib import Path

    from pax_eqx.programs.runtime import Runtime

    with tempfile.TemporaryDirectory() as job_dir:
        runtime = Runtime.create(exp, Path(job_dir), log=lambda *_: None)
        return next(iter(runtime.input("train")))


def reference_step(exp: ExperimentConfig) -> tuple[Callable[..., Any], Any, dict[str, jax.Array]]:
    """(jitted step, state, batch) of the plain-JAX reference on the experiment's global shapes:
    what `run` times beside pax_eqx's step and `benchmarks.step_breakdown --reference` traces."""
    batch_size = exp.data.train.batch_size * jax.process_count()
    init_fn, step = make_train_step(reference_config(exp, batch_size))
    tokens = synthetic_tokens(batch_size, exp.data.seq_len, exp.model.vocab_size)
    return step, init_fn(jax.random.key(0)), {k: tokens[k] for k in ("ids", "labels")}


def compiled_step_flops(compiled: Any) -> float:
    """Matmul + convolution FLOPs of one call of a compiled step, one device's program
    (`benchmarks.hlo_ops`)."""
    from benchmarks import hlo_ops

    return sum(op.flops * op.executions for op in hlo_ops.index_module(compiled.as_text()).values())


def fp8_gemm_lines(hlo_text: str) -> list[str]:
    """The instructions of a compiled module that are GEMMs with fp8 operands: cuBLASLt's fp8
    custom calls, Triton / cuDNN GEMM fusions and plain dots whose operands are f8 arrays."""
    found = []
    for line in hlo_text.splitlines():
        if "=" not in line:
            continue
        op = line.split("=", 1)[1]
        gemm = "dot(" in op or "cublas" in op or "gemm" in op or "matmul" in op
        # cuBLASLt's target names its fp8 form; a fusion's or dot's operands carry their types
        if gemm and ("matmul$f8" in op or ("(" in op and "f8e" in op.split("(", 1)[1])):
            found.append(line.strip())
    return found


def fp8_gemm_count(hlo_text: str) -> int:
    """How many GEMMs of the compiled step take fp8 operands (what `model.block.fp8` should give
    on Hopper). 0 with fp8 on: XLA widened the operands and ran bf16 or f32 GEMMs."""
    return len(fp8_gemm_lines(hlo_text))


def compile_and_time(programs: Any, state: Any, data: Any, warmup: int, steps: int) -> tuple[Any, float, float, Any]:
    """(compiled train step, compile seconds, median step seconds, state after timing): the real
    step compiled once ahead of time, then timed step by step (each ends when its total loss is
    on the host). What every throughput benchmark reports."""
    start = time.perf_counter()
    compiled = programs.train_step.lower(state, data).compile()
    compile_s = time.perf_counter() - start

    def step(s):
        s, outputs = compiled(s, data)
        return s, outputs.metrics["total_loss"].value

    times, state = time_steps(step, state, warmup, steps)
    return compiled, compile_s, statistics.median(times), state


def time_loop(programs: Any, state: Any, data: Any, k: int, warmup: int, calls: int) -> tuple[float, Any]:
    """(median seconds per step, state): `Programs.train_steps` on `k` copies of the batch (what
    the trainer runs with train.steps_per_loop = k), timed call by call, each divided by k."""
    stacked = jax.tree.map(lambda a: jax.numpy.stack([a] * k), data)
    loop = programs.train_steps.lower(state, stacked).compile()

    def call(s):
        s, outputs = loop(s, stacked)
        return s, outputs.metrics["total_loss"].value

    times, state = time_steps(call, state, warmup, calls)
    return statistics.median(times) / k, state


def run(exp: ExperimentConfig, steps: int, warmup: int, with_reference: bool, log=print) -> dict[str, Any]:
    batch = exp.data.train.batch_size * jax.process_count()
    seq = exp.data.seq_len
    programs, state, data = synthetic_step(exp)
    compiled, compile_s, step_time, state = compile_and_time(programs, state, data, warmup, steps)
    one_call_step_time = step_time
    k = exp.train.steps_per_loop
    if k > 1:  # what the trainer runs: k steps a call
        step_time, state = time_loop(programs, state, data, k, warmup, steps)
    memory = compiled.memory_analysis()  # XLA's plan, on every backend (peak_mem_gb is GPU-only)
    temp_gb = memory.temp_size_in_bytes / 1024**3 if memory is not None else None
    num_params = sum(x.size for x in jax.tree.leaves(state.params))
    m = exp.model
    tokens_per_step = batch * seq
    tokens_per_s = tokens_per_step / step_time
    device = jax.devices()[0]
    n_dev = jax.device_count()
    if isinstance(m, LanguageModelConfig):
        model_fpt = flops.model_flops_per_token(num_params, m.num_layers, m.model_dims, seq)
        hardware_fpt = flops.hardware_flops_per_token(
            num_params, m.num_layers, m.model_dims, seq, m.remat_policy,
            attention_impl="cudnn" if device.platform == "gpu" and m.block.attention.implementation != "xla" else "xla",
        )  # fmt: skip
    else:
        # No closed form for another family's FLOPs (an encoder-decoder's two lengths): the
        # matmul and convolution FLOPs XLA compiled for the step, so `hfu` only (mfu is None).
        model_fpt = None
        hardware_fpt = compiled_step_flops(compiled) * n_dev / tokens_per_step
    peak, peak_source, mfu_devices = flops.peak_tflops(device.device_kind), "datasheet", n_dev
    if peak is None and device.platform == "cpu":
        # Fake CPU devices share the same cores: the process-wide matmul rate is the whole peak.
        peak, mfu_devices = flops.measure_cpu_peak_tflops(), 1
        peak_source = "measured in this run: a jitted 1024x1024 float32 matmul, best of 5, whole CPU"
        load = flops.load_note()  # the step was timed just before, the peak now: one reading covers both
        if load:
            peak_source += f"; {load}"
    result = {
        "exp": exp.name,
        "device_kind": device.device_kind,
        "num_devices": n_dev,
        "params": int(num_params),
        "tokens_per_step": tokens_per_step,
        "step_time_s": step_time,
        "steps_per_loop": k,
        "one_step_call_time_s": one_call_step_time,
        "tokens_per_s": tokens_per_s,
        "model_tflops_per_s": tokens_per_s * (model_fpt or hardware_fpt) / 1e12,
        "mfu": flops.mfu(tokens_per_s, model_fpt, peak, mfu_devices) if peak and model_fpt else None,
        "flops_source": "PaLM formula" if model_fpt else "compiled HLO matmuls (hfu only)",
        "hfu": flops.mfu(tokens_per_s, hardware_fpt, peak, mfu_devices) if peak else None,
        "peak_tflops": peak,
        "peak_source": peak_source if peak else "unknown",
        "compile_s": compile_s,
        "peak_mem_gb": peak_memory_gb(),
        "temp_mem_gb": temp_gb,
        "reference_step_time_s": None,
        "ratio_to_reference": None,
        "reference_mismatch": [],
        "fp8_gemms": fp8_gemm_count(compiled.as_text()),
    }
    del state  # free the model's memory before the reference runs
    if with_reference:
        result["reference_mismatch"] = reference_differences(exp)
    if with_reference and not result["reference_mismatch"]:
        ref_step, ref_state, ref_batch = reference_step(exp)
        ref_times, _ = time_steps(lambda s: ref_step(s, ref_batch), ref_state, warmup + 1, steps)
        result["reference_step_time_s"] = statistics.median(ref_times)
        # Like for like: one step per call on both sides (the reference has no loop of steps).
        result["ratio_to_reference"] = one_call_step_time / result["reference_step_time_s"]
    _print_summary(result, log)
    return result


def _print_summary(r: dict[str, Any], log) -> None:
    log(f"{r['exp']} on {r['num_devices']} x {r['device_kind']}: {r['params'] / 1e6:,.1f}M params")
    log(f"  step {r['step_time_s'] * 1e3:,.1f} ms (median), {r['tokens_per_s']:,.0f} tokens/s, "
        f"model {flops.rate_text(r['model_tflops_per_s'])}, compile {r['compile_s']:.1f} s")  # fmt: skip
    if r["steps_per_loop"] > 1:
        log(f"  ({r['steps_per_loop']} steps per compiled call, train.steps_per_loop; one step per call: "
            f"{r['one_step_call_time_s'] * 1e3:,.1f} ms)")  # fmt: skip
    if r["mfu"] is not None:
        peak = f"peak {flops.rate_text(r['peak_tflops'])}, {r['peak_source']}"
        log(f"  MFU {r['mfu'] * 100:.1f}%  HFU {r['hfu'] * 100:.1f}%  ({peak})")
    elif r["hfu"] is not None:
        peak = f"peak {flops.rate_text(r['peak_tflops'])}, {r['peak_source']}"
        log(f"  HFU {r['hfu'] * 100:.1f}% of the compiled step's matmul FLOPs; no model-FLOPs formula for "
            f"this family, so no MFU  ({peak})")  # fmt: skip
    if r["reference_step_time_s"]:
        log(f"  plain-JAX reference {r['reference_step_time_s'] * 1e3:,.1f} ms (same model choices, one step per "
            f"call): ratio {r['ratio_to_reference']:.3f}")  # fmt: skip
    if r["reference_mismatch"]:
        log("  no ratio to the plain-JAX reference: it cannot make these model choices: "
            + "; ".join(r["reference_mismatch"]))  # fmt: skip
    if r["fp8_gemms"]:
        log(f"  {r['fp8_gemms']} fp8 GEMMs in the compiled step")
    if r["peak_mem_gb"] is not None:
        log(f"  peak memory {r['peak_mem_gb']:.2f} GiB")
    if r["temp_mem_gb"] is not None:
        log(f"  XLA temporaries of the step {r['temp_mem_gb']:.2f} GiB (activations, logits, gradients)")


def main(argv: Sequence[str] | None = None) -> int:
    exp, _, ns = cli.parse(
        argv,
        "python -m benchmarks.mfu",
        "MFU of an experiment's train step on synthetic data, against a plain-JAX reference.",
        job_dir_required=False,
        extra=[
            ("--steps", dict(type=int, default=10)),
            ("--warmup", dict(type=int, default=2)),
            ("--no-reference", dict(action="store_true")),
        ],
    )
    result = run(exp, ns.steps, ns.warmup, not ns.no_reference)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    from pax_eqx.command_line import entry

    entry.run(lambda: main(sys.argv[1:]))
