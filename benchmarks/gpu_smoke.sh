#!/usr/bin/env bash
# One call on a GPU machine (>= 2 GPUs, ~3 min): every schedule eager + graph vs serial, then host overhead.
#   bash benchmarks/gpu_smoke.sh        # results under $OUT (default ./.device-out)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
RUN=("$PY" -m torch.distributed.run --standalone --nproc-per-node "$GPUS")
timeout 200 "${RUN[@]}" tests/gpu/executor_gpu_check.py > "$OUT/gpu-check.txt" 2> "$OUT/gpu-check.err"
echo "gpu check rc=$? ($(grep -c ' ok$' "$OUT/gpu-check.txt") ok, $(grep -c ' FAIL ' "$OUT/gpu-check.txt") failed)"
grep ' FAIL ' "$OUT/gpu-check.txt" | head -20
tail -1 "$OUT/gpu-check.txt"
timeout 90 "${RUN[@]}" -m benchmarks.executor_overhead --device cuda \
    --out "$OUT/executor-overhead-h200x${GPUS}.json" 2> "$OUT/overhead.err" | tail -20
