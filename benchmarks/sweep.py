"""`python -m benchmarks.sweep --variants FILE --out RESULTS.jsonl [--budget-s S] [mfu flags]`: MFU runs, one table.

A GPU lease is short and its machine forgets everything, so the levers of docs/performance.md
are measured as one list: FILE has one `benchmarks.mfu` command line per line, optionally led
by environment assignments (`#` starts a comment):

    --exp gpt3_xl --data.train.batch-size 8
    XLA_FLAGS=--xla_gpu_enable_cublaslt=true --exp gpt3_xl

Each line runs as its own process (GPU memory and XLA flags start fresh; an out-of-memory
variant fails alone) and its JSON result, or its error, is appended to RESULTS.jsonl as soon as
it ends. Lines already in RESULTS.jsonl (run with the same benchmarks.mfu flags) are skipped,
except those that timed out, so a sweep cut off by `--budget-s` (no new variant starts once the
slowest one so far would not fit, and none runs past it) or by the lease continues where it
stopped when run again with the same file. It ends with a markdown table of every result in
RESULTS.jsonl, the rows docs/performance.md and the closing notes quote.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

TIMED_OUT = "timed out after"  # not a result of the variant: run again on the next sweep


def read_variants(path: Path) -> list[str]:
    """The file's command lines, comments and blank lines dropped, whitespace normalised."""
    lines = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            lines.append(shlex.join(shlex.split(line)))  # quotes kept: XLA_FLAGS='--a --b' stays one word
    return lines


def split_env(variant: str) -> tuple[dict[str, str], list[str]]:
    """'XLA_FLAGS=-x --exp a' -> ({'XLA_FLAGS': '-x'}, ['--exp', 'a']): leading NAME=VALUE words are env."""
    words = shlex.split(variant)
    env = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


