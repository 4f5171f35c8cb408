#!/usr/bin/env bash
# The runtimes benchmark on 2 GPUs in one call (< 10 minutes): torchtitan's Llama 3 layers at TP=2 under serial
# NCCL, PyTorch async-TP, ficco's parallel styles, ficco's compile pass and vLLM's rule (benchmarks/runtimes.py).
# Results go to $RESULTS (default benchmarks/results: runtimes-h200x2.{json,md,png}, -h100x2 on H100s) and are
# copied to $OUT. Resumable: points already in $RESULTS' JSON are skipped, so a second call (with the first
# call's JSON in the checkout) measures only what the first one left.
#   bash benchmarks/gpu_runtimes.sh [SECONDS] [more benchmarks.runtimes options]
#   e.g. bash benchmarks/gpu_runtimes.sh 570 --tokens 256 512 1024 2048 4096 8192 16384
#   TP=4 bash benchmarks/gpu_runtimes.sh 570      # TP=4 on 4 GPUs: runtimes-h200x4.{json,md,png}
# SECONDS (default 570) bounds the whole call; no point starts after SECONDS - 120 s.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
SECS="${1:-570}"; [ $# -gt 0 ] && shift
RESULTS="${RESULTS:-benchmarks/results}"
TP="${TP:-2}"
if ! [ "${GPUS:-0}" -ge "$TP" ] 2>/dev/null; then
    echo "gpu_runtimes.sh needs $TP GPUs; ${GPUS:-none} here (one GPU: $PY -m benchmarks.runtimes --loopback)"; exit 2
fi
timeout "$SECS" "$PY" -m torch.distributed.run --standalone --nproc-per-node "$TP" -m benchmarks.runtimes \
    --out "$RESULTS" --budget-s "$((SECS - 120))" "$@" > "$OUT/runtimes.log" 2> "$OUT/runtimes.err"
echo "runtimes rc=$?"
grep -E " T=[0-9]+:" "$OUT/runtimes.log" | tail -40
grep -A12 '"goals"' "$OUT/runtimes.log" | head -14
tail -5 "$OUT/runtimes.err"
cp "$RESULTS"/runtimes-*.json "$RESULTS"/runtimes-*.md "$RESULTS"/runtimes-*.png "$OUT"/ 2>/dev/null
ls "$OUT"
