"""The blocks of expert GEMMs the executor's MoE ops run, one per unit of a schedule's plan: what the
grouped-GEMM study times and the expert tests check, grouped against the loop."""

from __future__ import annotations

from ficco.executor.experts import ExpertGemms, RoutedState
from ficco.executor.plan import make_plan
from ficco.features import OP_SPECS, Routing, Schedule


def executor_units(op: str, routing: Routing, schedule: str, rank: int = 0) -> list[ExpertGemms]:
    """``rank``'s blocks of expert GEMMs of one call of ``schedule`` on ``op`` under ``routing``, in the
    plan's unit order."""
    s, direction = Schedule.parse(schedule), OP_SPECS[op].direction
    plan = make_plan(direction, routing.world_size, s.granularity, s.splits, s.grain)
    state = RoutedState(routing=routing, rank=rank)
    gemms = state.unit_gemms(plan, state.layout(direction, plan.splits))
    return [gemms[id(unit)] for unit in plan.units]
