#!/usr/bin/env bash
# Measure the coverage plan (benchmarks/results/coverage-plan-h200x2.json, from `python -m
# benchmarks.coverage_plan plan`) on this machine's 2 GPUs into datasets/h200x2-coverage, or resume it, within
# a wall-clock budget; the dataset (as a .tgz) goes to $OUT. Run it again to go on where it stopped.
#   bash benchmarks/coverage_sweep.sh SECONDS          e.g. bash benchmarks/coverage_sweep.sh 540
# The plan's machine is 2 x NVIDIA H200: on other GPUs it stops at once (its rows would not belong with
# datasets/h200x2). SECONDS bounds the whole script: no scenario starts after SECONDS - 60 s (torchrun start,
# the card and the archive fit in the rest).
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
SECONDS_LEFT="${1:-540}"
PLAN="${PLAN:-benchmarks/results/coverage-plan-h200x2.json}"
DIR="${DATASET:-datasets/h200x2-coverage}"; NAME="$(basename "$DIR")"
WANT="$($PY -c "import json, sys; print(json.load(open(sys.argv[1]))['entries'][0][1]['hardware']['gpu_name'])" "$PLAN")"
HAVE="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
if [ "$HAVE" != "$WANT" ] || [ "$GPUS" -lt 2 ]; then
    echo "error: the plan $PLAN is for 2 x $WANT; this machine has $GPUS x $HAVE" >&2; exit 2
fi
MINUTES="$($PY -c "print(max(($SECONDS_LEFT - 60) / 60, 0.5))")"
echo "coverage sweep into $DIR: $([ -f "$DIR/manifest.json" ] && echo resumed || echo fresh), time budget $MINUTES min"
"$PY" -m benchmarks.coverage_plan measure --plan "$PLAN" --out "$DIR" --minutes "$MINUTES" \
    2> "$OUT/coverage-$NAME.err" | tail -25
echo "measure rc=${PIPESTATUS[0]}"; tail -5 "$OUT/coverage-$NAME.err"
tar czf "$OUT/dataset-$NAME.tgz" "$DIR"
