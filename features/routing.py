"""Routing: how many rows each rank sends to each expert of each rank, for the MoE ops.

``counts[src][dst][e]`` is the number of rows rank ``src`` routes to local expert ``e`` of rank ``dst`` (the
dispatch direction, ``a2a_gemm``; the combine, ``gemm_a2a``, sends the same rows back). Every rank holds the
same counts: a runtime gets them from an all-gather of each rank's per-expert counts, which its router
computes anyway. Row orders: docs/executor.md; shapes: docs/shapes.md. Pure Python (no numpy or torch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from numbers import Integral
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ficco.features.scenario import Scenario

Counts = tuple[tuple[tuple[int, ...], ...], ...]
GROUPED_MIN_GEMMS = 8
"""Fewest expert GEMMs (non-empty segments) a block needs for the executor to run them as one grouped GEMM
rather than a loop (``executor.experts``; the simulator follows the same rule): the threshold that came
closest to each block's faster way on H200 and H100 (``benchmarks.studies.grouped_gemm --units``,
``benchmarks/results/grouped-units-h{200,100}.md``)."""


@dataclass(frozen=True, slots=True)
class Routing:
    """Rows per (source rank, destination rank, destination's local expert); the same on every rank.

    Build it from a nested sequence (or an array with ``tolist``) of shape ``[w, w, experts / w]``, or with
    :meth:`synthetic` / :meth:`for_scenario`. Immutable and hashable (the hash is computed once), so the
    executor keeps what it derives from a routing while the same routing comes back.
    """

    counts: Counts = (((1,), (1,)), ((1,), (1,)))
    """``counts[src][dst][e]``: rows rank ``src`` routes to local expert ``e`` of rank ``dst``; ints >= 0."""
    moved: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)
    """``moved[src][dst]``: rows rank ``src`` sends to rank ``dst`` in the dispatch (over its experts)."""
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        counts = _as_counts(self.counts)
        object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "moved", tuple(tuple(sum(e) for e in row) for row in counts))
        object.__setattr__(self, "_hash", hash(counts))

    def __hash__(self) -> int:
        return self._hash

    @property
    def world_size(self) -> int:
        """Ranks in the expert-parallel group."""
        return len(self.counts)

    @property
    def local_experts(self) -> int:
        """Experts on each rank (``experts / world_size``)."""
        return len(self.counts[0][0])

    def sent(self, rank: int) -> tuple[int, ...]:
        """Rows ``rank`` sends to each rank in the dispatch (its routed rows, per destination)."""
        return self.moved[rank]

    def received(self, rank: int) -> tuple[int, ...]:
        """Rows ``rank`` receives from each rank in the dispatch (its experts' rows, per source)."""
        return tuple(row[rank] for row in self.moved)

    def expert_rows(self, rank: int) -> tuple[int, ...]:
        """Rows each local expert of ``rank`` works on (over every source)."""
        return tuple(sum(per_expert) for per_expert in zip(*(row[rank] for row in self.counts), strict=True))

    @classmethod
    def synthetic(
        cls, *, tokens: int, top_k: int, experts: int, world_size: int, imbalance: float = 1.0
    ) -> Routing:
        """The routing ficco measures a scenario with: every rank routes ``tokens * top_k`` rows; rank 0
        receives ``imbalance / world_size`` of each rank's rows (rounded), the other ranks equal shares of
        the rest, and each rank's rows spread evenly over its ``experts / world_size`` experts (remainders
        to the lowest ranks and experts). ``imbalance`` is then rank 0's load over the mean, as in
        ``Scenario.imbalance``; 1.0 is balanced, ``world_size`` sends everything to rank 0."""
        w = world_size
        if not (isinstance(w, int) and w >= 1 and experts % w == 0 and experts >= w):
            raise ValueError(
                f"Routing.synthetic needs experts a positive multiple of world_size; got experts={experts}, "
                f"world_size={world_size}"
            )
        if not 1.0 <= imbalance <= w:
            raise ValueError(f"Routing.synthetic needs imbalance in [1, {w}]; got {imbalance!r}")
        rows = tokens * top_k
        hot = min(rows, round(rows * imbalance / w))
        per_rank = [hot, *_spread(rows - hot, w - 1)]
        per_expert = tuple(tuple(_spread(n, experts // w)) for n in per_rank)
        return cls(tuple(per_expert for _ in range(w)))

    @classmethod
    def for_scenario(cls, scenario: Scenario) -> Routing:
        """:meth:`synthetic` for a MoE scenario's ``m`` (tokens per rank), ``top_k``, ``experts``,
        ``world_size`` and ``imbalance``."""
        s = scenario
        return cls.synthetic(
            tokens=s.m, top_k=s.top_k, experts=s.experts, world_size=s.world_size, imbalance=s.imbalance
        )


def _spread(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` near-equal ints, the remainder on the first ones."""
    base, extra = divmod(total, parts) if parts else (0, 0)
    return [base + (i < extra) for i in range(parts)]


def _as_counts(value: Any) -> Counts:
    """``value`` as a ``[w, w, e]`` tuple cube of ints >= 0; ValueError naming what is wrong."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    try:
        cube = tuple(tuple(tuple(experts) for experts in row) for row in value)
    except TypeError:
        raise ValueError(
            f"Routing.counts must be a nested sequence of shape [w, w, experts/w]; got {type(value).__name__}"
        ) from None
    w = len(cube)
    local = len(cube[0][0]) if w and cube[0] else 0
    if w == 0 or local == 0 or any(len(row) != w or any(len(e) != local for e in row) for row in cube):
        shape = [w, [len(row) for row in cube], sorted({len(e) for row in cube for e in row})]
        raise ValueError(
            "Routing.counts must have shape [w, w, experts/w] with w >= 1 and experts/w >= 1; "
            f"got lengths {shape}"
        )
    for src, row in enumerate(cube):
        for dst, experts in enumerate(row):
            for e, n in enumerate(experts):
                if not (isinstance(n, Integral) and not isinstance(n, bool) and n >= 0):
                    raise ValueError(
                        f"Routing.counts[{src}][{dst}][{e}] must be an int >= 0 (rows); got {n!r}"
                    )
    return tuple(tuple(tuple(int(n) for n in experts) for experts in row) for row in cube)
