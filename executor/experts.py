"""The expert side of the MoE ops: where each (source rank, local expert) block of rows lies, and the
expert GEMMs over a block.

The all-to-all moves rows *source-major* (the block from or to rank ``q``, in local-expert order); the experts
work *expert-major* (each expert's rows from every source, contiguous). :class:`ExpertGemms` runs a block's
GEMMs as a loop of ``torch.mm`` (no copy) or, where :func:`grouped_eligible` and the block touches at least
:data:`GROUPED_MIN_GEMMS` experts, one ``torch._grouped_mm``. See docs/executor.md ("Expert GEMMs").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from itertools import accumulate

import torch

from ficco.executor.allocation import persistent
from ficco.executor.capture import refuse_capture
from ficco.executor.plan import Layout, Plan, block_starts
from ficco.features.routing import GROUPED_MIN_GEMMS, Routing

Segment = tuple[int, int, int, int]
"""``(start, stop, expert, expert_row)``: rows ``[start, stop)`` of a unit's rows (source-major) belong to
local expert ``expert`` and sit at ``expert_row ..`` in the expert-major order."""

ROUTED_MAX = 8
"""Routings whose derived state a group context keeps at most (least recently used dropped first)."""


def grouped_eligible(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm`` takes ``a [rows, k] @ b [experts, k, n]`` here: bf16, ``k`` and ``n``
    multiples of 8 (16-byte rows), contiguous ``b``, on a GPU of compute capability >= 9.0 (the CUTLASS
    kernels) or on the CPU (torch's reference kernel, which the CPU tests run)."""
    if a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16 or a.shape[1] % 8 or b.shape[2] % 8:
        return False
    if not b.is_contiguous() or a.stride(1) != 1:
        return False
    if a.device.type == "cuda":
        return _hopper_on(a.device.index if a.device.index is not None else torch.cuda.current_device())
    return a.device.type == "cpu"


@cache
def _hopper_on(index: int) -> bool:
    """Whether CUDA device ``index`` has compute capability >= 9.0."""
    return torch.cuda.get_device_capability(index) >= (9, 0)


