#!/usr/bin/env bash
# The second fp8 call of 2026-11-26 (third lease): benchmarks/sweeps/fp8_probe.sh found that one
# fp8 GEMM compiles in ~25 s on an H200 (bf16: 0.8 s) under XLA's default autotuning (level 4,
# which checks every candidate algorithm's result), which is why the 5B fp8 step never finished
# compiling. Here: one fp8 GEMM at autotune levels 2 (time candidates, no result check) and 0
# (cuBLASLt's heuristic pick), the GEMM writing bf16, then the projection and the 5B step in bf16
# and fp8, all at level 2 (the same for both, so the ratio is fair).
LEASE=fp8_autotune
. "$(dirname "$0")/lease_setup.sh"
BASE_FLAGS=${XLA_FLAGS:-}
source "$(dirname "$0")/run_logged.sh"
XLA_FLAGS="$BASE_FLAGS --xla_gpu_autotune_level=2" run probe_nt_level2 40 $PY -m benchmarks.fp8_probe nt
XLA_FLAGS="$BASE_FLAGS --xla_gpu_autotune_level=0" run probe_nt_level0 40 $PY -m benchmarks.fp8_probe nt
XLA_FLAGS="$BASE_FLAGS --xla_gpu_autotune_level=2" run probe_nt16_level2 40 $PY -m benchmarks.fp8_probe nt16
export XLA_FLAGS="$BASE_FLAGS --xla_gpu_autotune_level=2"
run matmul 100 $PY -m benchmarks.fp8_matmul --steps 10
B5="--exp gpt3_xl --model.model-dims 4096 --model.hidden-dims 16384 --model.num-heads 32 --data.train.batch-size 8"
run b5_fp8 170 $PY -m benchmarks.mfu $B5 --model.block.fp8 --steps 6 --warmup 2 --no-reference
run b5_bf16 110 $PY -m benchmarks.mfu $B5 --steps 6 --warmup 2 --no-reference
