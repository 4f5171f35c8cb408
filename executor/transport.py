"""How pieces move: point-to-point ops (``sm``: NCCL kernels; gloo on the CPU) or peer copies (``dma``).

Both transports speak the verbs of :class:`Transport` to ``executor.pipeline``; ``executor.ops`` keeps each
one across calls (``bind`` hands it each call's tensors). See docs/executor.md ("Transports") for the
buffers they fill and what they remember.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Protocol, TypeVar

import torch
import torch.distributed as dist

from ficco.executor.lanes import DeviceLanes, InlineLanes
from ficco.executor.peer_memory import Workspace
from ficco.executor.plan import Layout, Piece, Plan, Unit, lane_of

T = TypeVar("T")


class Transport(Protocol):
    """The verbs the pipeline engine uses (docs/executor.md, "Transports", says what each does)."""

    def begin(self) -> None: ...
    def issue(self, pieces: tuple[Piece, ...]) -> None: ...
    def issue_rounds(self, rounds: tuple[tuple[Piece, ...], ...]) -> None: ...
    def wait(self, pieces: tuple[Piece, ...]) -> None: ...
    def rows(self, unit: Unit) -> torch.Tensor: ...
    def end(self) -> None: ...


class _Transport:
    """Shared bookkeeping: who sends to whom, and where each piece's and unit's rows are (``layout``)."""

    def __init__(
        self,
        *,
        plan: Plan,
        rank: int,
        source: torch.Tensor,
        dest: torch.Tensor,
        lanes: DeviceLanes | InlineLanes,
        layout: Layout | None = None,
    ) -> None:
        self.plan = plan
        self.rank = rank
        self.world_size = plan.world_size
        self.layout = layout or Layout.shards(
            plan.direction, rank, plan.world_size, dest.shape[1], plan.splits
        )
        """Where each peer's block lies; default: the shards of a ``[w, R, width]`` ``dest``."""
        self.lanes = lanes
        self._views: dict[Hashable, torch.Tensor] = {}
        """Views of ``dest`` and of peer memory (dropped when another ``dest`` is bound)."""
        self._source_views: dict[Hashable, torch.Tensor] = {}
        """Views of ``source`` (dropped when another tensor is bound)."""
        self._source_ranges: dict[Hashable, slice] = {}
        """The rows of ``source`` behind each of those views (kept: the same for every bound tensor)."""
        self._split_rows: dict[int, slice] = {}
        """Row range of each unit, keyed by ``id(unit)`` (the plan keeps its units alive, and hashing a
        frozen dataclass costs a Python call)."""
        self._round_of = {piece: j for j, batch in enumerate(plan.rounds) for piece in batch}
        self._wait_rounds: dict[int, list[int]] = {}
        """gather: the rounds a unit's pieces arrive in, keyed by ``id(unit.pieces)``."""
        self._set_dest(dest)
        self.source = source
        self._source_ptr = source.data_ptr()

    def _set_dest(self, dest: torch.Tensor) -> None:
        self.dest = dest
        self.flat = dest.view(-1, dest.shape[-1])
        """``dest`` as ``[rows, width]``: the rows the layout's destination ranges index."""

    def bind(self, source: torch.Tensor, dest: torch.Tensor | None = None) -> None:
        """Use ``source`` (same shape, dtype and device as the first one) for the next call, and ``dest``
        (the same likewise) when given: a point-to-point transport may receive into a caller's tensor."""
        ptr = source.data_ptr()
        if dest is not None and dest is not self.dest:
            self._set_dest(dest)
            self._views.clear()
            self._source_views.clear()  # cached sends and receives pair views of both
        elif source is self.source and ptr == self._source_ptr:
            return
        self.source, self._source_ptr = source, ptr
        self._source_views.clear()

    def outgoing(self, piece: Piece) -> torch.Tensor:
        """The rows sent as ``piece``: the own sub-chunk (all-gather), a partial of the receiver's shard
        (reduce-scatter), the sub-chunk of the block routed to the receiver (all-to-all)."""
        return self._source_part(id(piece), lambda: self.layout.sent(piece))

    def _source_part(self, key: Hashable, rows: Callable[[], slice]) -> torch.Tensor:
        """The rows ``rows()`` of ``source``, remembered under ``key`` while the same tensor is bound; the
        range is worked out once per transport, and a range of every row is ``source`` itself (no view):
        a call binding a new tensor (each call of a compiled graph or a model) makes only the views."""
        view = self._source_views.get(key)
        if view is not None:
            return view
        rows_of = _remembered(self._source_ranges, key, rows)
        whole = rows_of.start == 0 and rows_of.stop == self.source.shape[0]
        view = self._source_views[key] = self.source if whole else self.source[rows_of]
        return view

    def incoming(self, piece: Piece) -> torch.Tensor:
        """Where ``piece`` lands here: the sender's block of ``dest``, rows of the sub-chunk."""
        return _remembered(self._views, ("in", id(piece)), lambda: self.flat[self.layout.landed(piece)])

    def rounds_of(self, pieces: tuple[Piece, ...]) -> list[int]:
        """gather: the rounds of the plan that ``pieces`` arrive in, in order."""
        return _remembered(self._wait_rounds, id(pieces), lambda: sorted({self._round_of[p] for p in pieces}))

    def split_rows(self, unit: Unit) -> slice:
        """The rows ``[start, stop)`` that ``unit``'s GEMM covers on this rank: of the destination (gather:
        for the dense ops, the rows of ``C``) or of the source (scatter: the rows of ``A``)."""
        return _remembered(self._split_rows, id(unit), lambda: self.layout.split_rows(unit))

    def rows(self, unit: Unit) -> torch.Tensor:
        if self.plan.direction == "scatter" or unit.offset == 0:
            return self._source_part(id(unit), lambda: self._source_rows(unit))
        if unit.offset is None:  # the whole GEMM reads every row: the own block goes into its place too
            self.keep_own()
        return _remembered(self._views, id(unit), lambda: self.flat[self.split_rows(unit)])

    def own_rows(self) -> torch.Tensor:
        """The rows of ``source`` this rank sends itself (scatter: its own partial of its shard)."""
        return self._source_part("own", lambda: self.layout.own_block()[0])

    def keep_own(self) -> None:
        """Copy the block this rank keeps (what it sends itself) from ``source`` to its place in ``dest``."""
        slot = _remembered(self._views, ("slot", self.rank), lambda: self.flat[self.layout.own_block()[1]])
        slot.copy_(self.own_rows())

    def _source_rows(self, unit: Unit) -> slice:
        """scatter: the rows of ``source`` the unit's GEMM writes; gather, own block: those it reads."""
        rows = self.split_rows(unit)
        if self.plan.direction == "scatter":
            return rows
        own_source, own_dest = self.layout.own_block()
        shift = own_source.start - own_dest.start
        return slice(rows.start + shift, rows.stop + shift)

    def received(self) -> list[torch.Tensor]:
        """scatter: what every peer sent here, its block of ``dest`` each (the dense ops: ``[R, n]``)."""
        received = self._views.get("received")
        if received is None:
            starts, counts = self.layout.recv_start, self.layout.recv_rows
            received = self._views["received"] = [
                self.flat[starts[q] : starts[q] + counts[q]] for q in range(self.world_size) if q != self.rank
            ]
        return received


