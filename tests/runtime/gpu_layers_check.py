r"""The runtime layers on GPUs: gradients against the serial reference (the CI check, on NCCL and the copy
engines at larger sizes), then the forward inside CUDA graphs.

    python3 -m torch.distributed.run --standalone --nproc-per-node 2 tests/runtime/gpu_layers_check.py

Prints one line per case and exits non-zero if any relative error exceeds the tolerance (bf16 1e-2; fp32
1e-4, as cuBLAS and the CPU reference sum in different orders).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "executor"), str(REPO / "tests" / "runtime")]

from ficco.harness.worker import SAFE_ENV  # noqa: E402 (needs the path above; imports no torch)

os.environ.update(SAFE_ENV)  # NVLink multicast off, before torch loads NCCL

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from test_layers import _mlp_world  # noqa: E402

from ficco import executor  # noqa: E402
from ficco.runtime import (  # noqa: E402
    ColumnParallelLinear,
    FixedSource,
    PlannedOps,
    Planner,
    RowParallelLinear,
    verify_plan,
)
from ficco.runtime.graphs import GraphedCall  # noqa: E402
from ficco.training.predict.registry import default_model_root  # noqa: E402

SIZES = (4096, 1024, 2048, 1024)
"""Tokens, in, hidden, out of the MLP."""
SCHEDULES = [
    "serial/sm",
    "shard/sm",
    "shard/dma",
    "finer/sm/s2/chunk",
    "finer/dma/s2/chunk",
    "finer/dma/s4/shard/hp",
    "finer/dma/s8/chunk",
]
TOLERANCE = {"fp32": 1e-4, "bf16": 1e-2}


def graph_errors(rank: int, world_size: int) -> list[tuple[str, float]]:
    """The MLP forward per schedule captured by ``GraphedCall``, replayed on new inputs, against eager."""
    tokens, d_in, hidden, d_out = SIZES
    gen = torch.Generator().manual_seed(11)
    w1 = (torch.randn(d_in, hidden, generator=gen) / d_in**0.5).cuda().bfloat16()
    w2 = (torch.randn(hidden, d_out, generator=gen) / hidden**0.5).cuda().bfloat16()
    xs = [torch.randn(tokens, d_in, generator=gen).cuda().bfloat16() for _ in range(3)]
    rows = slice(rank * tokens // world_size, (rank + 1) * tokens // world_size)
    out = []
    for schedule in ["serial/sm", *SCHEDULES]:
        ops = PlannedOps(Planner(FixedSource(schedule), mode="graph"))
        up = ColumnParallelLinear(d_in, hidden, ops=ops, device="cuda", dtype=torch.bfloat16)
        down = RowParallelLinear(hidden, d_out, ops=ops, device="cuda", dtype=torch.bfloat16)
        up.load_full_weight(w1)
        down.load_full_weight(w2)
        static_x = xs[0][rows].clone()

        @torch.no_grad()
        def forward(up=up, down=down, static_x=static_x) -> torch.Tensor:
            return down(F.gelu(up(static_x)))

        graphed = GraphedCall(forward)
        inputs = xs[1:] * 2  # each input twice: both captures, in turn (an even number of replays)
        replayed = []
        for x in inputs:  # replays back to back: an eager copy-engine call between two replays could
            static_x.copy_(x[rows])  # reuse the half the previous replay's last call used (graphs.py)
            replayed.append(graphed().float().clone())
        del graphed
        worst = 0.0
        for x, y in zip(inputs, replayed, strict=True):
            with torch.no_grad():
                ref = down(F.gelu(up(x[rows]))).float()  # eager, same schedule: any mismatch is the graph
            full = (F.gelu(x.float() @ w1.float()) @ w2.float())[rows]
            worst = max(worst, float((y - full).norm() / full.norm()), float((y - ref).norm() / ref.norm()))
        out.append((schedule, worst))
    return out


def verify_check(rank: int, world_size: int) -> tuple[dict, float, bool]:
    """``runtime.verify_plan`` on the MLP forward in graph mode (a fresh capture per variant): its verdict,
    the relative error of a capture made after it against the full-precision reference, and whether every
    rank reached the same verdict."""
    tokens, d_in, hidden, d_out = 256, 1024, 2048, 1024  # small: a copy-engine plan may lose here
    gen = torch.Generator().manual_seed(12)
    w1 = (torch.randn(d_in, hidden, generator=gen) / d_in**0.5).cuda().bfloat16()
    w2 = (torch.randn(hidden, d_out, generator=gen) / hidden**0.5).cuda().bfloat16()
    x = torch.randn(tokens, d_in, generator=gen).cuda().bfloat16()
    rows = slice(rank * tokens // world_size, (rank + 1) * tokens // world_size)
    planner = Planner(FixedSource("finer/dma/s4/chunk"), mode="graph")
    ops = PlannedOps(planner)
    up = ColumnParallelLinear(d_in, hidden, ops=ops, device="cuda", dtype=torch.bfloat16)
    down = RowParallelLinear(hidden, d_out, ops=ops, device="cuda", dtype=torch.bfloat16)
    up.load_full_weight(w1)
    down.load_full_weight(w2)
    static_x = x[rows].clone()

    @torch.no_grad()
    def forward() -> torch.Tensor:
        return down(F.gelu(up(static_x)))

    verdict = verify_plan(planner, lambda: GraphedCall(forward), device=torch.device("cuda"), rounds=3)
    graphed = GraphedCall(forward)
    y = graphed().float()
    full = (F.gelu(x.float() @ w1.float()) @ w2.float())[rows]
    verdicts = [None] * world_size
    dist.all_gather_object(verdicts, verdict.to_dict())
    return verdict.to_dict(), float((y - full).norm() / full.norm()), all(v == verdicts[0] for v in verdicts)


def main() -> int:
    with executor.process_group("cuda"):
        rank, world_size = dist.get_rank(), dist.get_world_size()
        # the shipped model's case needs xgboost, which the GPU image may lack
        model_root = str(default_model_root()) if importlib.util.find_spec("xgboost") else None
        report = _mlp_world(rank, world_size, model_root, "cuda", SIZES, SCHEDULES)
        bad = []
        for dtype, schedule, keep, errs in report["cases"]:
            worst = max(errs.values())
            line = (
                f"rank {rank} train {dtype} {schedule:24s} keep_gathered={keep!s:5s} max rel err {worst:.2e}"
            )
            print(line, flush=True)
            if not worst <= TOLERANCE[dtype]:
                bad.append(line)
        for dtype, err in report["inference"]:
            if not err <= TOLERANCE[dtype]:
                bad.append(f"rank {rank} inference {dtype}: {err:.2e}")
        if report["planner"] is not None:
            errs, rows, _ = report["planner"]
            schedules = sorted({r["schedule"] for r in rows if r["schedule"] != "-"})
            worst = max(errs.values())
            print(f"rank {rank} planner (shipped model) max rel err {worst:.2e}; schedules {schedules}")
            if not worst <= TOLERANCE["bf16"]:
                bad.append(f"rank {rank} planner: {errs}")
        for schedule, worst in graph_errors(rank, world_size):
            line = f"rank {rank} CUDA graph bf16 {schedule:24s} max rel err {worst:.2e}"
            print(line, flush=True)
            if not worst <= TOLERANCE["bf16"]:
                bad.append(line)
        verdict, err, agreed = verify_check(rank, world_size)
        line = f"rank {rank} verify_plan graph: {verdict}, then max rel err {err:.2e}, ranks agree {agreed}"
        print(line, flush=True)
        if not (err <= TOLERANCE["bf16"] and agreed and verdict["times_ms"]):
            bad.append(line)
    print(f"rank {rank}: {'FAILED ' + str(len(bad)) if bad else 'all within tolerance'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
