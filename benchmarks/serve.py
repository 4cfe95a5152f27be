"""`python -m benchmarks.serve [--model tiny_llama | --job-log-dir DIR] [--slots 8] [--chunk 64]
[--rates 1 2 4] [--requests 64] [--repeats 1] [--policies continuous static] [--http]`

Continuous against static batching on the same model, the same compiled programs and the same
requests (`serve_workload.mixed_workload`: mostly short prompts and answers, a long tail). asyncio
clients send the requests at each rate (Poisson arrivals; `--rates` with no values: only the
offered-load row) and, first, all at once (rate "max", offered load: the headline throughput).
Greedy decoding with EOS disabled, so every request generates exactly its max_tokens and both
policies must produce the same tokens (checked: `same_tokens`).

    continuous  a request takes a slot as soon as one frees (pax_eqx.serving.engine)
    static      requests are admitted only when every slot is free: a batch runs until its
                longest request ends (the Engine's admit="static"; nothing else differs)

Per rate and policy: tokens/s (generated tokens / the wall time from the first request sent to
the last one finished; the median over `--repeats`, policies alternating), time to first token
and latency (sent -> last token) at p50 and p99 over every request of the repeats, and the requests
completed (must be all). Printed as a markdown table and a JSON line per row, then the
continuous/static ratio of the offered-load row, and a timing breakdown: one `generate` step
(every slot one token), one `prefill` chunk and `choose_rows` (the token choice inside both, on
[slots, vocab] logits), each alone, median of 20: where a step's time goes.

In-process by default: the Engine runs on its thread and each client coroutine waits on its
Completion's events (`notify` wakes the loop). `--http` serves the same Engine with the real app
(`pax_eqx.serving.http_app.make_app`, uvicorn on a free port of 127.0.0.1, in a thread of this
process) and the clients stream `/v1/completions` (server-sent events) with httpx: TTFT is the
first chunk with text, the token count is the usage the last chunk reports.

--model tiny_llama: `serve_workload.TINY_LLAMA` (hidden 256, 4 layers, 4 heads, 2 KV heads, vocab
32000, 512 positions) with pax_eqx's random weights. --job-log-dir DIR: a job dir's newest
checkpoint, e.g. the same model imported from Hugging Face so `benchmarks.hf_generate_reference`
times transformers' generate on the same weights (its docstring has the commands).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import queue
import socket
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.serve_workload import TINY_LLAMA, Job, arrival_times, mixed_workload, percentile
from pax_eqx.serving.backends import LanguageModelBackend
from pax_eqx.serving.requests import Finished, Request, Token
from pax_eqx.serving.row_sampling import choose_rows

POLICIES = ("continuous", "static")


@dataclasses.dataclass
class Outcome:
    """What one client saw of its request: times from perf_counter, the tokens it got."""

    sent: float
    first: float | None
    done: float
    tokens: int
    output: Any  # token ids (in-process) or the text (HTTP): compared across policies
    reason: str


class WordTokenizer:
    """Stands in for a tokenizer for the random `--model tiny_llama`: id i decodes as " w{i}"
    (ids 0-2 are <unk>, <s>, </s>), as `hf_generate_reference --make`'s tokenizer.json does."""

    pad_id, bos_id, eos_id = 0, 1, 2
    path = ""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.fingerprint = f"words-{vocab_size}"

    def encode(self, text: str) -> list[int]:
        return [int(w[1:]) for w in text.split()]

    def decode(self, ids: Any) -> str:
        return "".join(f" w{int(i)}" for i in ids if 3 <= int(i) < self.vocab_size)

    def unknown_characters(self, text: str) -> str:
        return ""

    def token_bytes(self) -> np.ndarray:
        return np.ones(self.vocab_size, np.int32)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    model, tokenizer, what = load_model(args.model, args.job_log_dir)
    rates: list[float | None] = [None, *args.rates]
    rows, breakdown = run_benchmark(
        model, tokenizer, requests=args.requests, slots=args.slots, chunk=args.chunk, rates=rates,
        repeats=args.repeats, policies=tuple(args.policies), http=args.http,
    )  # fmt: skip
    print_report(rows, breakdown, what=what, slots=args.slots, http=args.http)
    return 0 if all(r["completed"] == r["requests"] for r in rows) else 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serve", description=__doc__.split("\n\n")[1])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", default="tiny_llama", choices=["tiny_llama"], help="a random model (default)")
    src.add_argument("--job-log-dir", "--job_log_dir", dest="job_log_dir", metavar="DIR",
                     help="serve DIR's newest checkpoint instead")  # fmt: skip
    p.add_argument("--slots", type=int, default=8, help="requests decoded at once")
    p.add_argument("--chunk", type=int, default=64, help="prompt tokens prefilled per step")
    p.add_argument("--rates", type=float, nargs="*", default=[1, 2, 4], help="requests/s (Poisson), after max")
    p.add_argument("--requests", type=int, default=64, help="requests per run")
    p.add_argument("--repeats", type=int, default=1, help="runs per rate and policy (medians)")
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    p.add_argument("--http", action="store_true", help="through the HTTP server on loopback (SSE streaming)")
    return p


