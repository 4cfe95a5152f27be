"""`python -m benchmarks.input [--part all|corpus|images] [--docs N] [--workers 0 1 2]
[--beam-workers 1 2] [--seconds S] [--mfu 0.552] [--gpus-per-host 8] [--vocab-size 4000]
[--images 256] [--resnet50-images-per-s 5538]`

Is the input pipeline ever the bottleneck? Three numbers, measured on this machine:

1. Preparation (`python -m pax_eqx.prepare_data`'s Beam pipeline, DirectRunner): documents/s
   of a C4-shaped corpus (the committed fixture's pages, repeated to --docs documents in 8
   .json.gz files) tokenized with SentencePiece, for each --beam-workers count: whole runs
   including Beam's start-up, and the marginal rate without it, (docs - docs / 10) / (wall -
   wall of a run on docs / 10), per worker too.
2. Loading (`--data.source array_record`, what training reads): tokens/s of gpt3_xl's training
   input (documents packed into 16 x 2048 rows at read time), in this process (one core) and
   with N grain worker processes (`data.train.num_workers`).
3. Consumption: the tokens/s gpt3_xl's train step eats on one H100 at the given MFU (55.2%,
   the best measured, docs/performance.md), from PaLM's FLOPs per token of its real parameter
   count (benchmarks/flops.py), times --gpus-per-host. Cores per host = that / the tokens/s of
   one core (2, in this process).
4. Images (`--data.source imagenet_folder`, imagenet_resnet50's training input): images/s of
   JPEGs decoded, Inception-cropped to 224, flipped and normalised, in this process (one core)
   and with N grain workers, beside what ResNet-50 eats: --resnet50-images-per-s per H100 (the
   measured 5,538, bf16, batch 256, docs/performance.md) times --gpus-per-host. The JPEGs are
   --images files of ImageNet's typical 500 x 375, smooth random content plus noise at quality
   90 (about ImageNet's ~110 KB a file), written here with Pillow.

Prints a table and, last, one JSON object with every number.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from benchmarks import flops

ROOT = Path(__file__).resolve().parents[1]
C4_SMALL = ROOT / "tests" / "fixtures" / "c4_small"
H100 = "H100"


def write_corpus(directory: Path, num_docs: int, num_files: int = 8) -> int:
    """C4-shaped .json.gz files of `num_docs` pages (the fixture's, repeated, each numbered)."""
    pages = []
    for path in sorted(C4_SMALL.glob("c4-*.json.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            pages += [json.loads(line)["text"] for line in f if line.strip()]
    directory.mkdir(parents=True, exist_ok=True)
    per_file = math.ceil(num_docs / num_files)
    for k in range(num_files):
        lines = [
            json.dumps({"text": f"{i}. {pages[i % len(pages)]}", "url": f"https://example.org/{i}"})
            for i in range(k * per_file, min((k + 1) * per_file, num_docs))
        ]
        (directory / f"c4-train.{k:05d}-of-{num_files:05d}.json.gz").write_bytes(
            gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)
        )
    return num_docs


def prepare_throughput(corpus: Path, out: Path, workers: int, tokenizer) -> dict[str, Any]:
    """One whole preparation (fresh output directory) with `workers` DirectRunner processes."""
    from pax_eqx.data.prepare import pipeline
    from pax_eqx.data.prepare.config import PrepareConfig

    cfg = PrepareConfig(input=str(corpus), output_dir=str(out), tokenizer=tokenizer, num_shards=16, num_workers=workers)
    start = time.perf_counter()
    manifest = pipeline.prepare(cfg)
    wall = time.perf_counter() - start
    docs = manifest.num_documents
    return {
        "beam_workers": workers,
        "documents": docs,
        "tokens": manifest.num_tokens,
        "wall_s": wall,
        "documents_per_s": docs / wall,
        "documents_per_s_per_worker": docs / wall / workers,
    }


def loader_throughput(prepared: Path, workers: int, seconds: float, vocab_size: int) -> dict[str, Any]:
    """gpt3_xl's training input on the prepared corpus: tokens/s over about `seconds`."""
    from pax_eqx.command_line import registry
    from pax_eqx.data import ArrayRecordSource, build_input, build_tokenizer
    from pax_eqx.data.tokenizers import SentencePieceConfig

    exp = registry.load_experiment("gpt3_xl")
    train = exp.data.train.replace(num_infeed_hosts=1, infeed_host_index=0, num_workers=workers)
    data = exp.data.replace(
        source=ArrayRecordSource(path=str(prepared)), tokenizer=SentencePieceConfig(vocab_size=vocab_size), train=train
    )
    data.validate()
    batches, wall, batch = _read_for(build_input(data, "train", build_tokenizer(data)), seconds)
    tokens = batches * batch["ids"].size
    shape = batch["ids"].shape
    return {"grain_workers": workers, "batches": batches, "tokens_per_s": tokens / wall, "batch_shape": shape}


def _read_for(inp: Any, seconds: float) -> tuple[int, float, dict[str, Any]]:
    """(batches read, their wall time, the last batch): `inp` read for `seconds` after two warm-up
    batches (its workers started, their buffers filled), then closed."""
    for _ in range(2):
        inp.get_next()
    batches, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        batch = inp.get_next()
        batches += 1
    wall = time.perf_counter() - start
    inp.close()
    return batches, wall, batch


def write_jpegs(root: Path, num: int, classes: int = 4) -> None:
    """`num` 500 x 375 JPEGs in root/train/<class>/ (module doc): a coarse random image
    upsampled (smooth regions and edges, as photos have) plus pixel noise, quality 90."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(num):
        folder = root / "train" / f"n{i % classes:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        coarse = Image.fromarray(rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)).resize((500, 375), Image.BICUBIC)
        pixels = np.asarray(coarse, np.int16) + rng.integers(-12, 13, (375, 500, 3))
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(folder / f"{i:06d}.JPEG", quality=90)


def image_loader_throughput(root: Path, workers: int, seconds: float) -> dict[str, Any]:
    """imagenet_resnet50's training input (batch 64) on the JPEGs at `root`: images/s."""
    from pax_eqx.command_line import registry
    from pax_eqx.data import build_input
    from pax_eqx.data.tokenizers import ByteTokenizer

    exp = registry.load_experiment("imagenet_resnet50")
    train = exp.data.train.replace(batch_size=64, num_infeed_hosts=1, infeed_host_index=0, num_workers=workers)
    data = exp.data.replace(source=exp.data.source.replace(path=str(root)), train=train)
    data.validate()
    batches, wall, batch = _read_for(build_input(data, "train", ByteTokenizer()), seconds)
    shape = batch["inputs"].shape
    return {"grain_workers": workers, "batches": batches, "images_per_s": batches * shape[0] / wall,
            "batch_shape": shape}  # fmt: skip


def gpt3_xl_consumption(mfu: float, gpus_per_host: int) -> dict[str, Any]:
    """Tokens/s of gpt3_xl's train step on one H100 at `mfu`, from its real parameter count."""
    from pax_eqx.command_line import registry
    from pax_eqx.programs.runtime import build_task

    exp = registry.load_experiment("gpt3_xl")
    params = jax.eval_shape(build_task(exp).init_state, jax.random.PRNGKey(0)).params
    num_params = sum(leaf.size for leaf in jax.tree.leaves(params))
    m = exp.model
    per_token = flops.model_flops_per_token(num_params, m.num_layers, m.model_dims, exp.data.seq_len)
    peak = flops.peak_tflops(H100) * 1e12
    per_gpu = mfu * peak / per_token
    tokens_per_step = exp.data.train.batch_size * exp.data.seq_len
    return {
        "params": int(num_params),
        "flops_per_token": per_token,
        "mfu": mfu,
        "tokens_per_s_per_gpu": per_gpu,
        "step_s": tokens_per_step / per_gpu,
        "gpus_per_host": gpus_per_host,
        "tokens_per_s_per_host": per_gpu * gpus_per_host,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.input", description=__doc__.split("\n\n")[1])
    parser.add_argument("--docs", type=int, default=20_000, help="documents in the corpus (default 20000)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2], help="grain worker counts to time")
    parser.add_argument("--beam-workers", type=int, nargs="+", default=[1, 2], help="DirectRunner process counts")
    parser.add_argument("--seconds", type=float, default=10.0, help="time each loader this long (default 10)")
    parser.add_argument(
        "--mfu", type=float, default=0.552, help="gpt3_xl's MFU on one H100 (default: the best measured, 55.2%%)"
    )
    parser.add_argument("--gpus-per-host", type=int, default=8)
    parser.add_argument("--vocab-size", type=int, default=4000, help="SentencePiece vocabulary of the corpus")
    parser.add_argument("--part", choices=("all", "corpus", "images"), default="all", help="what to measure")
    parser.add_argument("--images", type=int, default=256, help="JPEG files for the image loader (default 256)")
    parser.add_argument("--resnet50-images-per-s", type=float, default=5538.0, help="ResNet-50 on one H100")
    args = parser.parse_args(argv)
    if args.part == "images":
        return images_main(args)

    from pax_eqx.data.tokenizers import SentencePieceConfig

    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_corpus(root / "corpus", args.docs)
        write_corpus(root / "small", args.docs // 10)
        spm = SentencePieceConfig(vocab_size=args.vocab_size, max_training_chars=2_000_000)
        prep = []
        for w in args.beam_workers:
            log(f"preparing {args.docs} (and {args.docs // 10}) documents with {w} Beam worker(s) ...")
            big = prepare_throughput(root / "corpus", root / f"prepared{w}", w, spm)
            if not spm.model_path:  # later runs reuse the first run's model (timing tokenizing, not training)
                spm = spm.replace(model_path=str(root / f"prepared{w}" / "tokenizer" / "spm.model"))
            small = prepare_throughput(root / "small", root / f"small{w}", w, spm)
            marginal = (big["documents"] - small["documents"]) / max(big["wall_s"] - small["wall_s"], 1e-9)
            prep.append(big | {"small_wall_s": small["wall_s"], "marginal_documents_per_s": marginal,
                               "marginal_documents_per_s_per_worker": marginal / w})  # fmt: skip
        prepared = root / f"prepared{args.beam_workers[0]}"
        load = []
        for w in args.workers:
            log(f"loading gpt3_xl batches with {w} grain worker(s) for {args.seconds:.0f} s ...")
            load.append(loader_throughput(prepared, w, args.seconds, args.vocab_size))
    need = gpt3_xl_consumption(args.mfu, args.gpus_per_host)
    per_core = next((r["tokens_per_s"] for r in load if r["grain_workers"] == 0), load[0]["tokens_per_s"])
    cores = math.ceil(need["tokens_per_s_per_host"] / per_core)

    cpu = f"{os.cpu_count()} CPU cores"
    print(f"Input pipeline throughput on this machine ({cpu}), C4-shaped corpus, SentencePiece {args.vocab_size}")
    print("\nPreparation (Beam DirectRunner, whole runs incl. start-up):")
    print("| Beam workers | documents | tokens | wall | documents/s | wall on 1/10 | marginal docs/s (per worker) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in prep:
        print(
            f"| {r['beam_workers']} | {r['documents']:,} | {r['tokens']:,} | {r['wall_s']:.1f} s | "
            f"{r['documents_per_s']:,.0f} | {r['small_wall_s']:.1f} s | {r['marginal_documents_per_s']:,.0f} "
            f"({r['marginal_documents_per_s_per_worker']:,.0f}) |"
        )
    print("\nLoading gpt3_xl's training input (array_record, packed 16 x 2048 at read time):")
    _print_loading(load, "tokens")
    print(
        f"\ngpt3_xl on one H100 at {need['mfu']:.1%} MFU: {need['params']:,} parameters, "
        f"{need['flops_per_token'] / 1e9:.2f} GFLOP/token, {need['step_s'] * 1e3:.0f} ms/step, "
        f"{need['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, "
        f"{need['tokens_per_s_per_host']:,.0f} tokens/s per host of {need['gpus_per_host']}."
    )
    print(
        f"Cores per host so the loader is never the bottleneck: {cores} "
        f"({need['tokens_per_s_per_host']:,.0f} / {per_core:,.0f} tokens/s per core)."
    )
    result = {"preparation": prep, "loading": load, "gpt3_xl": need, "cores_per_host": cores}
    if args.part == "all":
        print()
        result["images"] = images_main(args, print_json=False)
    print(json.dumps(result, default=str))
    return 0


def _print_loading(rows: list[dict[str, Any]], unit: str) -> None:
    """The loading table: one row per grain worker count, `unit`s (tokens, images) a second."""
    print(f"| grain workers | batches | {unit}/s |")
    print("|---:|---:|---:|")
    for r in rows:
        label = "0 (in this process)" if r["grain_workers"] == 0 else str(r["grain_workers"])
        print(f"| {label} | {r['batches']} | {r[unit + '_per_s']:,.0f} |")


def images_main(args: argparse.Namespace, print_json: bool = True):
    """Part 4 (module doc): prints its table; returns 0 after printing its JSON, or its numbers."""
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        log(f"writing {args.images} JPEGs of 500 x 375 ...")
        write_jpegs(Path(tmp), args.images)
        size = sum(f.stat().st_size for f in Path(tmp).rglob("*.JPEG")) / args.images
        load = []
        for w in args.workers:
            log(f"loading imagenet_resnet50 batches with {w} grain worker(s) for {args.seconds:.0f} s ...")
            load.append(image_loader_throughput(Path(tmp), w, args.seconds))
    per_core = next((r["images_per_s"] for r in load if r["grain_workers"] == 0), load[0]["images_per_s"])
    need = args.resnet50_images_per_s * args.gpus_per_host
    cores = math.ceil(need / per_core)
    print(f"ImageNet JPEGs ({args.images} files of 500 x 375, {size / 1e3:.0f} KB each) on {os.cpu_count()} CPU cores:")
    print("decoded, Inception-cropped to 224 x 224, flipped, normalised (imagenet_resnet50's training input, batch 64)")
    _print_loading(load, "images")
    print(
        f"ResNet-50 eats {args.resnet50_images_per_s:,.0f} images/s per H100, {need:,.0f} per host of "
        f"{args.gpus_per_host}. Cores per host so the loader is never the bottleneck: {cores} ({need:,.0f} / "
        f"{per_core:,.0f} images/s per core)."
    )
    result = {"jpeg_bytes": size, "loading": load, "images_per_s_per_host": need, "cores_per_host": cores}
    if not print_json:
        return result
    print(json.dumps({"images": result}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