@dataclass(frozen=True, slots=True)
class ExpertGemms:
    """The expert GEMMs over one block of rows: its segments, and the grouped form's index tensors.

    Row ``i`` of the block belongs to the segment ``(start, stop, e, row)`` with ``start <= i < stop`` and
    sits at ``row + i - start`` in the expert-major order; segments are in expert order and cover the block.
    """

    segments: tuple[Segment, ...]
    """The block's non-empty segments."""
    experts: int
    """Local experts (the grouped GEMM's groups, most of them empty for a small block)."""
    aligned: bool = field(init=False)
    """Every row already in expert-major order (a whole expert-major buffer): no row index."""
    _tensors: dict = field(default_factory=dict, init=False, compare=False, repr=False)
    """Per device: (``offs``, int32 ``[experts]``, each expert's cumulative row end in the block; ``index``,
    int64 ``[rows]``, each row's expert-major row, or None when aligned)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "aligned", all(start == row for start, _stop, _e, row in self.segments))

    @classmethod
    @lru_cache(maxsize=64)
    def whole(cls, group_rows: tuple[int, ...]) -> ExpertGemms:
        """Every row of an expert-major buffer of ``group_rows[e]`` rows per expert (kept per ``group_rows``,
        so that its device tensors are made once)."""
        starts = block_starts(group_rows)
        segments = tuple(
            (s, s + n, e, s) for e, (s, n) in enumerate(zip(starts, group_rows, strict=True)) if n
        )
        return cls(segments, len(group_rows))

    @property
    def rows(self) -> int:
        return self.segments[-1][1] if self.segments else 0

    def grouped(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        """Whether these GEMMs of ``a @ b[e]`` run as one grouped GEMM (module docstring)."""
        return len(self.segments) >= GROUPED_MIN_GEMMS and grouped_eligible(a, b)

    def ready(self, device: torch.device) -> bool:
        """Whether the grouped form's tensors are on ``device`` (making them is a host-to-device copy)."""
        return device in self._tensors

    def tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(offs, index)`` on ``device`` (class docstring), made on first use."""
        found = self._tensors.get(device)
        if found is None:
            ends = [0] * self.experts
            for _start, stop, e, _row in self.segments:
                ends[e] = stop
            # empty experts end where the one before ends
            offs = torch.tensor(list(accumulate(ends, max)), dtype=torch.int32)
            index = None
            if not self.aligned:
                parts = [torch.arange(row, row + stop - start) for start, stop, _e, row in self.segments]
                index = persistent(device, lambda: torch.cat(parts).to(device))
            found = self._tensors[device] = (persistent(device, lambda: offs.to(device)), index)
        return found

    def dispatch(
        self,
        rows: torch.Tensor,
        b: torch.Tensor,
        out: torch.Tensor,
        weights: Sequence[torch.Tensor] | None = None,
        grouped: bool | None = None,
    ) -> None:
        """``out[expert-major rows] = rows @ b[e]`` per segment: ``rows [block rows, k]``, ``b [experts, k,
        n]``, ``out [expert-major rows, n]``; ``weights``: ``b.unbind(0)`` when the caller has it;
        ``grouped`` forces the way (default: :meth:`grouped`)."""
        if self.grouped(rows, b) if grouped is None else grouped:
            offs, index = self.tensors(rows.device)
            product = torch._grouped_mm(rows[: self.rows], b, offs=offs)
            if index is None:
                out[: self.rows].copy_(product)
            else:
                out.index_copy_(0, index, product)
            return
        weights = b.unbind(0) if weights is None else weights
        for start, stop, e, row in self.segments:
            torch.mm(rows[start:stop], weights[e], out=out[row : row + stop - start])

    def combine(
        self,
        h: torch.Tensor,
        b: torch.Tensor,
        out: torch.Tensor,
        weights: Sequence[torch.Tensor] | None = None,
        grouped: bool | None = None,
    ) -> None:
        """``out[block rows] = h[expert-major rows] @ b[e]`` per segment: ``h [expert-major rows, k]``, ``out
        [block rows, n]`` in block order; ``weights`` and ``grouped`` as in :meth:`dispatch`."""
        if self.grouped(h, b) if grouped is None else grouped:
            offs, index = self.tensors(h.device)
            a = h[: self.rows] if index is None else h.index_select(0, index)
            out[: self.rows].copy_(torch._grouped_mm(a, b, offs=offs))
            return
        weights = b.unbind(0) if weights is None else weights
        for start, stop, e, row in self.segments:
            torch.mm(h[row : row + stop - start], weights[e], out=out[start:stop])


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
    gemms: dict[tuple[int, int], tuple[Plan, dict[int, ExpertGemms]]] = field(default_factory=dict)
    """Per (id of plan, id of layout): the plan (held, so its id names it) and its units' GEMMs by id."""
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

    def unit_gemms(self, plan: Plan, layout: Layout) -> dict[int, ExpertGemms]:
        """Each unit's expert GEMMs, by ``id(unit)`` (the plan keeps its units alive); a ``whole`` unit's
        cover the expert-major buffer the permutation makes."""
        key = (id(plan), id(layout))
        found = self.gemms.get(key)
        if found is None:
            whole = ExpertGemms.whole(self.expert_rows)
            found = self.gemms[key] = (
                plan,
                {
                    id(unit): whole
                    if unit.offset is None
                    else ExpertGemms(tuple(self._segments(*layout.block_of(unit))), len(self.expert_rows))
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
            found = persistent(device, lambda: (perm.to(device), inverse.to(device)))
            self.permutations[device] = found
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
    """``out[rows of group e] = a[rows of group e] @ b[e]`` over consecutive ranges of ``group_rows[e]`` rows
    (the MoE ops' expert GEMM alone): ``a [sum(group_rows), k]``, ``b [len(group_rows), k, n]``, ``out
    [sum(group_rows), n]`` (None: a new tensor, or the grouped GEMM's own output). One grouped GEMM or one
    ``torch.mm`` per non-empty group, as :class:`ExpertGemms` chooses; the grouped form's first call for a
    ``group_rows`` on a device raises :class:`~ficco.executor.capture.CaptureError` inside CUDA graph capture.
    """
    gemms = ExpertGemms.whole(tuple(group_rows))
    if gemms.grouped(a, b):
        if not gemms.ready(a.device):
            refuse_capture(a.device, "grouped_matmul", "copies the groups' row offsets to the device")
        product = torch._grouped_mm(a, b, offs=gemms.tensors(a.device)[0])
        return product if out is None else out.copy_(product)
    if out is None:
        out = a.new_empty((a.shape[0], b.shape[2]))
    gemms.dispatch(a, b, out, grouped=False)
    return out
