"""Peak host memory of `python -m pax_eqx.import_hf` against the model's bytes.

    python -m benchmarks.hf_import_memory --layers 2            # ~1 GB float32 Llama-shaped model
    python -m benchmarks.hf_import_memory --layers 12 --optimizer adam

Writes a synthetic Llama checkpoint (width 2048, feed-forward 5504, 16 heads, vocabulary 32000,
untied embeddings, float32, one safetensors shard per layer and an index) into a temporary
directory, then imports it in a child process on one CPU device, whose every buffer is host
memory, and prints the child's peak resident memory beside:

    params      the model's bytes (float32, what the job dir holds)
    opt state   the fresh optimizer state saved with them (Adam: 2 x params; plain SGD: none)
    largest     the largest tensor of the checkpoint (the embedding here)
    baseline    the same import of the tiny fixture model (the runtime, the compiled init,
                orbax): the fixed overhead

and `extra = peak - baseline - params - opt state`, what the import holds beyond the state it
writes. The streaming load keeps `extra` under one largest tensor (a stacked [num_layers, ...]
parameter is filled a layer at a time in place); a loader that read the whole checkpoint first
would add another `params`. The whole import adds orbax's save, which copies the state to host
memory before writing it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hf" / "llama"
D, FF, HEADS, VOCAB = 2048, 5504, 16, 32000
# VmHWM, the high-water mark of this process's own memory (ru_maxrss would start at the parent's
# peak: Linux copies it into a forked child and keeps it across exec).
_PEAK = (
    "atexit.register(lambda: print('PEAK_RSS_KB', next(int(l.split()[1]) for l in open('/proc/self/status') "
    "if l.startswith('VmHWM')), flush=True))\n"
)
# The whole command (its orbax save included).
_IMPORT = (
    "import atexit, runpy, sys\n" + _PEAK + "sys.argv = ['import_hf'] + sys.argv[1:]\n"
    "runpy.run_module('pax_eqx.import_hf', run_name='__main__')\n"
)
# The streaming load alone: the experiment's programs, then every parameter into its sharding.
_LOAD = (
    "import atexit, sys\n" + _PEAK + "import jax\n"
    "from pax_eqx.command_line import cli\n"
    "from pax_eqx.hf.importer import HfSource\n"
    "from pax_eqx.programs.compiled import Programs\n"
    "from pax_eqx.programs.runtime import build_task\n"
    "from pax_eqx.sharding.mesh import build_mesh\n"
    "source = HfSource.open(sys.argv[1])\n"
    "exp = cli.parse_fields(source.experiment(sys.argv[3], 1), sys.argv[4:], 'load')\n"
    "programs = Programs(build_task(exp), build_mesh(exp.mesh), exp.mesh.rules)\n"
    "jax.block_until_ready(source.load_params(programs.abstract_state.params, programs.state_shardings.params, "
    "exp.model))\n"
)


def write_checkpoint(out: Path, layers: int, seed: int = 0) -> dict:
    """A Llama checkpoint of random float32 weights, one shard per layer (at most one layer's
    tensors in this process at a time); returns {params, largest} in bytes."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    rand = lambda *shape: rng.standard_normal(shape, dtype=np.float32) * 0.02
    cfg = json.loads((FIXTURE / "config.json").read_text())
    cfg.update(vocab_size=VOCAB, hidden_size=D, intermediate_size=FF, num_hidden_layers=layers,
               num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=D // HEADS,
               max_position_embeddings=2048)  # fmt: skip
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(cfg))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(FIXTURE / name, out / name)
    weight_map, total = {}, 0

    def shards():
        yield {"model.embed_tokens.weight": rand(VOCAB, D)}
        for i in range(layers):
            p = f"model.layers.{i}."
            yield {
                p + "input_layernorm.weight": np.ones(D, np.float32),
                p + "post_attention_layernorm.weight": np.ones(D, np.float32),
                **{p + f"self_attn.{k}_proj.weight": rand(D, D) for k in "qkvo"},
                p + "mlp.gate_proj.weight": rand(FF, D),
                p + "mlp.up_proj.weight": rand(FF, D),
                p + "mlp.down_proj.weight": rand(D, FF),
            }
        yield {"model.norm.weight": np.ones(D, np.float32), "lm_head.weight": rand(VOCAB, D)}

    n = layers + 2
    for k, shard in enumerate(shards()):  # one shard in memory at a time
        file = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        save_file(shard, str(out / file))
        weight_map.update({name: file for name in shard})
        total += sum(a.nbytes for a in shard.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    largest = max(VOCAB * D, FF * D) * 4  # the embedding
    return {"params": total, "largest": largest}


def peak_rss(src: Path, job: Path, optimizer: str, child: str) -> int:
    """A child's peak resident memory in bytes (one CPU device): `_IMPORT` or `_LOAD`."""
    flags = ["--learner.optimizer", "sgd", "--learner.optimizer.momentum", "0"] if optimizer == "sgd" else []
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", child, str(src), "--job-log-dir", str(job), *flags],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if out.returncode:
        raise SystemExit(f"import failed:\n{out.stdout}\n{out.stderr}")
    line = next(line for line in out.stdout.splitlines() if line.startswith("PEAK_RSS_KB"))
    return int(line.split()[1]) * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=2, help="transformer layers (2: ~1 GB; 12: ~3 GB)")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd", help="sgd: plain SGD (no state)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hf_import_memory_") as tmp:
        tmp = Path(tmp)
        sizes = write_checkpoint(tmp / "src", args.layers)
        peaks = {}
        for what, child in (("load", _LOAD), ("import", _IMPORT)):
            baseline = peak_rss(FIXTURE, tmp / f"tiny_{what}", args.optimizer, child)
            peaks[what] = (peak_rss(tmp / "src", tmp / f"job_{what}", args.optimizer, child), baseline)
    opt = 2 * sizes["params"] if args.optimizer == "adam" else 0
    mb = lambda b: f"{b / 2**20:,.0f} MiB"
    print(f"layers={args.layers} optimizer={args.optimizer}")
    print(f"  params {mb(sizes['params'])}  opt state {mb(opt)}  largest tensor {mb(sizes['largest'])}")
    for what, (peak, baseline) in peaks.items():
        state = sizes["params"] + (opt if what == "import" else 0)
        extra = peak - baseline - state
        less = "params - opt state" if what == "import" else "params"
        print(
            f"  {what:6s} peak RSS {mb(peak)}  baseline (tiny model) {mb(baseline)}  extra = peak - baseline - {less} "
            f"= {mb(extra)} ({extra / sizes['largest']:.2f} x largest)"
        )


if __name__ == "__main__":
    main()
