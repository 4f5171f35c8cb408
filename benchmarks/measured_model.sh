#!/usr/bin/env bash
# After a sweep of new hardware is measured and committed (datasets/HARDWARE, e.g. from gpu_dataset.sh): its
# model evaluated, trained, registered and promoted, its report, the world-size report against the 2-GPU
# dataset, the results page, and a check that `ficco score --tp`, `ficco export` answer from it. CPU only.
#   bash benchmarks/measured_model.sh HARDWARE [BASE_DATASET]
#   e.g. bash benchmarks/measured_model.sh h200x4            # BASE_DATASET: datasets/h200x2
# Writes benchmarks/results/evaluate-HARDWARE.json (family holdout, noise ceiling, the peer rules),
# models/HARDWARE/<version> (promoted: CURRENT), reports/HARDWARE/, reports/world-size/ and docs/results.md;
# exits non-zero when a step fails. DATASET, REGISTRY, RESULTS, REPORTS, PAGE override where each goes (the CPU
# test points them at a stand-in); PYTHON the interpreter (default .venv/bin/python, else python3).
set -euo pipefail
HW="$1"; BASE="${2:-datasets/h200x2}"
PY="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
DATASET="${DATASET:-datasets/$HW}"; REGISTRY="${REGISTRY:-models}"
RESULTS="${RESULTS:-benchmarks/results}"; REPORTS="${REPORTS:-reports}"; PAGE="${PAGE:-docs/results.md}"
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
TP="$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["settings"]["tp"])' "$DATASET/plan.json")"
ficco() { "$PY" -m ficco.cli "$@"; }
step() { echo "== $*"; }

step "evaluate $DATASET (family holdout, noise ceiling, peer rules) -> $RESULTS/evaluate-$HW.json"
ficco evaluate --dataset "$DATASET" --out "$RESULTS/evaluate-$HW.json" --json > /dev/null
"$PY" - "$RESULTS/evaluate-$HW.json" <<'EOF'
import json, sys
modes = json.load(open(sys.argv[1]))["modes"]
for mode, goal in (("eager", 0.02), ("graph", 0.015)):
    held = modes[mode]["family_holdout"]
    regret = held["model"]["geomean_regret"]
    print(f"{mode}: family holdout geomean regret {regret:.2%} (goal <= {goal:.1%}: {'met' if regret <= goal else 'MISSED'})")
held = modes["graph"]["family_holdout"]
if held.get("vllm_sp_rule") and held.get("model_on_async_tp_rows"):
    factor = held["vllm_sp_rule"]["geomean_regret"] / max(held["model_on_async_tp_rows"]["geomean_regret"], 1e-9)
    print(f"graph: vLLM's rule's regret {factor:.1f}x the model's on the same rows (goal >= 10x: {'met' if factor >= 10 else 'MISSED'})")
for mode in modes:
    ceiling = modes[mode]["family_holdout"].get("ceiling")
    print(f"{mode}: noise ceiling {'n/a (no noise.parquet)' if not ceiling else format(ceiling['geomean_regret'], '.2%')}")
EOF

step "train, register and promote $REGISTRY/$HW"
ficco train --dataset "$DATASET" --model-root "$REGISTRY" --promote 2>&1 | tail -3

step "report -> $REPORTS/$HW"
ficco report --dataset "$DATASET" --model-root "$REGISTRY" --out "$REPORTS/$HW" 2>&1 | tail -1

step "world-size report: $BASE against $DATASET -> $REPORTS/world-size"
"$PY" -m benchmarks.world_size_report "$BASE" "$DATASET" --out "$REPORTS/world-size" 2>&1 | tail -1

step "served at tp=$TP: ficco score, ficco export"
CONFIG="datasets/model_configs/Llama-3.1-70B.json"
ficco score --tp "$TP" --tokens 4096 --model-root "$REGISTRY" "$CONFIG" | head -8
ficco export --hardware "$HW" --tp "$TP" --config "$CONFIG" --model-root "$REGISTRY" --out "$REPORTS/$HW/tables" \
    ${ALLOW_SIMULATED:+--allow-simulated} | tail -2

if [ "$PAGE" = docs/results.md ]; then
    step "results page -> $PAGE"
    ficco results --out "$PAGE"
fi
echo "done: commit $RESULTS/evaluate-$HW.json, $REGISTRY/$HW, $REPORTS/$HW, $REPORTS/world-size and $PAGE"
