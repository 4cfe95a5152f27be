#!/usr/bin/env bash
# One GPU call for issue 37's FP8 and H100 rows (device time is counted from the machine's start):
#   1. the best gpt3_xl row of 2026-11-26 beside its plain-JAX reference, on whatever GPU came;
#   2. a ~5B GPT shape (gpt3_xl at width 4096, 24 layers: 5.0B parameters), bf16 then
#      `--model.block.fp8`; below 100 GB of GPU memory (an H100) with the levers that make 5B fit:
#      Adafactor (factored second moments) and full remat;
#   3. the loss curves: an 85M GPT on Shakespeare bytes, 600 steps, bf16 (two seeds: the noise)
#      and fp8 (the first seed); each run's metrics.jsonl is copied to $OUT.
# Results land in $OUT as they finish, so a call cut short keeps what ran.
# Usage on the GPU machine, from the repo root: bash benchmarks/sweeps/fp8_lease.sh
LEASE=fp8_lease
. "$(dirname "$0")/lease_setup.sh"
mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
run() {  # NAME LIMIT_S COMMAND...: one process, its log kept whatever happens
    local name=$1 limit=$2; shift 2
    echo "== $name: $*" | tee -a "$OUT/results.txt"
    local start=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "(exit $?, $((SECONDS - start)) s)" >> "$OUT/$name.log"
    grep -v "^{" "$OUT/$name.log" | tail -n 12 | tee -a "$OUT/results.txt"
}
run gpt3_xl 170 $PY -m benchmarks.mfu --exp gpt3_xl_unrolled --model.remat-policy none --data.train.batch-size 12 \
    --model.loss-chunk-size 512 --steps 8 --warmup 2
B5="--exp gpt3_xl --model.model-dims 4096 --model.hidden-dims 16384 --model.num-heads 32 --data.train.batch-size 8"
LEVERS=""
if [ "${mem_mib:-0}" -lt 100000 ]; then LEVERS="--learner.optimizer adafactor --model.remat-policy full"; fi
run b5_bf16 150 $PY -m benchmarks.mfu $B5 $LEVERS --steps 6 --warmup 2 --no-reference
run b5_fp8 150 $PY -m benchmarks.mfu $B5 $LEVERS --model.block.fp8 --steps 6 --warmup 2 --no-reference
SMALL="--exp shakespeare_char --model.num-layers 12 --model.model-dims 768 --model.hidden-dims 3072 --model.num-heads 12
    --model.max-seq-len 256 --data.seq-len 256 --data.train.batch-size 64 --data.eval.batch-size 64
    --train.fprop-dtype bfloat16 --train.num-steps 600 --train.eval-interval-steps 100 --learner.learning-rate 6e-4
    --learner.schedule.decay-end 600 --checkpoint.every-n-steps 600 --decode.max-new-tokens 100"
for v in "bf16:" "bf16_seed2:--train.seed 2" "fp8:--model.block.fp8"; do
    name=${v%%:*}; flags=${v#*:}
    rm -rf "/tmp/curve_$name"
    run "curve_$name" 110 $PY -m pax_eqx.train $SMALL $flags --job-log-dir "/tmp/curve_$name"
    cp "/tmp/curve_$name/metrics.jsonl" "$OUT/curve_$name.metrics.jsonl" 2>/dev/null
done
