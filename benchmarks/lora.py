"""Full fine-tuning against LoRA on the same language model: memory and step time.

    python -m benchmarks.lora [--layers 8] [--dims 768] [--vocab 32000] [--batch 2] [--seq 128]
                              [--rank 8] [--targets 'stack\\.layers\\.attention\\.w_[qv]'] [--steps 5]
                              [--dropout 0.1]

For each way of training, the Task's own compiled train step (AdamW, float32 parameters, one
device) is built and timed, and this prints:

- parameter bytes (for LoRA: the frozen base plus the adapters) and the trainable part's;
- optimizer-state bytes (AdamW's two moments of what trains; the base has none under LoRA);
- XLA's compiled memory analysis of the step: arguments (the state and the batch), temporaries,
  and their sum, the step's peak (the state is donated, so the outputs reuse the arguments);
- the median wall time of `--steps` steps after one warm-up step (the compile left out).

LoRA's forward merges each chosen weight (W + alpha / r A @ B, `tasks/lora_adapters.py`), so its
temporaries hold the merged weights and their gradient: what the numbers show beside the
optimizer state it saves. A third row trains LoRA with `--dropout` (lora.dropout, 0 = no row): its
training forward applies each adapter to the layer's dropped-out input instead of merging it
(`layers/low_rank.py`), so the row shows what the masks and the unmerged adapters cost.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

from pax_eqx.experiment import ExperimentConfig
from pax_eqx.learners.lora_config import LoraConfig
from pax_eqx.models.language_model import LanguageModelConfig
from pax_eqx.programs.compiled import Programs
from pax_eqx.programs.runtime import build_task
from pax_eqx.sharding.mesh import build_mesh


def nbytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def measure(exp: ExperimentConfig, batch: dict[str, np.ndarray], steps: int) -> dict[str, float]:
    programs = Programs(build_task(exp), build_mesh(exp.mesh), exp.mesh.rules)
    abstract = programs.abstract_state
    trainable, _ = programs.task.split_optimized(abstract.params)
    state = programs.init_state(0)
    data = programs.global_batch(batch)
    memory = programs.train_step.lower(state, data).compile().memory_analysis()
    state, out = programs.train_step(state, data)  # warm-up (and the compile)
    jax.block_until_ready(out.metrics["total_loss"].value)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        state, out = programs.train_step(state, data)
        jax.block_until_ready(out.metrics["total_loss"].value)
        times.append(time.perf_counter() - start)
    return {
        "params": nbytes(abstract.params),
        "trainable": nbytes(trainable),
        "opt_state": nbytes(abstract.opt_state),
        "arguments": memory.argument_size_in_bytes,
        "temporaries": memory.temp_size_in_bytes,
        "peak": memory.argument_size_in_bytes + memory.temp_size_in_bytes,
        "step_s": statistics.median(times),
        "loss": float(out.metrics["total_loss"].value),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dims", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--targets", nargs="+", default=[r"stack\.layers\.attention\.w_[qv]"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dropout", type=float, default=0.1)
    args = parser.parse_args()
    model = LanguageModelConfig().replace(
        vocab_size=args.vocab, max_seq_len=args.seq, num_layers=args.layers, model_dims=args.dims,
        hidden_dims=4 * args.dims, num_heads=args.dims // 64, position_embedding="rotary",
    )  # fmt: skip
    full = ExperimentConfig(name="lora_benchmark", model=model)
    lora = full.replace(
        lora=LoraConfig(targets=tuple(args.targets), rank=args.rank, alpha=2.0 * args.rank, base_job_dir="(none)")
    )
    ids = np.random.default_rng(0).integers(0, args.vocab, (args.batch, args.seq + 1)).astype(np.int32)
    batch = {"ids": ids[:, :-1], "labels": ids[:, 1:], "weights": np.ones((args.batch, args.seq), np.float32)}
    device = jax.devices()[0]
    print(
        f"{args.layers} layers x {args.dims} wide, vocabulary {args.vocab}; batch {args.batch} x {args.seq} tokens; "
        f"AdamW, float32; one {device.platform} device ({device.device_kind})"
    )
    rows = {"full fine-tuning": measure(full, batch, args.steps)}
    rows[f"LoRA r={args.rank} on {' '.join(args.targets)}"] = measure(lora, batch, args.steps)
    if args.dropout > 0:
        dropped = lora.replace(lora=lora.lora.replace(dropout=args.dropout))
        rows[f"  the same, lora.dropout {args.dropout}"] = measure(dropped, batch, args.steps)
    mib, w = 2**20, max(len(name) for name in rows) + 2
    print(f"{'':<{w}}{'params':>10}{'trainable':>11}{'opt state':>11}{'arguments':>11}{'temps':>10}{'peak':>10}"
          f"{'step':>9}")  # fmt: skip
    for name, r in rows.items():
        print(
            f"{name:<{w}}{r['params'] / mib:>8.1f}Mi{r['trainable'] / mib:>9.2f}Mi{r['opt_state'] / mib:>9.2f}Mi"
            f"{r['arguments'] / mib:>9.1f}Mi{r['temporaries'] / mib:>8.1f}Mi{r['peak'] / mib:>8.1f}Mi"
            f"{r['step_s'] * 1e3:>7.0f}ms"
        )
    f, lo, *dropped = rows.values()
    print(
        f"LoRA / full: optimizer state {lo['opt_state'] / f['opt_state']:.4f}, peak {lo['peak'] / f['peak']:.2f}, "
        f"step time {lo['step_s'] / f['step_s']:.2f}"
    )
    for d in dropped:
        print(
            f"LoRA with dropout / merged LoRA: peak {d['peak'] / lo['peak']:.2f}, "
            f"step time {d['step_s'] / lo['step_s']:.2f}"
        )


if __name__ == "__main__":
    main()
