"""Runtimes execute ficco's recommendations: tensor-parallel layers with autograd and CUDA-graph support,
and a planner that asks a local model or the service once per shape.

    from ficco.runtime import ColumnParallelLinear, Planner, PlannedOps, PredictorSource, RowParallelLinear

    planner = Planner(PredictorSource.load(hardware_id="h200x2"), mode="eager", timeout_s=0.25)
    ops = PlannedOps(planner)                                     # the world as the tensor-parallel group
    up = ColumnParallelLinear(4096, 28672, ops=ops, name="mlp.up", dtype=torch.bfloat16, device="cuda")
    down = RowParallelLinear(14336, 4096, ops=ops, name="mlp.down", dtype=torch.bfloat16, device="cuda")

    def step():                                                   # safe to repeat: no optimizer update
        with planner.step():
            y_shard = down(gated(up(x_shard)))                    # x_shard [T/w, 4096] -> [T/w, 4096]
            y_shard.sum().backward()

    step()                                                        # decides every shape once
    verify_plan(planner, lambda: step, device=x_shard.device)     # the plan against serial in place
    print(planner.table())                                        # schedules, speedups, what was pinned

Layering: imports ``features``, ``executor``, ``training`` (the predictor) and ``service`` (its client);
nothing in ficco imports it.
"""

from ficco.runtime.graphs import GraphedCall
from ficco.runtime.layers import ColumnParallelLinear, RowParallelLinear, apply_ops
from ficco.runtime.overlap import DifferentiableOps, OverlapOps, PlannedOps
from ficco.runtime.planner import Decision, OpKey, OpRequest, OpShape, Planner
from ficco.runtime.sources import Answer, FixedSource, PredictorSource, ServiceSource, TableSource
from ficco.runtime.verify import Verdict, verify_plan

__all__ = [
    "Answer",
    "ColumnParallelLinear",
    "Decision",
    "DifferentiableOps",
    "FixedSource",
    "GraphedCall",
    "OpKey",
    "OpRequest",
    "OpShape",
    "OverlapOps",
    "PlannedOps",
    "Planner",
    "PredictorSource",
    "RowParallelLinear",
    "ServiceSource",
    "TableSource",
    "Verdict",
    "apply_ops",
    "verify_plan",
]
