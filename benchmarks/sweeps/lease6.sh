#!/usr/bin/env bash
# The sixth GPU lease, one call (issue 57's GPU rows, in its order, as far as the time goes):
#   1. gpt3_xl: the levers of gpt3_xl_lease6.txt without the reference, then the best line again
#      beside the plain-JAX reference in the same process (--confirm-best);
#   2. NVIDIA5B (Paxml's Rosetta config, unpipelined on one GPU: 12 of its 24 layers, which the
#      dry run plans at 60 GiB of an H100's 80), bf16 then --model.block.fp8, one process each.
# int8 serving and context-parallel attention are not built yet: no rows for them.
# Results land in $OUT as each ends, so a call cut short keeps what ran.
# Usage on the GPU machine, from the repo root: bash benchmarks/sweeps/lease6.sh [SWEEP_BUDGET_S]
LEASE=lease6
. "$(dirname "$0")/lease_setup.sh"
budget=${1:-280}
$PY -m benchmarks.sweep --variants benchmarks/sweeps/gpt3_xl_lease6.txt --out "$OUT/gpt3_xl.jsonl" \
    --budget-s "$budget" --timeout-s 100 --no-reference --confirm-best --steps 6 --warmup 2 2>&1 | tee "$OUT/gpt3_xl.md"
N5B="--exp NVIDIA5B --model.pipeline.num-stages 1 --model.pipeline.num-microbatches 1 --model.pipeline.no-remat-stage
     --mesh.ici-mesh-shape 1 1 1 --model.num-layers 12 --steps 6 --warmup 2 --no-reference"
for form in bf16 fp8; do
    extra=""; [ $form = fp8 ] && extra="--model.block.fp8"
    echo "== nvidia5b_12l_$form" | tee -a "$OUT/nvidia5b.txt"
    timeout 110 $PY -m benchmarks.mfu $N5B $extra 2>&1 | tail -n 8 | tee -a "$OUT/nvidia5b.txt"
done
