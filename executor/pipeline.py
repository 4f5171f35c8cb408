"""The one overlap engine: runs a plan's transfers and GEMMs through a transport, in issue order."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ficco.executor.plan import Plan, Unit
from ficco.executor.transport import Transport

Compute = Callable[[torch.Tensor, Unit], None]
"""A GEMM closure: ``compute(rows, unit)``. gather: ``rows`` holds the unit's rows of the gathered A;
scatter: ``rows`` is where the unit's rows of the partial product go."""


def run_pipeline(plan: Plan, transport: Transport, compute: Compute | None) -> None:
    """Run one decomposed collective + GEMM (``compute=None``: the transfers alone). Unpipelined::

        gather:   A = all_gather(A_shard); for unit in plan.units: compute(A[unit rows], unit)
        scatter:  for unit in plan.units: compute(P[unit rows], unit); P_shard = reduce_scatter(P)

    gather issues the GEMMs that need no transfer (the own shard) first, then every round of transfers
    (their lanes were forked before that GEMM, so they do not wait for it), then each remaining GEMM after
    a wait for its pieces. scatter sends each unit's pieces right after the GEMM that produced them, the
    own shard's GEMM last, overlapping the last transfers. See docs/executor.md for the streams this makes.
    """
    transport.begin()
    if compute is None:
        for batch in plan.rounds:
            transport.issue(batch)
            transport.wait(batch)
    elif plan.direction == "gather":
        head = 0
        while head < len(plan.units) and not plan.units[head].pieces:
            compute(transport.rows(plan.units[head]), plan.units[head])
            head += 1
        transport.issue_rounds(plan.rounds)
        for unit in plan.units[head:]:
            transport.wait(unit.pieces)
            compute(transport.rows(unit), unit)
    else:
        for unit in plan.units:
            compute(transport.rows(unit), unit)
            if unit.pieces:
                transport.issue(unit.pieces)
    transport.end()