def _remembered(views: dict, key: Hashable, make: Callable[[], T]) -> T:
    """``views[key]``, made by ``make()`` on first use."""
    view = views.get(key)
    if view is None:
        view = views[key] = make()
    return view


class PointToPointTransport(_Transport):
    """``sm``: each batch of pieces is what ``batch_isend_irecv`` issues (an NCCL group on CUDA, gloo's
    sends and receives on the CPU); gather issues from a copy lane, scatter from the caller's stream
    (docs/executor.md, "Transports")."""

    def __init__(self, *, group: dist.ProcessGroup, global_ranks: list[int], **kwargs) -> None:
        super().__init__(**kwargs)
        self.group = group
        self._gather = self.plan.direction == "gather"
        self._direct = type(group) is dist.ProcessGroup
        """Each batch is the ``ProcessGroup.send``/``recv`` calls that ``batch_isend_irecv`` makes, without
        its per-op argument checks and wrappers (tens of microseconds per batch)."""
        self._coalesce = self.source.is_cuda and self._direct
        """CUDA (NCCL): those calls as one coalesced group, as ``batch_isend_irecv`` issues them for NCCL;
        gloo does not coalesce: each send and receive is its own work."""
        self._peers = [dist.get_group_rank(group, g) for g in global_ranks] if self._direct else global_ranks
        """Each layout peer (a rank of the call's group) as ``group`` numbers it (direct: ``group`` may be the
        high-priority twin, whose rank order need not be the call's group's), else its global rank (what
        ``P2POp`` takes)."""
        self._batches: list[list] = []
        """This call's works, one list per issued batch (gather: per round of the plan, in order)."""

    def begin(self) -> None:
        self._batches.clear()
        if self._gather:
            self.lanes.fork(signal=False)

    def _moves(self, pieces: tuple[Piece, ...]) -> list[tuple]:
        """Per piece and direction: (is send, what moves, the peer (:attr:`_peers`), tag), pieces of no rows
        left out (both ends see the same block sizes, so they skip the same ones); worked out once per
        destination. What moves is the piece for a send (its rows of the source bound at the call:
        :meth:`outgoing`) and the one-element list of its destination rows for a receive."""

        def make() -> list[tuple]:
            moves = []
            for piece in pieces:
                tag = piece.offset * self.plan.splits + piece.sub  # the same on both ends; gloo matches by it
                if self.outgoing(piece).numel():
                    moves.append((True, piece, self._peers[self.layout.peer_to(piece)], tag))
                received = self.incoming(piece)
                if received.numel():
                    moves.append((False, [received], self._peers[self.layout.peer_from(piece)], tag))
            return moves

        return _remembered(self._views, ("moves", id(pieces)), make)

    def _coalesced(self, pieces: tuple[Piece, ...]) -> list:
        """One NCCL group of every send and receive of ``pieces``; its one work (none if nothing moves).
        Who sends what to whom is worked out once per destination; a new source costs one view per send."""
        moves = self._moves(pieces)
        if not moves:
            return []
        group, device = self.group, self.source.device
        group._start_coalescing(device)
        for is_send, moved, peer, tag in moves:
            if is_send:
                group.send([self.outgoing(moved)], peer, tag)
            else:
                group.recv(moved, peer, tag)
        return [group._end_coalescing(device)]

    def _each(self, pieces: tuple[Piece, ...]) -> list:
        """Every send and receive of ``pieces`` as its own work, in ``batch_isend_irecv``'s order (gloo)."""
        group = self.group
        return [
            group.send([self.outgoing(moved)], peer, tag) if is_send else group.recv(moved, peer, tag)
            for is_send, moved, peer, tag in self._moves(pieces)
        ]

    def _batched(self, pieces: tuple[Piece, ...]) -> list:
        """``batch_isend_irecv`` of ``pieces`` (a group that is no plain ``ProcessGroup``); its works. The ops
        are kept while the same ``source`` is bound."""

        def make() -> list[dist.P2POp]:
            return [
                dist.P2POp(dist.isend, self.outgoing(moved), peer, self.group, tag)
                if is_send
                else dist.P2POp(dist.irecv, moved[0], peer, self.group, tag)
                for is_send, moved, peer, tag in self._moves(pieces)
            ]

        ops = _remembered(self._source_views, ("ops", id(pieces)), make)
        return dist.batch_isend_irecv(ops) if ops else []

    def issue(self, pieces: tuple[Piece, ...]) -> None:
        start = self._coalesced if self._coalesce else self._each if self._direct else self._batched
        if self._gather:
            self.lanes.to_copy_lane(0)
            try:
                works = start(pieces)
            finally:
                self.lanes.home()
        else:
            works = start(pieces)
        self._batches.append(works)

    def issue_rounds(self, rounds: tuple[tuple[Piece, ...], ...]) -> None:
        """``issue`` each batch, in order."""
        for pieces in rounds:
            self.issue(pieces)

    def wait(self, pieces: tuple[Piece, ...]) -> None:
        for index in self.rounds_of(pieces):
            for work in self._batches[index]:
                work.wait()  # CUDA: the current stream waits for NCCL's stream; CPU: blocks
            self._batches[index] = []

    def end(self) -> None:
        for works in self._batches:
            for work in works:
                work.wait()
        if self._gather:
            self.lanes.join(signal=False)


