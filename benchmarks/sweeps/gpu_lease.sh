#!/usr/bin/env bash
# One short GPU lease, everything in one call (device time is counted from the machine's start):
#   1. the gpt3_xl levers of gpt3_xl_lease.txt without the reference, then the best beside it;
#   2. the other families: ResNet-50 (bf16, batch 256) beside the plain-JAX ResNet-50,
#      shakespeare_moe (MoE layers, steps_per_loop 10 vs one step a call), t5_1_1_small.
# Results land in $OUT (or runs/lease) as they finish, so a lease cut short keeps what ran.
# Usage on the GPU machine, from the repo root: bash benchmarks/sweeps/gpu_lease.sh [SWEEP_BUDGET_S]
LEASE=lease
. "$(dirname "$0")/lease_setup.sh"
budget=${1:-270}
$PY -m benchmarks.sweep --variants benchmarks/sweeps/gpt3_xl_lease.txt --out "$OUT/gpt3_xl.jsonl" \
    --budget-s "$budget" --timeout-s 150 --no-reference --confirm-best --steps 8 --warmup 2 2>&1 | tee "$OUT/gpt3_xl.md"
family() {  # NAME LIMIT_S COMMAND...: one benchmark process, its output kept whatever happens
    local name=$1 limit=$2; shift 2
    echo "== $name: $*" | tee -a "$OUT/families.txt"
    timeout "$limit" "$@" 2>&1 | tail -n 12 | tee -a "$OUT/families.txt"
}
family resnet50 120 $PY -m benchmarks.images --exp imagenet_resnet50 --mesh.ici-mesh-shape 1 1 1 --data.source synthetic_images --data.train.batch-size 256 --train.fprop-dtype bfloat16 --steps 8 --warmup 2
family shakespeare_moe 60 $PY -m benchmarks.mfu --exp shakespeare_moe --steps 8 --warmup 2
family t5_1_1_small 90 $PY -m benchmarks.mfu --exp t5_1_1_small --data.source shakespeare --data.tokenizer.vocab-size 8000 --steps 8 --warmup 2 --no-reference