def load_model(name: str, job_dir: str | None) -> tuple[Any, Any, str]:
    """(language model, tokenizer, a description) of `--model` or `--job-log-dir`."""
    if job_dir is None:
        from pax_eqx.hf.families import model_config

        cfg, _ = model_config(dict(TINY_LLAMA))
        return cfg.build(jax.random.key(0)), WordTokenizer(cfg.vocab_size), f"{name} (random weights)"
    from pax_eqx.command_line import cli
    from pax_eqx.programs.restore import restore_for_inference

    exp, path, _ = cli.parse(["--job-log-dir", job_dir], "python -m benchmarks.serve", "", saved_experiment=True,
                             sections=("checkpoint", "mesh"))  # fmt: skip
    rt, state, step = restore_for_inference(exp, path, "serve from", log=lambda *_: None)
    task = rt.programs.task
    return task.model(task.inference_params(state)), rt.tokenizer, f"{job_dir} (step {step})"


def run_benchmark(
    model: Any, tokenizer: Any, *, requests: int, slots: int, chunk: int, rates: Sequence[float | None],
    repeats: int = 1, policies: tuple[str, ...] = POLICIES, http: bool = False, scale: float = 1.0,
    breakdown: bool = True,
) -> tuple[list[dict[str, Any]], dict[str, float]]:  # fmt: skip
    """The rows (one per rate and policy) and the timing breakdown (empty without `breakdown`);
    see the module docstring. scale shrinks the workload's lengths (a smoke test's tiny model)."""
    jobs = mixed_workload(requests, vocab_size=int(model.vocab_size), max_seq_len=int(model.max_seq_len), scale=scale)
    engine = LanguageModelBackend(model, tokenizer, slots=slots, chunk=chunk, max_waiting=max(requests, 1), eos_id=-1)
    times = _warm_up_and_time(engine, jobs, timed=breakdown)
    server = _Server(engine) if http else None
    if server is None:
        engine.start()
    rows = []
    try:
        for rate in rates:
            arrivals = arrival_times(len(jobs), rate)
            runs: dict[str, list[list[Outcome]]] = {p: [] for p in policies}
            for _ in range(repeats):
                for policy in policies:
                    engine.admit = policy  # read at every step; the engine is idle between runs
                    drive = _drive_http(server.url, jobs, arrivals) if server else _drive_engine(engine, jobs, arrivals)
                    runs[policy].append(asyncio.run(drive))
            outputs = {p: [o.output for o in runs[p][0]] for p in policies}
            same = all(outputs[p] == outputs[policies[0]] for p in policies)
            rows += [_row(policy, rate, jobs, runs[policy], same) for policy in policies]
    finally:
        if server is not None:
            server.close()
        engine.stop(drain=False)
    return rows, times


