#!/usr/bin/env bash
# The fifth GPU lease (one H100), one call: issue 37's last gpt3_xl item.
#   1. gpt3_xl_unrolled, remat none, batch 24 as 2 microbatches of 12, beside the plain-JAX
#      reference accumulating the same microbatches, in one process;
#   2. 3 and 4 microbatches of 12 without the reference, then the best line again beside it.
# Results land in $OUT as each variant ends, so a call cut short keeps what ran.
# Usage on the GPU machine, from the repo root: bash benchmarks/sweeps/h100_lease5.sh
# The carried wheels must include a pax_eqx wheel (`pip wheel --no-deps -w .whl .`): the module
# code comes from the checkout, but `--exp NAME` finds experiments through the installed
# distribution's `pax_eqx.experiments` entry point; without it every line fails at once.
LEASE=lease
. "$(dirname "$0")/lease_setup.sh"
$PY -m benchmarks.sweep --variants benchmarks/sweeps/gpt3_xl_h100_confirm.txt --out "$OUT/confirm.jsonl" \
    --budget-s 200 --timeout-s 200 --steps 8 --warmup 2 2>&1 | tee "$OUT/confirm.md"
$PY -m benchmarks.sweep --variants benchmarks/sweeps/gpt3_xl_h100_more_microbatches.txt --out "$OUT/more.jsonl" \
    --budget-s 300 --timeout-s 110 --no-reference --confirm-best --steps 8 --warmup 2 2>&1 | tee "$OUT/more.md"
