#!/usr/bin/env bash
# Measure datasets/<hardware> on this GPU machine, or resume it, within a wall-clock budget; the dataset
# (as a .tgz, since it holds more files than a device call brings back) goes to $OUT.
#   bash benchmarks/gpu_dataset.sh HARDWARE SECONDS [more `ficco bench` options]
#   e.g. bash benchmarks/gpu_dataset.sh h200x2 540 --remeasure 64
#   DATASET=datasets/h200x2-unseen bash benchmarks/gpu_dataset.sh h200x2 570 --configs datasets/unseen_configs
#   bash benchmarks/gpu_dataset.sh auto 570 --remeasure 64 --include-moe --grid 280   # TP = every GPU here
# HARDWARE: a profile id, or `auto` for the GPUs found (h200x4 on 4 H200s, h100x4 on 4 H100s, ...).
# DATASET: the dataset directory (default datasets/HARDWARE). FICCO_COPY_STREAMS, when set, is the executor's
# copy arrangement for the whole sweep (the dataset records it and refuses to resume under another).
# SECONDS bounds the whole script: the sweep starts no scenario after SECONDS - 60 s (torchrun start,
# the card and the archive fit in the rest). Run it again to go on where it stopped.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
HW="$1"; SECONDS_LEFT="$2"; shift 2
[ "$HW" = auto ] && HW="$HWID"
DIR="${DATASET:-datasets/$HW}"; NAME="$(basename "$DIR")"
RESUME=(); [ -f "$DIR/manifest.json" ] && RESUME=(--resume)
MINUTES="$($PY -c "print(max(($SECONDS_LEFT - 60) / 60, 0.5))")"
echo "dataset $DIR: ${RESUME[*]:-fresh}, $GPUS GPUs ($HWID), copy arrangement ${FICCO_COPY_STREAMS:-default}, time budget $MINUTES min"
"$PY" -m ficco.cli bench --backend gpu --hardware "$HW" --tp "$GPUS" --nproc "$GPUS" --out "$DIR" \
    "${RESUME[@]}" --time-budget "$MINUTES" --flush-seconds 30 "$@" 2> "$OUT/dataset-$NAME.err" | tail -25
echo "bench rc=${PIPESTATUS[0]}"; tail -5 "$OUT/dataset-$NAME.err"
tar czf "$OUT/dataset-$NAME.tgz" "$DIR"
