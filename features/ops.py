"""The op table: for each op, its collective, which of collective and GEMM runs first, and the per-rank
shapes of its operands, in one place.

The executor, the harness, the simulator and the features read an op's properties from ``OP_SPECS`` instead
of testing its name. What needs torch (the op's function, its serial reference) stays in ``executor.ops``,
keyed by the same names. :meth:`OpSpec.shapes` gives one rank's shapes (conventions: docs/shapes.md).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal

from ficco.features.routing import Routing

if TYPE_CHECKING:
    from ficco.features.scenario import Scenario

Collective = Literal["all_gather", "reduce_scatter", "all_to_all"]
Rows = Literal["shard", "all", "sent", "received"]


@dataclass(frozen=True, kw_only=True, slots=True)
class OpShapes:
    """One rank's operand shapes for one scenario (rows, columns; ``b`` of a MoE op has an expert dim)."""

    a: tuple[int, ...] = (1, 1)
    """The GEMM's left operand before (comm first: the collective's input) or as the GEMM reads it."""
    b: tuple[int, ...] = (1, 1)
    """The weight: ``[k, n]``, or ``[experts / w, k, n]`` for the MoE ops."""
    out: tuple[int, ...] = (1, 1)
    comm: tuple[int, ...] = (1, 1)
    """What ``executor.communicate`` moves alone: ``a`` (comm first), or the GEMM's output (GEMM first)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OpSpec:
    """One communication + GEMM op: what it moves and in which order (shapes: ``features.scenario``)."""

    name: str = "ag_gemm"
    """The op's name, as in ``Scenario.op``."""
    collective: Collective = "all_gather"
    """``all_gather``, ``reduce_scatter`` or ``all_to_all``."""
    comm_first: bool = True
    """True: the collective feeds the GEMM (the executor's ``gather`` plans); False: the GEMM feeds the
    collective (``scatter`` plans)."""
    moe: bool = False
    """Routed rows, one GEMM per local expert: the op needs a :class:`Routing` and ``b`` is
    ``[experts / w, k, n]``."""
    executor_fn: str = "all_gather_matmul"
    a_rows: Rows = "shard"
    """Rows of ``a`` on a rank: ``shard`` (m / w), ``all`` (m), ``sent`` (the rows the rank routes, m *
    top_k) or ``received`` (the rows routed to the rank's experts)."""
    out_rows: Rows = "all"
    """Rows of the result, in the same terms."""

    @property
    def direction(self) -> Literal["gather", "scatter"]:
        """The executor's plan direction (``executor.plan.make_plan``)."""
        return "gather" if self.comm_first else "scatter"

    def comm_width(self, k: int, n: int) -> int:
        """Columns of a communicated row: ``k`` (the GEMM's input moves) or ``n`` (its output moves)."""
        return k if self.comm_first else n

    def shapes(self, scenario: Scenario, rank: int = 0, routing: Routing | None = None) -> OpShapes:
        """The operand shapes on ``rank`` (MoE: under ``routing``, default ``Routing.for_scenario``)."""
        s = scenario
        if self.moe and routing is None:
            routing = Routing.for_scenario(s)
        rows = {"shard": s.m // s.world_size, "all": s.m}
        if routing is not None:
            rows |= {"sent": sum(routing.sent(rank)), "received": sum(routing.received(rank))}
        a = (rows[self.a_rows], s.k)
        b = (s.experts // s.world_size, s.k, s.n) if self.moe else (s.k, s.n)
        return OpShapes(a=a, b=b, out=(rows[self.out_rows], s.n), comm=(a[0], self.comm_width(s.k, s.n)))


# fmt: off
_OP_TABLE = (
    # name,      collective,       comm_first, moe,   executor_fn,             a_rows,     out_rows
    ("ag_gemm",  "all_gather",     True,       False, "all_gather_matmul",     "shard",    "all"),
    ("gemm_rs",  "reduce_scatter", False,      False, "matmul_reduce_scatter", "all",      "shard"),
    ("a2a_gemm", "all_to_all",     True,       True,  "all_to_all_matmul",     "sent",     "received"),
    ("gemm_a2a", "all_to_all",     False,      True,  "matmul_all_to_all",     "received", "sent"),
)
# fmt: on
"""The ops, a row each, in :class:`OpSpec`'s field order."""
OP_SPECS: dict[str, OpSpec] = {
    row[0]: OpSpec(**{field.name: value for field, value in zip(fields(OpSpec), row, strict=True)})
    for row in _OP_TABLE
}
"""Every op, by name, in ``Scenario.op`` order."""
