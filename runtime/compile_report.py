"""What the compile pass (``runtime.compile``) rewrote and what it left, with the reason: the report
:func:`ficco.runtime.compile.enable` returns, filled as Inductor compiles graphs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ficco.runtime.planner import Direction
from ficco.tables import markdown_table

if TYPE_CHECKING:
    from ficco.executor.library import OpRun

Op = Literal["ag_gemm", "gemm_rs", "all_gather", "reduce_scatter", "all_reduce", "all_to_all"]
"""``ag_gemm`` (``torch.ops.ficco.all_gather_matmul``) or ``gemm_rs`` (``ficco.matmul_reduce_scatter``) for
a collective beside a matmul; the collective's name for one beside none, and for an all-reduce."""
Reason = Literal[
    "bias",
    "fp8 scaled matmul",
    "layout",
    "dtype",
    "dynamic shape",
    "unsupported group",
    "shared output",
    "reduce op",
    "no pattern",
    "all-reduce",
    "no ficco op",
    "no matmul",
    "serial",
]
"""Why a collective was left as it was (``serial``: the planner runs ``serial/sm`` at every token count the
site may see, so PyTorch's own compiled path runs it, as Inductor lowers it)."""
QUIET: tuple[Reason, ...] = ("no matmul", "serial")
"""Reasons that are no missed overlap: listed in the report, never warned about."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Collective:
    """A collective beside a matmul that the pass met, and where: what :class:`Rewrite` and :class:`Left`
    share."""

    op: Op
    graph: int
    """Which graph (0, 1, ... in the order Inductor compiled them in this process)."""
    direction: Direction
    """``fwd`` (a forward or inference graph) or ``bwd-input`` (a backward graph)."""
    layers: tuple[str, ...]
    """The modules whose matmuls it runs (``layers.0.attention.wq``), else the graph's node names."""
    group: str
    """The c10d group name."""

    def row(self, **rest: str) -> dict[str, Any]:
        """Its row of :meth:`CompileReport.rows`, with the other columns ``rest``."""
        layers = ",".join(self.layers)
        return {"graph": self.graph, "direction": self.direction, "op": self.op, "layers": layers} | rest


@dataclass(frozen=True, kw_only=True, slots=True)
class Rewrite(Collective):
    """One ficco op the pass put in a graph."""

    found: Literal["pattern", "sum of matmuls", "fused op"]
    """Matched as collective + matmuls (``sum of matmuls``: a reduce-scatter of several matmuls' summed
    outputs, one op over their concatenated operands), or from PyTorch's fused ``symm_mem`` op."""
    world_size: int
    m: int | None
    """Gathered (``ag_gemm``) or full (``gemm_rs``) rows, batch included; None when dynamic."""
    n: tuple[int, ...]
    """Output columns of each weight."""
    k: int
    dtype: str
    schedule: str
    """The schedule, or the token-range table for a dynamic ``m``, baked into the op."""
    note: str = ""
    """Why ``schedule`` is serial where the source's pick could not be had; empty otherwise."""

    @property
    def shape(self) -> str:
        """``m=4096 n=1024+1024 k=4096 bf16`` (``m=dyn`` for a dynamic token count)."""
        return (
            f"m={'dyn' if self.m is None else self.m} n={'+'.join(map(str, self.n))} k={self.k} {self.dtype}"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Left(Collective):
    """A collective that the pass left as it was."""

    reason: Reason
    detail: str
    """The reason in words, with the values that decided it."""


@dataclass
class CompileReport:
    """What the pass rewrote and left over every graph it ran on."""

    rewritten: list[Rewrite] = field(default_factory=list)
    left: list[Left] = field(default_factory=list)
    graphs: int = 0
    """Graphs the pass ran on (graphs loaded from Inductor's cache are not among them)."""
    cache_hits_at_start: int = 0
    """Inductor's FX graph cache hits counted in this process when the pass was made."""

    @property
    def cache_hits(self) -> int:
        """Graphs Inductor loaded from its FX graph cache since the pass was made: rewritten when they were
        first compiled, by a pass of the same uuid, and not listed here."""
        from torch._dynamo.utils import counters

        return counters["inductor"]["fxgraph_cache_hit"] - self.cache_hits_at_start

    def ran(self, rewrite: Rewrite) -> list[OpRun]:
        """What ``rewrite``'s op ran in this process so far (``executor.library.run_report``), one entry per
        token count it ran at: the schedule (or the table's entry), or ``serial/sm`` with the reason where
        that could not run at the shape."""
        from ficco.executor.library import run_report

        key = (rewrite.op, sum(rewrite.n), rewrite.k, rewrite.dtype, rewrite.world_size, rewrite.schedule)
        return [
            r
            for r in run_report()
            if (r.op, r.n, r.k, r.dtype, r.world_size, r.asked) == key and rewrite.m in (None, r.m)
        ]

    def rows(self) -> list[dict[str, Any]]:
        """One row per rewrite, then one per op left (the columns of :meth:`table`); ``ran`` says what each
        rewritten op ran so far in this process."""
        rows = []
        for r in self.rewritten:
            ran = _ran_text(self.ran(r), r.m is None)
            note = r.note or f"rewritten ({r.found})"
            rows.append(r.row(shape=f"{r.shape} w={r.world_size}", schedule=r.schedule, ran=ran, note=note))
        for x in self.left:
            rows.append(x.row(shape="", schedule="left", ran="", note=f"{x.reason}: {x.detail}"))
        return rows

    def table(self) -> str:
        """The report as a markdown table."""
        header = ["graph", "direction", "op", "layers", "shape", "schedule", "ran", "note"]
        return markdown_table(header, [[r[h] for h in header] for r in self.rows()])

    def __str__(self) -> str:
        ag = sum(r.op == "ag_gemm" for r in self.rewritten)
        return (
            f"ficco.runtime.compile: {len(self.rewritten)} ops rewritten ({ag} all_gather_matmul, "
            f"{len(self.rewritten) - ag} matmul_reduce_scatter), {len(self.left)} left, in {self.graphs} "
            f"graphs ({self.cache_hits} more loaded from the graph cache)"
        )


def _ran_text(runs: list[OpRun], dynamic: bool) -> str:
    """``shard/dma``; per token count for a table (``m=32: serial/sm, m=256: shard/dma``); a fallback with
    its reason; ``-`` before the op ran."""
    if not runs:
        return "-"
    parts = []
    for r in runs:
        text = r.ran if r.reason is None else f"{r.ran} ({r.reason})"
        parts.append(f"m={r.m}: {text}" if dynamic else text)
    return ", ".join(parts)
