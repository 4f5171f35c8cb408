#!/usr/bin/env bash
# The end-to-end runtimes benchmark in one call: torchtitan's Llama 3 layers at TP (default: every GPU
# found) under eager serial, ficco's styles (and their diagnoses), serial compile, async-TP, ficco's compile
# pass and the no-communication limit (benchmarks/runtimes.py). Results go to $RESULTS (default
# benchmarks/results: runtimes-h200x2.{json,md,png}, -h100x2 on H100s, -h200x4 at 4 GPUs) and are copied to
# $OUT with the logs. Resumable: points already in $RESULTS' JSON are skipped, so a second call (with the
# first call's JSON in the checkout) measures the next points of the plan (runtimes.PLAN).
#   bash benchmarks/gpu_runtimes.sh [SECONDS] [more benchmarks.runtimes options]
#   e.g. TP=4 bash benchmarks/gpu_runtimes.sh 560
#        bash benchmarks/gpu_runtimes.sh 560 --models Llama-3.1-70B --phases train --tokens 4096 8192
#        # after a change to ficco's eager path: those variants and serial again at the points measured,
#        # then the points not measured yet
#        bash benchmarks/gpu_runtimes.sh 560 --phases train --redo ficco_eager ficco_eager:all_serial
#        # one GPU, the loopback world (ficco's own GPU and host work: runtimes-loopback-h200.*)
#        LOOPBACK=1 bash benchmarks/gpu_runtimes.sh 480
# SECONDS (default 560) bounds the whole call; no point starts that this run expects to end after
# SECONDS - 75 s (each point takes about as long as the longest of its phase so far).
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
SECS="${1:-560}"; [ $# -gt 0 ] && shift
TP="${TP:-$GPUS}"
RESULTS="${RESULTS:-benchmarks/results}"
if [ "${LOOPBACK:-0}" = 1 ]; then
    timeout "$SECS" "$PY" -m benchmarks.runtimes --loopback --out "$RESULTS" --budget-s "$((SECS - 75))" "$@" \
        > "$OUT/runtimes.log" 2> "$OUT/runtimes.err"
elif ! [ "$TP" -ge 2 ] 2>/dev/null || [ "$TP" -gt "${GPUS:-0}" ]; then
    echo "gpu_runtimes.sh needs 2 to ${GPUS:-0} GPUs (TP); got TP=$TP (one GPU: LOOPBACK=1)"; exit 2
else
    timeout "$SECS" "$PY" -m torch.distributed.run --standalone --nproc-per-node "$TP" -m benchmarks.runtimes \
        --out "$RESULTS" --budget-s "$((SECS - 75))" "$@" > "$OUT/runtimes.log" 2> "$OUT/runtimes.err"
fi
echo "runtimes rc=$? (124: stopped at $SECS s; the points written so far are in the JSON)"
grep -E " T=[0-9]+:" "$OUT/runtimes.log" | tail -40
grep -A8 '"goals"' "$OUT/runtimes.log" | head -10
grep -A12 '"met"' "$OUT/runtimes.log" | head -14
grep -E "Error|error:" "$OUT/runtimes.err" | sort | uniq -c | sort -rn | head -5
NAME="runtimes-*x$TP"; [ "${LOOPBACK:-0}" = 1 ] && NAME="runtimes-loopback-*"
cp "$RESULTS"/$NAME.json "$RESULTS"/$NAME.md "$RESULTS"/$NAME.png "$OUT"/ 2>/dev/null
ls -l "$OUT"