class PeerCopyTransport(_Transport):
    """``dma``: copy engines push pieces into the receiver's peer memory; device barriers publish them
    (docs/executor.md, "Transports", has the ordering). ``dest`` must be this rank's current half of
    ``workspace``, shaped ``[w, R, width]``."""

    def __init__(self, *, workspace: Workspace, **kwargs) -> None:
        super().__init__(**kwargs)
        self.workspace = workspace
        width, dtype = self.dest.shape[-1], self.dest.dtype
        self.remote = [workspace.rows(q, width, dtype) for q in range(self.world_size)]
        """Every rank's half of the peer memory for this call, as rows of ``width`` (the layout's
        ``remote`` ranges index them)."""
        self._gather = self.plan.direction == "gather"
        count = self.lanes.count
        self._barrier_on_copy_lane = self._gather and len(self.plan.rounds) == 1 and count == 1
        """gather with one round on one lane (e.g. shard on two ranks, serial on the caller's stream): its
        one barrier runs on that copy lane, so the signal lane is not used."""
        self._signal = self._gather and not self._barrier_on_copy_lane
        self._round_index = {id(batch): j for j, batch in enumerate(self.plan.rounds)}
        """gather: the round (and ``signal_after`` key) of each batch of ``plan.rounds``, by identity."""
        self._round_lanes = [sorted({lane_of(p, count) for p in batch}) for batch in self.plan.rounds]
        """gather: the copy lanes each round's pieces use (the signal lane waits for these)."""
        self._lane_of = {id(p): lane_of(p, count) for u in self.plan.units for p in u.pieces}
        self._lane_of |= {id(p): lane_of(p, count) for batch in self.plan.rounds for p in batch}
        self._produced: list[tuple[Piece, ...]] = []
        """scatter: the pieces each GEMM of this call produced, in order (pushed in ``end``)."""
        self._scatter_lanes: dict[int, list[int]] = {}
        """scatter: the copy lanes a unit's pieces use, keyed by ``id(unit.pieces)``."""
        self._waits_join = self._gather and self._round_lanes[-1] == list(range(count))
        """gather: the wait for the last round (every call makes it) already orders every lane this call
        used before the caller's stream: the last landed event is recorded behind the last barrier, which
        ran behind the last copies of every lane. An eager call then skips the join's event pairs; a
        captured one still joins each lane explicitly, as CUDA graph capture requires."""

    def begin(self) -> None:
        self._produced.clear()
        self.lanes.fork(signal=self._signal)

    def issue(self, pieces: tuple[Piece, ...]) -> None:
        lanes = self.lanes
        if self._gather:  # a gather batch is one whole round of the plan
            self.issue_rounds((pieces,))
            return
        key = len(self._produced)
        lanes.mark_produced(key)  # the GEMM that produced the pieces, on the caller's stream
        self._produced.append(pieces)

    def _push_produced(self) -> None:
        """scatter: push every piece produced this call, each copy lane waiting for its piece's GEMM.

        Issued once the call's GEMMs are (in ``end``), so the host switches lanes twice per call instead
        of twice per unit; on the device each copy still starts as soon as its GEMM is done."""
        lanes = self.lanes
        for key, pieces in enumerate(self._produced):
            used = self._scatter_lanes.get(id(pieces))
            if used is None:
                used = self._scatter_lanes[id(pieces)] = sorted({self._lane_of[id(p)] for p in pieces})
            for lane in used:
                lanes.after_produced(lane, key)
            for piece in pieces:
                lanes.to_copy_lane(self._lane_of[id(piece)])
                self.remote_incoming(piece).copy_(self.outgoing(piece))
        self._produced.clear()

    def issue_rounds(self, rounds: tuple[tuple[Piece, ...], ...]) -> None:
        """gather: push the pieces of ``rounds`` (whole rounds of the plan, in order), then run each
        round's barrier: every copy is issued before the first barrier (two lane switches per call
        instead of two per round); the signal lane still runs barrier ``j`` after round ``j``'s copies.
        scatter: ``issue`` each batch."""
        if not self._gather:
            for pieces in rounds:
                self.issue(pieces)
            return
        lanes = self.lanes
        keys = [self._round_index[id(pieces)] for pieces in rounds]
        for key, pieces in zip(keys, rounds, strict=True):
            for piece in pieces:
                lanes.to_copy_lane(self._lane_of[id(piece)])
                self.remote_incoming(piece).copy_(self.outgoing(piece))
            if not self._barrier_on_copy_lane:
                lanes.mark_copied(self._round_lanes[key], key)
        for key in keys:
            lanes.signal_after(
                self._round_lanes[key], key, self.workspace.barrier, on_copy_lane=self._barrier_on_copy_lane
            )

    def remote_incoming(self, piece: Piece) -> torch.Tensor:
        """Where this rank's ``piece`` goes: the receiver's block for this rank, rows of the sub-chunk."""
        return _remembered(
            self._views,
            ("remote", piece),
            lambda: self.remote[self.layout.peer_to(piece)][self.layout.remote(piece)],
        )

    def wait(self, pieces: tuple[Piece, ...]) -> None:
        if not self._gather:
            return  # what lands here is published by the barrier in end()
        for key in self.rounds_of(pieces):
            self.lanes.wait_signal(key)

    def end(self) -> None:
        if not self._gather:
            self._push_produced()
        if self._waits_join and not self.lanes.capturing:
            self.lanes.home()
        else:
            self.lanes.join(signal=self._signal)
        if not self._gather:
            self.workspace.barrier()  # every push into this rank's slots has landed
        self.workspace.advance()