def _warm_up_and_time(engine: LanguageModelBackend, jobs: list[Job], timed: bool) -> dict[str, float]:
    """Compiles both programs (a prompt longer than a chunk, a few tokens), then, if `timed`,
    times one `generate` step, one `prefill` chunk and `choose_rows` alone (median of 20 each);
    leaves the engine empty."""
    longest = max(jobs, key=lambda j: len(j.prompt))
    engine.submit(Request(longest.prompt, max_tokens=min(4, longest.max_tokens), temperature=0.0))
    while engine.busy():
        engine.step()
    if not timed:
        return {}
    p, n = engine.programs, engine.programs.slots
    sampling = engine._row_sampling(slice(None))
    one_row = engine._row_sampling(0)
    tokens, active = jnp.full((n,), 3, jnp.int32), jnp.ones((n,), bool)
    piece = jnp.full((p.chunk,), 3, jnp.int32)

    def generate() -> Any:
        engine.state, out = p.generate(p.params, engine.state, tokens, active, sampling)
        return out

    def prefill() -> Any:
        engine.state, out = p.prefill(p.params, engine.state, jnp.int32(0), piece, jnp.int32(p.chunk), jnp.int32(0),
                                      one_row)  # fmt: skip
        return out

    logits = jax.random.normal(jax.random.key(0), (n, engine.vocab_size), jnp.float32)
    sample = jax.jit(choose_rows)
    times = {
        "generate_step_s": _median_time(generate), "prefill_chunk_s": _median_time(prefill),
        "choose_rows_s": _median_time(lambda: sample(logits, sampling)),
    }  # fmt: skip
    engine.state = p.empty()  # the timing wrote rows nobody owns; start the runs from an empty cache
    return times


def _median_time(fn: Any, n: int = 20) -> float:
    jax.block_until_ready(fn())
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def _drive_engine(engine: LanguageModelBackend, jobs: list[Job], arrivals: list[float]) -> list[Outcome]:
    """Each job sent at its arrival time to the Engine's thread; every client's outcome."""
    loop = asyncio.get_running_loop()
    start = time.perf_counter()

    async def client(job: Job, at: float) -> Outcome:
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        wake = asyncio.Event()
        sent = time.perf_counter()
        request = Request(job.prompt, max_tokens=job.max_tokens, temperature=0.0)
        completion = engine.submit(request, notify=lambda: loop.call_soon_threadsafe(wake.set))
        ids: list[int] = []
        first = None
        while True:
            await wake.wait()
            wake.clear()
            while True:
                try:
                    event = completion.events.get_nowait()
                except queue.Empty:
                    break
                if isinstance(event, Token) and event.id >= 0:
                    first = first or time.perf_counter()
                    ids.append(event.id)
                elif isinstance(event, Finished):
                    return Outcome(sent, first, time.perf_counter(), len(ids), ids, event.reason)

    return await asyncio.gather(*(client(j, a) for j, a in zip(jobs, arrivals)))


