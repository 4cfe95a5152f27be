#!/usr/bin/env bash
# The third fp8 call of 2026-11-26: the GEMMs now write bf16 (benchmarks/sweeps/fp8_autotune.sh:
# the f32 results made the 5B fp8 step run out of memory, the remat policy saving them per
# layer), all at XLA autotune level 2 (level 4, the default, spends ~25 s on each fp8 GEMM).
# The 5B step in fp8 (its bf16 twin, same level, same machine: 997.1 ms), then the projection.
set -u
OUT=${OUT:-runs/fp8_step}
mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 PYTHONUNBUFFERED=1 XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=2"
PY=${PY:-python3}
source "$(dirname "$0")/run_logged.sh"
B5="--exp gpt3_xl --model.model-dims 4096 --model.hidden-dims 16384 --model.num-heads 32 --data.train.batch-size 8"
run b5_fp8 200 $PY -m benchmarks.mfu $B5 --model.block.fp8 --steps 6 --warmup 2 --no-reference
run matmul 100 $PY -m benchmarks.fp8_matmul --steps 10
