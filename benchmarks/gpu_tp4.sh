#!/usr/bin/env bash
# The executor at TP=4 on one 4-GPU machine, in one call of at most SECONDS (default 560): which copy
# arrangement to ship, then everything else measured under it.
#   bash benchmarks/gpu_tp4.sh [SECONDS]
#   CPU_DRY_RUN=1 bash benchmarks/gpu_tp4.sh 600     # the same wiring on 4 gloo ranks (no GPU; what CI checks)
# Steps (each bounded by what is left of SECONDS; typical times on 4 x H200 in brackets, from the tools' own
# estimates, not yet measured together):
#   1. benchmarks.copy_arrangements: the all-gather alone and the copy-engine schedules under every copy
#      arrangement against NCCL; its verdict becomes FICCO_COPY_STREAMS for the steps below  [~2 min]
#   2. tests/gpu/executor_gpu_check.py --ops a2a_gemm,gemm_a2a: the MoE ops, every schedule, eager and graph,
#      under that arrangement (the dense ops are checked by steps 1 and 3)                  [~1 min]
#   3. benchmarks.executor_bench: every ag_gemm/gemm_rs schedule on the TP=4 layer shapes, bandwidth sweep,
#      copy-engine probes, realized overlap and the goals                                    [~3 min]
#   4. benchmarks.a2a_bench: the MoE all-to-all alone, NCCL against the copy engines         [~1 min]
# Results: the JSON and markdown of every step in $RESULTS (default benchmarks/results), packed with the logs
# ($LOGS, default .tp4-logs) into $OUT/tp4-results.tgz (extract it at the repository root); $OUT/tp4.log is
# the summary printed here. Nothing else is written to $OUT.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
TOTAL="${1:-560}"
TP="${TP:-4}"
RESULTS="${RESULTS:-benchmarks/results}"
LOGS="${LOGS:-.tp4-logs}"; mkdir -p "$LOGS" "$RESULTS"  # packed into the archive, not brought back one by one
DRY=(); RANKS="$TP"
if [ "${CPU_DRY_RUN:-0}" = 1 ]; then
    DRY=(--cpu-dry-run); HW="cpux$TP"
else
    if ! [ "${GPUS:-0}" -ge "$TP" ] 2>/dev/null; then
        echo "gpu_tp4.sh needs $TP GPUs; ${GPUS:-none} here (CPU_DRY_RUN=1 checks the wiring on gloo)"; exit 2
    fi
    export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((TP - 1)))}"
    HW="$("$PY" -c "import torch; from ficco.features.hardware import hardware_id_of as h
print(h(torch.cuda.get_device_name(0), $TP))")"
fi
exec > >(tee "$OUT/tp4.log") 2>&1
echo "gpu_tp4: $TP ranks on $HW, ${TOTAL} s; results in $RESULTS"

left() { echo $((TOTAL - SECONDS - 30)); }  # 30 s kept for packing the results
cap() { local l; l="$(left)"; echo $(($1 < l ? $1 : l)); }
run() {  # run NAME SECONDS RANKS MODULE-OR-SCRIPT ARGS...: one torchrun job, its output in $LOGS/NAME.log
    local name="$1" secs="$2" ranks="$3"; shift 3
    if [ "$secs" -lt 20 ]; then echo "[$SECONDS s] $name skipped: ${secs} s left"; return 0; fi
    echo "[$SECONDS s] $name (at most ${secs} s)"
    timeout "$secs" "$PY" -m torch.distributed.run --standalone --nproc-per-node "$ranks" "$@" \
        > "$LOGS/$name.log" 2>&1
    local rc=$?
    echo "[$SECONDS s] $name rc=$rc"
    return 0
}

# 1. The copy arrangement to ship
t="$(cap 160)"
run arrangements "$t" "$RANKS" -m benchmarks.copy_arrangements "${DRY[@]}" --out "$RESULTS" --budget-s $((t - 70))
grep -E "^all-gather|^ship:" "$LOGS/arrangements.log"
SHIP="$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['verdict']['ship'])" \
    "$RESULTS/copy-arrangements-$HW.json" 2>/dev/null || echo per_peer)"
export FICCO_COPY_STREAMS="$SHIP"
echo "copy arrangement for the steps below: FICCO_COPY_STREAMS=$SHIP"

# 2. The MoE ops on CUDA under it (the check is CUDA only)
if [ ${#DRY[@]} -eq 0 ]; then
    run gpu-check "$(cap 80)" "$RANKS" tests/gpu/executor_gpu_check.py --ops a2a_gemm,gemm_a2a
    echo "gpu check: $(grep -c ' ok$' "$LOGS/gpu-check.log") ok, $(grep -c ' FAIL ' "$LOGS/gpu-check.log") failed"
    grep ' FAIL ' "$LOGS/gpu-check.log" | head -10
    tail -1 "$LOGS/gpu-check.log"
fi

# 3. The executor benchmark
t="$(cap 210)"
run executor-bench "$t" "$RANKS" -m benchmarks.executor_bench "${DRY[@]}" --out "$RESULTS" --budget-s $((t - 40))
grep -E "^goal:|shapes skipped|^wall time" "$LOGS/executor-bench.log"

# 4. The all-to-all alone
run a2a "$(cap 80)" "$RANKS" -m benchmarks.a2a_bench "${DRY[@]}" --out "$RESULTS" --rounds 10
grep -E "^crossover|^goal" "$LOGS/a2a.log"

echo "[$SECONDS s] packing"
tar czf "$OUT/tp4-results.tgz" "$RESULTS"/copy-arrangements-*.json "$RESULTS"/copy-arrangements-*.md \
    "$RESULTS"/executor-*x"$TP"*.json "$RESULTS"/executor-*x"$TP"*.md "$RESULTS"/a2a-*x"$TP".json \
    "$RESULTS"/a2a-*x"$TP".md "$LOGS" 2>/dev/null
tar tzf "$OUT/tp4-results.tgz" | grep -v "/$"
echo "[$SECONDS s] done; FICCO_COPY_STREAMS=$SHIP"
