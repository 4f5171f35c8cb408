#!/usr/bin/env bash
# Measure datasets/<hardware> on this GPU machine, or resume it, within a wall-clock budget; the dataset
# (as a .tgz, since it holds more files than a device call brings back) goes to $OUT.
#   bash benchmarks/gpu_dataset.sh HARDWARE SECONDS [more `ficco bench` options]
#   e.g. bash benchmarks/gpu_dataset.sh h200x2 540 --remeasure 64
#   DATASET=datasets/h200x2-unseen bash benchmarks/gpu_dataset.sh h200x2 570 --configs datasets/unseen_configs
#   bash benchmarks/gpu_dataset.sh auto 570 --remeasure 64 --ops all --grid 280   # TP = every GPU here
#   SHARDS=2 bash benchmarks/gpu_dataset.sh auto 570 --remeasure 64 --ops all --grid 280  # 8 GPUs: two
#       TP=4 sweeps at once, each on 4 GPUs and half the CPUs (`ficco fleet shard`), gathered once complete
# HARDWARE: a profile id, or `auto` for the GPUs found (h200x4 on 4 H200s, h100x4 on 4 H100s; with SHARDS, the
# GPUs of one shard). DATASET: the dataset directory (default datasets/HARDWARE). FICCO_COPY_STREAMS, when
# set, is the executor's copy arrangement for the whole sweep (the dataset records it and refuses to resume
# under another). SHARDS (default 1): concurrent sweeps, each over GPUS / SHARDS GPUs, into DATASET/shards/
# (their neighbour shares the host and the NVSwitch fabric: the card says so). BACKEND (default gpu; gloo
# checks the wiring on the CPU, TP then giving the ranks).
# SECONDS bounds the whole script: the sweep starts no scenario after SECONDS - 60 s (torchrun start,
# the card and the archive fit in the rest). Run it again to go on where it stopped.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
HW="$1"; SECONDS_LEFT="$2"; shift 2
SHARDS="${SHARDS:-1}"; BACKEND="${BACKEND:-gpu}"
TP="${TP:-$((GPUS / SHARDS))}"
if [ "$HW" = auto ]; then
    HW="$("$PY" -c "import torch; from ficco.features.hardware import hardware_id_of as h
print(h(torch.cuda.get_device_name(0), $TP))")"
fi
DIR="${DATASET:-datasets/$HW}"; NAME="$(basename "$DIR")"
MINUTES="$($PY -c "print(max(($SECONDS_LEFT - 60) / 60, 0.5))")"
SWEEP=(--backend "$BACKEND" --hardware "$HW" --tp "$TP")
echo "dataset $DIR: $SHARDS x TP=$TP of $GPUS GPUs ($HWID), copy arrangement ${FICCO_COPY_STREAMS:-default}," \
    "time budget $MINUTES min"
if [ "$SHARDS" -eq 1 ]; then
    [ -f "$DIR/manifest.json" ] && echo "continuing" || echo "fresh"
    "$PY" -m ficco.cli bench "${SWEEP[@]}" --out "$DIR" --time-budget "$MINUTES" --flush-seconds 30 "$@" \
        2> "$OUT/dataset-$NAME.err" | tail -25
    echo "bench rc=${PIPESTATUS[0]}"; tail -5 "$OUT/dataset-$NAME.err"
else
    read -r -a CPUS < <("$PY" -c 'import os; print(*sorted(os.sched_getaffinity(0)))')
    PER=$(( ${#CPUS[@]} / SHARDS ))
    for i in $(seq 0 $((SHARDS - 1))); do
        devices="$(seq -s, $((i * TP)) $((i * TP + TP - 1)))"
        cpus="$(echo "${CPUS[@]:$((i * PER)):$PER}" | tr ' ' ,)"
        echo "shard $i/$SHARDS: GPUs $devices, CPUs ${cpus%%,*}..${cpus##*,}"
        CUDA_VISIBLE_DEVICES="$devices" taskset -c "$cpus" "$PY" -m ficco.cli fleet shard --shard "$i/$SHARDS" \
            "${SWEEP[@]}" --out "$DIR" \
            --time-budget "$MINUTES" --flush-seconds 30 "$@" > "$OUT/dataset-$NAME-$i.log" 2>&1 &
    done
    wait
    for i in $(seq 0 $((SHARDS - 1))); do tail -3 "$OUT/dataset-$NAME-$i.log"; done
    if [ ! -f "$DIR/manifest.json" ] && "$PY" -m ficco.cli dataset gather "$DIR/shards" --out "$DIR"; then
        echo "every shard complete: gathered into $DIR"
    else
        echo "shards not all complete yet (or already gathered): run the same command again"
    fi
fi
tar czf "$OUT/dataset-$NAME.tgz" "$DIR"
