"""Quantization on the default shakespeare_char (docs/quantize.md): sizes, eval losses, decode speed and memory.

    python -m benchmarks.quantization [--root /tmp/q] [--steps 2000]

1. trains the float model (`--exp shakespeare_char`, its full 2,000 steps) and the same with
   int8 quantization-aware training (`--quantization fake_quant`), unless ROOT holds them;
2. quantizes the float job dir to int8 and int4, and the QAT one to int8 (`pax_eqx.quantize`);
3. prints each checkpoint's bytes against the float32 parameters' bytes (the issue's bounds:
   <= 0.3x for int8, <= 0.17x for int4), each job dir's eval loss (`pax_eqx.eval`), and, for the
   float and int8 models, decode tokens/s on this host's devices and the decode program's
   compiled memory (XLA's memory_analysis: arguments, i.e. the weights, and temporaries).

Every number comes from the CLIs a user runs, except decode's, which times the model's own
`continue_prompts` after a warm-up (the decode CLI's time is mostly compile and startup).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

PY = sys.executable


def _run(*args: str) -> str:
    out = subprocess.run([PY, "-m", *args], check=True, capture_output=True, text=True)
    return out.stdout


def _trained(job_dir: Path, steps: int) -> bool:
    metrics = job_dir / "metrics.jsonl"
    return metrics.is_file() and any(f'"step": {steps},' in line for line in metrics.read_text().splitlines())


def _eval_loss(job_dir: Path) -> float:
    line = _run("pax_eqx.eval", "--job-log-dir", str(job_dir)).strip().splitlines()[-1]
    return float(json.loads(line)["log_pplx"])


def _decode_numbers(job_dir: Path, new_tokens: int = 256, batch: int = 8) -> dict[str, float]:
    """tokens/s of `batch` continuations of `new_tokens` (warm), and the compiled decode program's memory."""
    import jax

    from pax_eqx.models.sampler import draw_tokens
    from pax_eqx.programs.restore import restore_for_inference

    rt, state, _ = restore_for_inference(rt_exp(job_dir), str(job_dir), "decode", log=lambda _: None)
    model = rt.programs.task.model(rt.programs.task.inference_params(state))
    prompt = rt.tokenizer.encode("ROMEO:")
    cfg = rt.exp.decode.replace(max_new_tokens=new_tokens, eos_id=-1)
    prompts = [prompt] * batch
    key = jax.random.PRNGKey(0)
    model.continue_prompts(prompts, cfg, key, rt.tokenizer.pad_id)  # compile
    start = time.perf_counter()
    outs = model.continue_prompts(prompts, cfg, key, rt.tokenizer.pad_id)
    seconds = time.perf_counter() - start
    tokens = sum(len(o) for o in outs)

    # The compiled program of one cache's worth of steps (sampling slides past max_seq_len by
    # re-prefilling; the incremental decoder's cache is max_seq_len long).
    steps = min(new_tokens, rt.exp.model.max_seq_len - len(prompt))
    decoder = model.incremental_decoder(prompts, steps, rt.tokenizer.pad_id, length=len(prompt))
    lowered = draw_tokens.lower(decoder, cfg.strategy.draw(cfg.eos_id), key, rt.tokenizer.pad_id, steps)
    memory = lowered.lowered.compile().memory_analysis()  # equinox wraps jax's Lowered
    return {
        "tokens_per_s": tokens / seconds,
        "argument_bytes": int(memory.argument_size_in_bytes),
        "temp_bytes": int(memory.temp_size_in_bytes),
    }


def rt_exp(job_dir: Path):
    from pax_eqx.experiment import ExperimentConfig

    return ExperimentConfig.from_dict(json.loads((job_dir / "config.json").read_text()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/tmp/q")
    parser.add_argument("--steps", type=int, default=2000)
    ns = parser.parse_args()
    root = Path(ns.root)
    from pax_eqx.programs.materialize import directory_bytes, float32_bytes

    runs = {"float": (), "qat": ("--quantization", "fake_quant", "--quantization.weight-bits", "8")}
    for name, extra in runs.items():
        job = root / name
        if not _trained(job, ns.steps):
            start = time.perf_counter()
            _run("pax_eqx.train", "--exp", "shakespeare_char", "--job-log-dir", str(job),
                 "--train.num-steps", str(ns.steps), "--train.no-sample-at-end", *extra)  # fmt: skip
            print(f"trained {name}: {time.perf_counter() - start:.0f} s", flush=True)
    quantized = {"int8": ("float", "8"), "int4": ("float", "4"), "qat_int8": ("qat", "8")}
    for name, (source, bits) in quantized.items():
        if not (root / name / "checkpoints").is_dir():
            _run("pax_eqx.quantize", "--job-log-dir", str(root / source), "--out", str(root / name), "--bits", bits)
    import jax

    from pax_eqx.checkpoint import Checkpointer

    exp = rt_exp(root / "float")
    ckpt = Checkpointer(root / "float" / "checkpoints", exp.checkpoint, read_only=True)
    step = ckpt.latest_step()
    ckpt.close()
    from pax_eqx.programs.compiled import Programs
    from pax_eqx.programs.runtime import build_task
    from pax_eqx.sharding.mesh import build_mesh

    programs = Programs(build_task(exp), build_mesh(exp.mesh), exp.mesh.rules)
    f32 = float32_bytes(programs.abstract_state.params)
    float_ckpt = directory_bytes(root / "float" / "checkpoints" / str(step))
    print(f"float32 parameters: {f32:,} bytes; float checkpoint (with Adam's state): {float_ckpt:,} bytes")
    for name in quantized:
        size = directory_bytes(root / name / "checkpoints")
        print(f"{name:9s} checkpoint: {size:,} bytes = {size / f32:.3f}x the float32 parameters")
    losses = {name: _eval_loss(root / name) for name in ("float", "int8", "int4", "qat", "qat_int8")}
    for name, loss in losses.items():
        print(f"{name:9s} eval log_pplx {loss:.4f} ({100 * (loss / losses['float'] - 1):+.2f}% vs float)")
    for name in ("float", "int8", "int4"):
        d = _decode_numbers(root / name)
        print(
            f"{name:9s} decode ({jax.default_backend()}): {d['tokens_per_s']:.0f} tokens/s; compiled: arguments "
            f"{d['argument_bytes']:,} bytes, temporaries {d['temp_bytes']:,} bytes",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
