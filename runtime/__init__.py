"""Runtimes execute ficco's recommendations: tensor-parallel layers with autograd and CUDA-graph support,
and a planner that asks a local model or the service once per shape.

    from ficco.runtime import ColumnParallelLinear, Planner, PredictorSource, RowParallelLinear

    planner = Planner(PredictorSource.load(hardware_id="h200x2"), mode="eager")
    kw = {"schedules": planner, "dtype": torch.bfloat16, "device": "cuda"}  # the world as the TP group
    up = ColumnParallelLinear(4096, 28672, name="mlp.up", **kw)
    down = RowParallelLinear(14336, 4096, name="mlp.down", **kw)

    def step():                                                   # safe to repeat: no optimizer update
        y_shard = down(gated(up(x_shard)))                        # x_shard [T/w, 4096] -> [T/w, 4096]
        y_shard.sum().backward()

    step()                                                        # decides every shape once
    verify_plan(planner, lambda: step, device=x_shard.device)     # the plan against serial in place
    print(planner.table())                                        # schedules, speedups, what was pinned

``schedules=`` (the layers, ``runtime.tp``'s styles, ``runtime.compile.enable``) takes anything
:func:`as_planner` takes. Imports ``features``, ``executor`` and ``training``; ``ServiceSource`` takes a
``service.client.ServiceClient`` built by the caller; nothing else in ficco imports ``runtime``.
"""

from ficco.runtime.graphs import GraphedCall
from ficco.runtime.layers import ColumnParallelLinear, RowParallelLinear, apply_ops
from ficco.runtime.overlap import OverlapOps, PlannedOps
from ficco.runtime.planner import Decision, OpKey, OpRequest, OpShape, Planner, Schedules, as_planner
from ficco.runtime.sources import (
    Answer,
    FixedSource,
    FunctionSource,
    PredictorSource,
    ServiceSource,
    TableSource,
)
from ficco.runtime.verify import Verdict, verify_plan

__all__ = [
    "Answer",
    "ColumnParallelLinear",
    "Decision",
    "FixedSource",
    "FunctionSource",
    "GraphedCall",
    "OpKey",
    "OpRequest",
    "OpShape",
    "OverlapOps",
    "PlannedOps",
    "Planner",
    "PredictorSource",
    "RowParallelLinear",
    "Schedules",
    "ServiceSource",
    "TableSource",
    "Verdict",
    "apply_ops",
    "as_planner",
    "verify_plan",
]
