#!/usr/bin/env bash
# The host side of a GPU machine in one call (about 5 minutes on 2 x H200); results go to $OUT.
#   bash benchmarks/studies/host/host_probe.sh [HARDWARE]        e.g. ... host_probe.sh h200x2
# 1. benchmarks.studies.host.host_placement: host time per executor call over fresh torchrun jobs, per CPU
#    placement policy (harness.cpu_placement), with the pure-Python reference beside the calls;
# 2. benchmarks.executor_overhead --primitives --profiler torch: each schedule's host time, its building
#    blocks alone, and where torch.profiler sees the host time go (c10d's NCCL calls included);
# 3. ficco host-factor: the host factor, measured within seconds, to hold against the factor a sweep on the
#    same machine reads off its eager times (its card's "Host speed").
set -uo pipefail
source "$(dirname "$0")/../../device_env.sh"
[ "$GPUS" -ge 2 ] || { echo "error: $GPUS CUDA devices; this needs at least 2"; exit 2; }
HW="${1:-h200x$GPUS}"
nproc; nvidia-smi topo -m | head -$((GPUS + 2))
timeout 300 "$PY" -m benchmarks.studies.host.host_placement --jobs 3 --primitives \
    --out "$OUT/host-placement-$HW.json" 2>&1 | grep -v "^primitive" | tail -30
timeout 150 "$PY" -m torch.distributed.run --standalone --nproc-per-node "$GPUS" -m benchmarks.executor_overhead \
    --device cuda --primitives --profile 200 --profiler torch --out "$OUT/executor-overhead-$HW-primitives.json" \
    2>&1 | grep -v Warn | tail -45
timeout 60 "$PY" -m ficco.cli host-factor --out "$OUT/host-factor-$HW.json" 2>&1 | tail -1
