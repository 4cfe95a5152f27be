#!/usr/bin/env bash
# Which fp8 GEMM layouts XLA:GPU compiles into FP8 GEMMs, and how fast (benchmarks.fp8_probe, one
# process per layout, each under its own time limit); then the projection's forward + backward
# (benchmarks.fp8_matmul) and, if that finished, the 5B step with `--model.block.fp8`.
# Written after 2026-11-26's lease, where the fp8 projection printed nothing within 60 s.
# Usage on the GPU machine, from the repo root: bash benchmarks/sweeps/fp8_probe.sh
LEASE=fp8_probe
. "$(dirname "$0")/lease_setup.sh"
source "$(dirname "$0")/run_logged.sh"
for form in bf16 nt nn tn qdq; do
    run "probe_$form" 40 $PY -m benchmarks.fp8_probe "$form"
done
if grep -q "(exit 124" "$OUT/probe_nt.log"; then
    XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" run probe_nt_no_autotune 40 $PY -m benchmarks.fp8_probe nt
fi
run matmul 120 $PY -m benchmarks.fp8_matmul --steps 10
if grep -q '^{"m"' "$OUT/matmul.log"; then
    B5="--exp gpt3_xl --model.model-dims 4096 --model.hidden-dims 16384 --model.num-heads 32 --data.train.batch-size 8"
    run b5_fp8 200 $PY -m benchmarks.mfu $B5 --model.block.fp8 --steps 6 --warmup 2 --no-reference
fi