def load_results(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    results = []
    for line in path.read_text().splitlines():
        try:
            results.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line torn by a kill mid-write: that variant runs again
    return results


def last_json_object(stdout: str) -> dict[str, Any] | None:
    """The last line of `stdout` that is a JSON object (mfu prints its result last, but a library
    may log after it)."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None


def run_variant(variant: str, mfu_flags: list[str], timeout_s: float) -> dict[str, Any]:
    """One `python -m benchmarks.mfu` process; its JSON result, or {"error": ...}."""
    env, args = split_env(variant)
    command = [sys.executable, "-m", "benchmarks.mfu", *args, *mfu_flags]
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout_s,
            cwd=Path(__file__).resolve().parents[1],
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"variant": variant, "mfu_flags": mfu_flags, "error": TIMED_OUT + f" {timeout_s:.0f} s",
                "wall_s": timeout_s}  # fmt: skip
    wall = time.perf_counter() - start
    result = last_json_object(done.stdout) if done.returncode == 0 else None
    if result is not None:
        return {"variant": variant, "mfu_flags": mfu_flags, **result, "wall_s": wall}
    errors = [line for line in done.stderr.strip().splitlines() if line.strip()]
    reason = next((line for line in reversed(errors) if "error" in line.lower()), errors[-1] if errors else "")
    if done.returncode == 0:
        reason = "no JSON result on stdout"
    return {"variant": variant, "mfu_flags": mfu_flags, "error": f"exit {done.returncode}: {reason[:300]}",
            "wall_s": wall}  # fmt: skip


def table(results: list[dict[str, Any]]) -> str:
    """The markdown table of docs/performance.md, one row per result."""
    head = (
        "| variant | tokens/step | step | tokens/s | MFU | HFU | reference step | ratio | peak mem | temp mem "
        "| compile |"
    )
    columns = head.count("|") - 1
    rows = [head, "|" + "---|" * columns]
    pct = lambda x: f"{x * 100:.1f}%" if x is not None else "-"  # noqa: E731
    ms = lambda x: f"{x * 1e3:,.1f} ms" if x else "-"  # noqa: E731
    gb = lambda x: f"{x:.2f} GiB" if x is not None else "-"  # noqa: E731
    for r in results:
        if "error" in r:
            rows.append(f"| `{r['variant']}` | failed: {r['error']} |" + " |" * (columns - 2))
            continue
        ratio = f"{r['ratio_to_reference']:.3f}" if r.get("ratio_to_reference") else "-"
        rows.append(
            f"| `{r['variant']}` | {r['tokens_per_step']:,} | {ms(r['step_time_s'])} | {r['tokens_per_s']:,.0f} | "
            f"{pct(r['mfu'])} | {pct(r['hfu'])} | {ms(r.get('reference_step_time_s'))} | {ratio} | "
            f"{gb(r.get('peak_mem_gb'))} | {gb(r.get('temp_mem_gb'))} | {r['compile_s']:.1f} s |"
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", type=Path, required=True, help="one benchmarks.mfu command line per line")
    parser.add_argument("--out", type=Path, required=True, help="results, one JSON object per line (appended)")
    parser.add_argument("--budget-s", type=float, default=540.0, help="start no variant that would end after this")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="one variant's limit")
    parser.add_argument(
        "--confirm-best", action="store_true",
        help="with --no-reference: then run the line of highest MFU again beside the plain-JAX reference",
    )  # fmt: skip
    args, mfu_flags = parser.parse_known_args(argv)
    if not args.variants.is_file():
        print(f"error: --variants {args.variants} is not a file; pass a file of benchmarks.mfu command lines "
              "(benchmarks/sweeps/ has some).", file=sys.stderr)  # fmt: skip
        return 2
    variants = read_variants(args.variants)
    if not variants:
        print(f"error: --variants {args.variants} has no command line; add one per line.", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = {_result_key(r) for r in load_results(args.out) if not _timed_out(r)}
    todo = [v for v in variants if _key(v, mfu_flags) not in done]
    start, slowest = time.perf_counter(), 0.0
    for i, variant in enumerate(todo):
        left = args.budget_s - (time.perf_counter() - start)
        if slowest > left or left <= 0:
            print(f"budget of {args.budget_s:.0f} s spent: {len(todo) - i} variants left; run again to continue.")
            break
        print(f"[{i + 1}/{len(todo)}] {variant}", flush=True)
        result = run_variant(variant, mfu_flags, min(args.timeout_s, left))
        slowest = max(slowest, result["wall_s"])
        with args.out.open("a") as f:
            f.write(json.dumps(result) + "\n")
        print("    " + (result.get("error") or f"step {result['step_time_s'] * 1e3:,.1f} ms"), flush=True)
    wanted = {_key(v, mfu_flags) for v in variants}
    results = [r for r in load_results(args.out) if _result_key(r) in wanted]
    if args.confirm_best and "--no-reference" in mfu_flags:
        results += confirm_best(results, mfu_flags, args)
    print(table(results))
    return 0


def confirm_best(results: list[dict[str, Any]], mfu_flags: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The line of highest MFU run again with the reference beside it (the ratio and the number
    quoted come from one process), appended to the results; [] when none succeeded."""
    measured = [r for r in results if r.get("mfu") is not None]
    if not measured:
        return []
    best = max(measured, key=lambda r: r["mfu"])
    flags = [f for f in mfu_flags if f != "--no-reference"]
    done = [r for r in load_results(args.out) if _result_key(r) == _key(best["variant"], flags)]
    if done:
        return done
    print(f"[best, with the reference] {best['variant']}", flush=True)
    result = run_variant(best["variant"], flags, args.timeout_s * 2)
    with args.out.open("a") as f:
        f.write(json.dumps(result) + "\n")
    return [result]


def _key(variant: str, mfu_flags: list[str]) -> str:
    """A result stands for its line *and* the flags every line ran with (--steps, --no-reference)."""
    return shlex.join([variant, *mfu_flags])


def _result_key(result: dict[str, Any]) -> str:
    return _key(result["variant"], result.get("mfu_flags", []))


def _timed_out(result: dict[str, Any]) -> bool:
    return str(result.get("error", "")).startswith(TIMED_OUT)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
