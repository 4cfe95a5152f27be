"""`python -m benchmarks.fp8_matmul [--m 16384] [--k 4096] [--n 16384] [--steps 20]`

One projection's forward and backward (y = x @ w, then dx and dw from a gradient of y), in the
activation dtype (bf16) and with `layers.fp8` (e4m3 operands, e5m2 gradient, delayed scaling),
timed in the same process: the ceiling of what `model.block.fp8` can gain on a step, without
the rest of the model. Prints the median times, their ratio, and the compiled fp8 GEMMs (none
means XLA widened the fp8 operands). Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp

from benchmarks.mfu import fp8_gemm_lines
from pax_eqx.layers.fp8 import Fp8Scales
from pax_eqx.layers.linears import dense


def _time(fn, args, steps: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _compiled(name: str, fn, *args):
    """fn compiled for args, saying how long that took (flushed: a compile that never ends
    shows as the last phase printed)."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    print(f"  {name} compiled in {time.perf_counter() - start:.1f} s", flush=True)
    return compiled


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    ap.add_argument("--m", type=int, default=16384, help="rows (batch x sequence)")
    ap.add_argument("--k", type=int, default=4096, help="input features")
    ap.add_argument("--n", type=int, default=16384, help="output features")
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    kx, kw, kg = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(kx, (a.m, a.k), jnp.bfloat16)
    w = jax.random.normal(kw, (a.k, a.n), jnp.float32) * a.k**-0.5
    g = jax.random.normal(kg, (a.m, a.n), jnp.bfloat16) * 1e-3

    def fwd_bwd(x, w, scales):
        y, vjp = jax.vjp(lambda x, w, s: dense(x, w, s), x, w, scales)
        return y, vjp(g)

    scales = Fp8Scales()
    bf16 = _compiled("bf16", lambda x, w: fwd_bwd(x, w, None), x, w)
    fp8 = _compiled("fp8", lambda x, w, s: fwd_bwd(x, w, s), x, w, scales)
    _, (_, _, scales) = fp8(x, w, scales)  # one step records the amaxes: realistic scales
    t_bf16 = _time(bf16, (x, w), a.steps)
    t_fp8 = _time(fp8, (x, w, scales), a.steps)
    hlo = fp8.as_text()
    lines = fp8_gemm_lines(hlo)
    flops = 3 * 2 * a.m * a.k * a.n
    print(f"[{a.m}, {a.k}] x [{a.k}, {a.n}], forward + backward on {jax.devices()[0].device_kind}:")
    print(f"  bf16 {t_bf16 * 1e3:.2f} ms ({flops / t_bf16 / 1e12:.0f} TF/s), fp8 {t_fp8 * 1e3:.2f} ms "
          f"({flops / t_fp8 / 1e12:.0f} TF/s): fp8 is {t_bf16 / t_fp8:.2f}x")  # fmt: skip
    print(f"  {len(lines)} fp8 GEMMs compiled" + "".join(f"\n    {line[:160]}" for line in lines[:6]))
    if not lines:  # what the GEMMs were instead
        gemms = [
            ln.strip() for ln in hlo.splitlines() if "=" in ln and any(t in ln for t in ("dot(", "gemm", "cublas"))
        ]
        print("  the GEMMs instead:" + "".join(f"\n    {line[:200]}" for line in gemms[:6]))
    print(json.dumps({"m": a.m, "k": a.k, "n": a.n, "bf16_s": t_bf16, "fp8_s": t_fp8, "speedup": t_bf16 / t_fp8,
                      "fp8_gemms": len(lines)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
