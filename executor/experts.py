"""The expert side of the MoE ops: where each (source rank, local expert) block of rows lies, and the
grouped GEMM.

Two row orders meet on a rank (``features.routing``). The all-to-all moves rows *source-major*: the block
from (dispatch) or to (combine) rank ``q`` holds, in local-expert order, ``counts[q][rank][e]`` rows for
expert ``e``. The experts work *expert-major*: expert ``e``'s rows from every source, contiguous, sources in
rank order. A pipelined GEMM covers part of one source's block, so it runs one ``torch.mm`` per expert it
touches, reading source-major rows and writing expert-major ones (dispatch) or the reverse (combine): no
permutation. The serial reference runs one ``torch.mm`` per expert over all of its rows, so it permutes the
whole source-major buffer first (dispatch) or after (combine), with one ``index_select``, as a runtime's
token permutation does.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from ficco.executor.plan import Layout, Plan
from ficco.features.routing import Routing

Segment = tuple[int, int, int, int]
"""``(start, stop, expert, expert_row)``: rows ``[start, stop)`` of a unit's rows (source-major) belong to
local expert ``expert`` and sit at ``expert_row ..`` in the expert-major order."""

ROUTED_MAX = 8
"""Routings whose derived state a group context keeps at most (least recently used dropped first)."""


@dataclass(kw_only=True, slots=True)
class RoutedState:
    """What one rank derives from one routing, kept across calls with that routing."""

    routing: Routing
    """The routing (every rank's counts)."""
    rank: int
    """This rank."""
    expert_rows: tuple[int, ...] = ()
    """Rows of each local expert (over every source)."""
    layouts: dict[tuple[str, int], Layout] = field(default_factory=dict)
    """Per (direction, splits): the all-to-all's blocks (dispatch: ``gather``, combine: ``scatter``)."""
    segments: dict[tuple[int, int], tuple[Plan, dict[int, list[Segment]]]] = field(default_factory=dict)
    """Per (id of plan, id of layout): the plan (held, so that its id names it) and each unit's segments,
    by ``id(unit)``."""
    permutations: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    """Per device: (expert-major row ``i`` <- source-major row ``perm[i]``, and its inverse)."""
    transports: dict[tuple, object] = field(default_factory=dict)
    """Transports built over this routing's layouts (``executor.ops`` keys them), dropped with it."""
    cuts: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    """Per (id of a buffer, rows): the buffer (held, so that its id names it) and its first rows."""

    def __post_init__(self) -> None:
        self.expert_rows = self.routing.expert_rows(self.rank)

    def cut(self, buffer: torch.Tensor, rows: int) -> torch.Tensor:
        """``buffer[:rows]``, the same view on every call with this routing (transports kept with the routing
        are keyed by their destination's identity)."""
        key = (id(buffer), rows)
        found = self.cuts.get(key)
        if found is None or found[0] is not buffer:
            found = self.cuts[key] = (buffer, buffer[:rows])
        return found[1]

    def layout(self, direction: str, splits: int) -> Layout:
        """The all-to-all's layout: the dispatch moves ``routing.moved``, the combine its transpose."""
        key = (direction, splits)
        layout = self.layouts.get(key)
        if layout is None:
            moved = self.routing.moved
            if direction == "scatter":
                moved = tuple(zip(*moved, strict=True))
            layout = self.layouts[key] = Layout.routed(direction, self.rank, moved, splits)
        return layout

    def unit_segments(self, plan: Plan, layout: Layout) -> dict[int, list[Segment]]:
        """Each unit's segments, by ``id(unit)`` (the plan keeps its units alive; ``whole`` units have none:
        they take the permutation)."""
        key = (id(plan), id(layout))
        found = self.segments.get(key)
        if found is None:
            found = self.segments[key] = (
                plan,
                {
                    id(unit): [] if unit.offset is None else self._segments(*layout.block_of(unit))
                    for unit in plan.units
                },
            )
        return found[1]

    def _segments(self, peer: int, start: int, stop: int) -> list[Segment]:
        """The non-empty segments of rows ``[start, stop)`` of the block of source ``peer``."""
        counts = self.routing.counts
        out = []
        expert_row = 0  # where expert e starts in the expert-major order
        block_row = 0  # where expert e's rows start in the peer's block
        for e, n in enumerate(counts[peer][self.rank]):
            earlier = sum(counts[q][self.rank][e] for q in range(peer))  # rows of e from lower sources
            lo, hi = max(start, block_row), min(stop, block_row + n)
            if lo < hi:
                out.append((lo - start, hi - start, e, expert_row + earlier + lo - block_row))
            expert_row += self.expert_rows[e]
            block_row += n
        return out

    def permutation(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(perm, inverse)`` on ``device``: ``expert_major = source_major[perm]``, ``source_major =
        expert_major[inverse]`` (int64, made on first use from the blocks' segments, one ``arange`` each;
        a host-to-device copy)."""
        found = self.permutations.get(device)
        if found is None:
            segments = sorted(
                (seg for q in range(self.routing.world_size) for seg in self._block_segments(q)),
                key=lambda seg: seg[3],
            )
            parts = [torch.arange(start, stop, dtype=torch.int64) for start, stop, _e, _row in segments]
            perm = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
            inverse = torch.empty_like(perm)
            inverse[perm] = torch.arange(perm.numel(), dtype=torch.int64)
            found = self.permutations[device] = (perm.to(device), inverse.to(device))
        return found

    def _block_segments(self, peer: int) -> list[Segment]:
        """The segments of ``peer``'s whole block, in rows of the source-major buffer."""
        received = self.routing.received(self.rank)
        offset = sum(received[:peer])
        return [
            (lo + offset, hi + offset, e, row) for lo, hi, e, row in self._segments(peer, 0, received[peer])
        ]


def routed_state(states: OrderedDict, routing: Routing, rank: int) -> RoutedState:
    """``routing``'s state in ``states`` (a group context's LRU of ``ROUTED_MAX``), made on first use."""
    state = states.get(routing)
    if state is None:
        state = states[routing] = RoutedState(routing=routing, rank=rank)
        if len(states) > ROUTED_MAX:
            states.popitem(last=False)
    else:
        states.move_to_end(routing)
    return state


def grouped_matmul(
    a: torch.Tensor, b: torch.Tensor, group_rows: tuple[int, ...] | list[int], out: torch.Tensor | None = None
) -> torch.Tensor:
    """``out[rows of group e] = a[rows of group e] @ b[e]``: one ``torch.mm`` per non-empty group, over
    consecutive row ranges of ``group_rows[e]`` rows (the MoE ops' expert GEMM; the GEMM alone).

    Parameters
    ----------
    a : Tensor, shape [sum(group_rows), k]
    b : Tensor, shape [len(group_rows), k, n]
    group_rows : sequence of int
        Rows of each group, in order.
    out : Tensor, shape [sum(group_rows), n], optional
    """
    if out is None:
        out = a.new_empty((a.shape[0], b.shape[2]))
    start = 0
    for e, rows in enumerate(group_rows):
        if rows:
            torch.mm(a[start : start + rows], b[e], out=out[start : start + rows])
        start += rows
    return out