async def _drive_http(url: str, jobs: list[Job], arrivals: list[float]) -> list[Outcome]:
    """Each job POSTed to /v1/completions at its arrival time, streamed; every client's outcome."""
    import httpx

    start = time.perf_counter()
    limits = httpx.Limits(max_connections=len(jobs), max_keepalive_connections=len(jobs))
    async with httpx.AsyncClient(base_url=url, timeout=600.0, limits=limits) as http:

        async def client(job: Job, at: float) -> Outcome:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            body = {"prompt": list(job.prompt), "max_tokens": job.max_tokens, "temperature": 0.0, "stream": True,
                    "stream_options": {"include_usage": True}}  # fmt: skip
            sent, first, text, tokens, reason = time.perf_counter(), None, [], 0, "error"
            async with http.stream("POST", "/v1/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    for choice in chunk.get("choices", []):
                        if choice.get("text"):
                            first = first or time.perf_counter()
                            text.append(choice["text"])
                        reason = choice.get("finish_reason") or reason
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
            return Outcome(sent, first, time.perf_counter(), tokens, "".join(text), reason)

        return await asyncio.gather(*(client(j, a) for j, a in zip(jobs, arrivals)))


class _Server:
    """The real app over `backend`, uvicorn on a free port of 127.0.0.1 in a daemon thread."""

    def __init__(self, backend: LanguageModelBackend) -> None:
        import uvicorn

        from pax_eqx.serving.http_app import make_app

        self.backend = backend
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(make_app(backend, "bench"), log_config=None, access_log=False, lifespan="off")
        self.server = uvicorn.Server(config)
        backend.start()
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the HTTP server did not start in 30 s")
            time.sleep(0.01)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def _row(policy: str, rate: float | None, jobs: list[Job], runs: list[list[Outcome]], same: bool) -> dict[str, Any]:
    every = [o for run in runs for o in run]
    completed = sum(o.reason == "length" and o.tokens == j.max_tokens for run in runs for o, j in zip(run, jobs))
    per_run = [sum(o.tokens for o in run) / (max(o.done for o in run) - min(o.sent for o in run)) for run in runs]
    ttft = [o.first - o.sent for o in every if o.first is not None]
    latency = [o.done - o.sent for o in every]
    return {
        "policy": policy, "rate": "max" if rate is None else rate, "requests": len(jobs) * len(runs),
        "completed": int(completed), "tokens": sum(o.tokens for o in every) // len(runs),
        "expected_tokens": sum(j.max_tokens for j in jobs), "tokens_per_s": statistics.median(per_run),
        "tokens_per_s_runs": per_run, "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "latency_p50_s": percentile(latency, 50), "latency_p99_s": percentile(latency, 99), "same_tokens": same,
    }  # fmt: skip


def print_report(rows: list[dict[str, Any]], breakdown: dict[str, float], *, what: str, slots: int, http: bool) -> None:
    """The markdown table, the ratios, the breakdown, then a JSON line per row."""
    import os

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nServing {what}, {slots} slots, {'HTTP (loopback, SSE)' if http else 'in-process'}, "
          f"{jax.devices()[0].device_kind}, load average {load}\n")  # fmt: skip
    print("| rate (req/s) | policy | completed | tokens | tokens/s | TTFT p50 | TTFT p99 | latency p50 | latency p99 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['rate']} | {r['policy']} | {r['completed']}/{r['requests']} | {r['tokens']} | "
              f"{r['tokens_per_s']:.1f} | {_s(r['ttft_p50_s'])} | {_s(r['ttft_p99_s'])} | {_s(r['latency_p50_s'])} | "
              f"{_s(r['latency_p99_s'])} |")  # fmt: skip
    by = {(r["rate"], r["policy"]): r for r in rows}
    for rate in dict.fromkeys(r["rate"] for r in rows):
        if (rate, "continuous") in by and (rate, "static") in by:
            ratio = by[rate, "continuous"]["tokens_per_s"] / by[rate, "static"]["tokens_per_s"]
            same = by[rate, "continuous"]["same_tokens"]
            print(f"rate {rate}: continuous / static tokens/s = {ratio:.2f}x (same tokens: {same})")
    if not breakdown:
        return print_json(rows)
    g, pf, c = breakdown["generate_step_s"], breakdown["prefill_chunk_s"], breakdown["choose_rows_s"]
    print(f"one generate step ({slots} slots, a token each): {g * 1e3:.2f} ms = {slots / g:.0f} tokens/s at most, of "
          f"which choosing the {slots} tokens (choose_rows alone, greedy rows) {c * 1e3:.2f} ms; one "
          f"prefill chunk (one request): {pf * 1e3:.2f} ms\n")  # fmt: skip
    print_json(rows, breakdown)


def print_json(rows: list[dict[str, Any]], breakdown: dict[str, float] | None = None) -> None:
    for r in rows:
        print(json.dumps({**r, **(breakdown or {})}))


def _s(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds:.2f} s"


if __name__ == "__main__":
    sys.exit(main())
