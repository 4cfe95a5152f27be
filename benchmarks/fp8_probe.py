"""`python -m benchmarks.fp8_probe FORM [--m 8192] [--k 4096] [--n 8192] [--steps 10]`

One GEMM of fp8 operands, written in one of the layouts a matmul's three GEMMs take, to find
which of them XLA:GPU compiles into an FP8 GEMM and how long that takes. FORM is the layout of
the operands (which dimension each contracts over):

    nn    a [m, k] x b [k, n]   (the forward y = x @ w as written)
    nt    a [m, k] x b [n, k]   (both contract their last dimension: cuBLASLt's native FP8 layout)
    nt16  nt with the GEMM writing bf16 (the scale applied after, in bf16) instead of float32
    tn    a [k, m] x b [k, n]   (both contract their first: the kernel gradient dw = x^T g)
    qdq   the nn product of the operands converted back to bf16 and rescaled, around a bf16 dot
          (the quantize-dequantize pattern XLA's GEMM rewriter is meant to turn into an FP8 GEMM)
    bf16  the nn product in bf16: the baseline

Run one form per process (a compile that never ends is then one timed-out process, not a lost
sweep). Prints the phases as they finish (flushed), then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp

from benchmarks.mfu import fp8_gemm_lines

FORMS = ("nn", "nt", "tn", "nt16", "qdq", "bf16")
_DIMS = {
    "nn": ((1,), (0,)),
    "nt": ((1,), (1,)),
    "tn": ((0,), (0,)),
    "nt16": ((1,), (1,)),
    "qdq": ((1,), (0,)),
    "bf16": ((1,), (0,)),
}


def _operand_shapes(form: str, m: int, k: int, n: int) -> tuple[tuple[int, int], tuple[int, int]]:
    a = (k, m) if form == "tn" else (m, k)
    b = (n, k) if form in ("nt", "nt16") else (k, n)
    return a, b


def _gemm(form: str):
    dims = (_DIMS[form], ((), ()))
    if form == "bf16":
        return lambda a, b, s: jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.bfloat16)
    if form == "nt16":
        return lambda a, b, s: (
            jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.bfloat16) * (s[0] * s[1]).astype(jnp.bfloat16)
        )
    if form == "qdq":

        def qdq(a, b, s):
            a16, b16 = (
                a.astype(jnp.bfloat16) * s[0].astype(jnp.bfloat16),
                b.astype(jnp.bfloat16) * s[1].astype(jnp.bfloat16),
            )
            return jax.lax.dot_general(a16, b16, dims, preferred_element_type=jnp.bfloat16)

        return qdq
    return lambda a, b, s: (jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32) * (s[0] * s[1])).astype(
        jnp.bfloat16
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    ap.add_argument("form", choices=FORMS)
    ap.add_argument("--m", type=int, default=8192)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    shape_a, shape_b = _operand_shapes(a.form, a.m, a.k, a.n)
    dtype = jnp.bfloat16 if a.form == "bf16" else jnp.float8_e4m3fn
    ka, kb = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(ka, shape_a, jnp.float32).astype(dtype)
    y = jax.random.normal(kb, shape_b, jnp.float32).astype(dtype)
    s = jnp.ones((2,), jnp.float32)
    fn = jax.jit(_gemm(a.form))
    start = time.perf_counter()
    compiled = fn.lower(x, y, s).compile()
    compile_s = time.perf_counter() - start
    lines = fp8_gemm_lines(compiled.as_text())
    print(f"{a.form}: compiled in {compile_s:.1f} s, {len(lines)} fp8 GEMMs", flush=True)
    for line in lines[:3]:
        print("   ", line[:200], flush=True)
    if not lines:
        gemms = [
            ln.strip() for ln in compiled.as_text().splitlines() if "=" in ln and ("dot(" in ln or "custom-call" in ln)
        ]
        for line in gemms[:3]:
            print("    instead:", line[:200], flush=True)
    start = time.perf_counter()
    jax.block_until_ready(compiled(x, y, s))
    print(f"{a.form}: first run {time.perf_counter() - start:.2f} s", flush=True)
    times = []
    for _ in range(a.steps):
        start = time.perf_counter()
        jax.block_until_ready(compiled(x, y, s))
        times.append(time.perf_counter() - start)
    t = statistics.median(times)
    tflops = 2 * a.m * a.k * a.n / t / 1e12
    print(f"{a.form}: {t * 1e3:.3f} ms, {tflops:.0f} TF/s", flush=True)
    print(json.dumps({"form": a.form, "compile_s": compile_s, "step_s": t, "tflops": tflops, "fp8_gemms": len(lines)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
