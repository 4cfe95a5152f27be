"""`python -m benchmarks.hf_generate_reference --make DIR` | `--model-dir DIR [--slots 8]
[--requests 64] [--repeats 3] [--modes single batched]`

The Hugging Face side of the serving benchmark (`benchmarks.serve`): what `transformers`'
`model.generate` does with the same requests on the same weights, on the same machine. Runs in a
scratch environment only (torch and transformers are never a dependency of pax_eqx or its tests):

    python3 -m venv /tmp/hfenv
    /tmp/hfenv/bin/pip install torch==2.13.0 transformers safetensors
    /tmp/hfenv/bin/python -m benchmarks.hf_generate_reference --make /tmp/tiny_llama_hf
    python -m pax_eqx.import_hf /tmp/tiny_llama_hf --job-log-dir /tmp/tiny_llama_job     # pax_eqx's venv
    python -m benchmarks.serve --job-log-dir /tmp/tiny_llama_job --rates                 # pax_eqx's venv
    /tmp/hfenv/bin/python -m benchmarks.hf_generate_reference --model-dir /tmp/tiny_llama_hf

`--make DIR` writes a random `LlamaForCausalLM` of `serve_workload.TINY_LLAMA` (seed 0) with
`save_pretrained`, and a word-level tokenizer.json of exactly its vocabulary ("w3" ... ) so every
id the model can draw decodes (pax_eqx's server streams text).

`--model-dir DIR` runs `serve_workload.mixed_workload` (the same requests as `benchmarks.serve`)
through `generate`, greedy, each request exactly its max_tokens new tokens (min_new_tokens =
max_new_tokens: EOS cannot end it early), in two modes:

    single   one request at a time (batch 1, no padding)
    batched  static batches of `slots` requests in arrival order, left-padded (HF's usual
             batched generate); a batch runs max_new_tokens = its longest request's, and each
             request is credited only its own max_tokens (the rest is waste, as in a static
             server). So its tokens/s is comparable with pax_eqx's static and continuous rows.

Each mode runs `--repeats` times, alternating, after one warm-up request; prints a line per run,
a markdown table of medians, and a JSON line per mode (tokens, median seconds, tokens/s, the
seconds of each run, torch's thread count). The module imports torch only inside its functions,
so a test can import it without torch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.serve_workload import FIRST_ID, TINY_LLAMA, Job, mixed_workload


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hf_generate_reference", description=__doc__)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--make", metavar="DIR", help="write the random tiny Llama and its tokenizer to DIR")
    what.add_argument("--model-dir", metavar="DIR", help="time generate on the model DIR holds")
    parser.add_argument("--slots", type=int, default=8, help="requests per batch in the batched mode")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["single", "batched"], choices=["single", "batched"])
    args = parser.parse_args(argv)
    if args.make:
        make_model(Path(args.make))
        return 0
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).eval()
    jobs = mixed_workload(args.requests, vocab_size=model.config.vocab_size,
                          max_seq_len=model.config.max_position_embeddings)  # fmt: skip
    tokens = sum(j.max_tokens for j in jobs)
    run_jobs(model, jobs[:1], 1)  # warm-up
    seconds: dict[str, list[float]] = {m: [] for m in args.modes}
    for r in range(args.repeats):
        for mode in args.modes:
            t0 = time.perf_counter()
            run_jobs(model, jobs, 1 if mode == "single" else args.slots)
            seconds[mode].append(time.perf_counter() - t0)
            print(
                f"run {r + 1} {mode}: {seconds[mode][-1]:.2f} s, {tokens / seconds[mode][-1]:.1f} tokens/s", flush=True
            )
    print("\n| transformers generate | requests | tokens | median s | tokens/s |\n|---|---|---|---|---|")
    rows = []
    for mode, s in seconds.items():
        median = statistics.median(s)
        batch = 1 if mode == "single" else args.slots
        print(f"| {mode} (batch {batch}) | {len(jobs)} | {tokens} | {median:.2f} | {tokens / median:.1f} |")
        rows.append({"impl": "transformers", "mode": mode, "batch": batch, "requests": len(jobs), "tokens": tokens,
                     "median_s": median, "tokens_per_s": tokens / median, "runs_s": s,
                     "torch_threads": torch.get_num_threads(), "torch": torch.__version__})  # fmt: skip
    print()
    for row in rows:
        print(json.dumps(row))
    return 0


def run_jobs(model: Any, jobs: list[Job], batch: int) -> list[list[int]]:
    """Each job's new token ids, generated `batch` jobs at a time (left-padded), greedy, each
    batch to its longest job's max_tokens; a job keeps its own max_tokens of them."""
    import torch

    out = []
    with torch.inference_mode():
        for i in range(0, len(jobs), batch):
            group = jobs[i : i + batch]
            width = max(len(j.prompt) for j in group)
            new = max(j.max_tokens for j in group)
            ids = torch.zeros((len(group), width), dtype=torch.long)
            mask = torch.zeros((len(group), width), dtype=torch.long)
            for row, j in enumerate(group):
                ids[row, width - len(j.prompt) :] = torch.tensor(j.prompt)
                mask[row, width - len(j.prompt) :] = 1
            result = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                pad_token_id=0, eos_token_id=None,
            )  # fmt: skip
            out += [result[row, width : width + j.max_tokens].tolist() for row, j in enumerate(group)]
    return out


def make_model(out: Path) -> None:
    """A random LlamaForCausalLM of TINY_LLAMA (seed 0) and its word-level tokenizer, in `out`."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    fields = {k: v for k, v in TINY_LLAMA.items() if k not in ("architectures", "model_type", "torch_dtype")}
    model = LlamaForCausalLM(LlamaConfig(**fields)).eval()
    model.save_pretrained(out)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(FIRST_ID, TINY_LLAMA["vocab_size"])}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>"}, indent=1)
    )
    print(f"Wrote a random tiny Llama ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters) to {out}.")


if __name__ == "__main__":
    sys.exit(main())
