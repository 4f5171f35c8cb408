"""Runtimes execute ficco's recommendations: tensor-parallel layers with autograd and CUDA-graph support,
and a planner that asks a local model or the service once per shape (usage: docs/planner.md).

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
