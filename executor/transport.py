"""How pieces move: point-to-point ops (``sm``: NCCL kernels; gloo on the CPU) or peer copies (``dma``).

Both transports speak the same verbs to the pipeline engine (``executor.pipeline``):

- ``begin()`` / ``end()``: fork the lanes off the caller's stream / join them back;
- ``issue(pieces)``: start moving these pieces (gather: receive them; scatter: send them, right after
  the GEMM that produced them);
- ``wait(pieces)``: the caller's stream waits until these pieces have landed (gather);
- ``rows(unit)``: the tensor the unit's GEMM reads (gather) or writes (scatter).

Buffers. gather: ``source`` is the rank's ``A_shard [R, k]``; pieces land in ``dest [w, R, k]`` (slot ``q``
= rank ``q``'s shard). scatter: GEMMs write the partial product into ``source [m, n]``; peers' partial rows
of this rank's shard land in ``dest [w, R, n]`` (slot ``q`` = from rank ``q``), listed by ``received()``.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.distributed as dist

from executor.lanes import DeviceLanes, HostLanes
from executor.peer_memory import Workspace
from executor.plan import Piece, Plan, Unit, shard_rows_of, sub_rows_of


class Transport(Protocol):
    """The verbs the pipeline engine uses (see the module docstring)."""

    def begin(self) -> None: ...
    def issue(self, pieces: tuple[Piece, ...]) -> None: ...
    def wait(self, pieces: tuple[Piece, ...]) -> None: ...
    def rows(self, unit: Unit) -> torch.Tensor: ...
    def end(self) -> None: ...


class _Transport:
    """Shared bookkeeping: who sends to whom, and where each unit's rows are."""

    def __init__(
        self,
        *,
        plan: Plan,
        rank: int,
        source: torch.Tensor,
        dest: torch.Tensor,
        lanes: DeviceLanes | HostLanes,
    ) -> None:
        self.plan = plan
        self.rank = rank
        self.world_size = plan.world_size
        self.source = source
        self.dest = dest
        self.lanes = lanes
        self.shard_rows = dest.shape[1]

    def peer_to(self, piece: Piece) -> int:
        """The rank this rank sends ``piece`` to."""
        step = -piece.offset if self.plan.direction == "gather" else piece.offset
        return (self.rank + step) % self.world_size

    def peer_from(self, piece: Piece) -> int:
        """The rank this rank receives ``piece`` from."""
        step = piece.offset if self.plan.direction == "gather" else -piece.offset
        return (self.rank + step) % self.world_size

    def outgoing(self, piece: Piece) -> torch.Tensor:
        """The rows sent as ``piece``: the own sub-chunk (gather) or a partial of the receiver's shard
        (scatter)."""
        sub = sub_rows_of(piece, shard_rows=self.shard_rows, splits=self.plan.splits)
        if self.plan.direction == "gather":
            return self.source[sub]
        return self.source.view(self.world_size, self.shard_rows, -1)[self.peer_to(piece)][sub]

    def incoming(self, piece: Piece) -> torch.Tensor:
        """Where ``piece`` lands here: the sender's slot of ``dest``, rows of the sub-chunk."""
        sub = sub_rows_of(piece, shard_rows=self.shard_rows, splits=self.plan.splits)
        return self.dest[self.peer_from(piece)][sub]

    def rows(self, unit: Unit) -> torch.Tensor:
        rows = shard_rows_of(
            unit,
            rank=self.rank,
            world_size=self.world_size,
            shard_rows=self.shard_rows,
            splits=self.plan.splits,
        )
        if self.plan.direction == "scatter":
            return self.source[rows]
        gathered = self.dest.view(-1, self.dest.shape[-1])
        if unit.offset is None:  # the whole GEMM reads all of A: the own shard goes into its slot too
            self.dest[self.rank].copy_(self.source)
            return gathered
        if unit.offset == 0:
            own = self.rank * self.shard_rows
            return self.source[rows.start - own : rows.stop - own]
        return gathered[rows]

    def received(self) -> list[torch.Tensor]:
        """scatter: the peers' partial rows of this rank's shard, ``[R, n]`` each."""
        return [self.dest[q] for q in range(self.world_size) if q != self.rank]


class PointToPointTransport(_Transport):
    """``sm``: each batch of pieces is one ``batch_isend_irecv`` (an NCCL group on CUDA, gloo on the CPU).

    On CUDA, gather batches are issued from a copy lane forked before the first GEMM, so NCCL's stream,
    which waits for the stream current at issue time, does not wait for that GEMM. Scatter batches are
    issued from the caller's stream right after the GEMM that produced them, which is the wait they need.
    """

    def __init__(self, *, group: dist.ProcessGroup, global_ranks: list[int], **kwargs) -> None:
        super().__init__(**kwargs)
        self.group = group
        self.global_ranks = global_ranks
        self._batches: list[list] = []
        self._batch_of: dict[Piece, int] = {}

    def begin(self) -> None:
        self._batches.clear()
        self._batch_of.clear()
        self.lanes.fork()

    def issue(self, pieces: tuple[Piece, ...]) -> None:
        ops = []
        for piece in pieces:
            tag = piece.offset * self.plan.splits + piece.sub  # the same on both ends; gloo matches by it
            send_to = self.global_ranks[self.peer_to(piece)]
            recv_from = self.global_ranks[self.peer_from(piece)]
            ops.append(dist.P2POp(dist.isend, self.outgoing(piece), send_to, self.group, tag))
            ops.append(dist.P2POp(dist.irecv, self.incoming(piece), recv_from, self.group, tag))
        if self.plan.direction == "gather":
            with self.lanes.on_copy_lane(0):
                works = dist.batch_isend_irecv(ops)
        else:
            works = dist.batch_isend_irecv(ops)
        for piece in pieces:
            self._batch_of[piece] = len(self._batches)
        self._batches.append(list(works))

    def wait(self, pieces: tuple[Piece, ...]) -> None:
        for index in sorted({self._batch_of[p] for p in pieces}):
            for work in self._batches[index]:
                work.wait()  # CUDA: the current stream waits for NCCL's stream; CPU: blocks
            self._batches[index] = []

    def end(self) -> None:
        self.wait(tuple(self._batch_of))
        self.lanes.join()


class PeerCopyTransport(_Transport):
    """``dma``: copy engines push pieces into the receiver's peer memory; device barriers publish them.

    gather: round ``j`` pushes this rank's sub-chunk ``j`` into each receiver's slot for this rank (one
    copy lane per peer), then a barrier on the signal lane; once it completes, every piece of round ``j``
    has landed here and the GEMMs waiting for that round may start. scatter: each produced piece is pushed
    into its owner's slot for this rank as soon as its GEMM is done; one barrier at the end, then the owner
    reduces. Every call passes at least one barrier, which makes the double buffering safe (``Workspace``).
    ``dest`` must be this rank's current half of ``workspace``, shaped ``[w, R, width]``.
    """

    def __init__(self, *, workspace: Workspace, **kwargs) -> None:
        super().__init__(**kwargs)
        self.workspace = workspace
        shape, dtype = tuple(self.dest.shape), self.dest.dtype
        self.remote = [workspace.slots(q, shape, dtype) for q in range(self.world_size)]
        self._round_of: dict[Piece, int] = {}
        self._rounds = 0

    def begin(self) -> None:
        self._round_of.clear()
        self._rounds = 0
        self.lanes.fork()

    def issue(self, pieces: tuple[Piece, ...]) -> None:
        for piece in pieces:
            lane = self.plan.lane_of(piece)
            if self.plan.direction == "scatter":
                self.lanes.after_current(lane)  # the GEMM that produced the piece
            with self.lanes.on_copy_lane(lane):
                self.remote_incoming(piece).copy_(self.outgoing(piece))
        if self.plan.direction == "gather":
            key, self._rounds = self._rounds, self._rounds + 1
            self.lanes.signal_after({self.plan.lane_of(p) for p in pieces}, key, self.workspace.barrier)
            for piece in pieces:
                self._round_of[piece] = key

    def remote_incoming(self, piece: Piece) -> torch.Tensor:
        """Where this rank's ``piece`` goes: the receiver's slot for this rank, rows of the sub-chunk."""
        sub = sub_rows_of(piece, shard_rows=self.shard_rows, splits=self.plan.splits)
        return self.remote[self.peer_to(piece)][self.rank][sub]

    def wait(self, pieces: tuple[Piece, ...]) -> None:
        if self.plan.direction == "scatter":
            return  # what lands here is published by the barrier in end()
        for key in sorted({self._round_of[p] for p in pieces}):
            self.lanes.wait_signal(key)

    def end(self) -> None:
        self.lanes.join()
        if self.plan.direction == "scatter":
            self.workspace.barrier()  # every push into this rank's slots has landed
        self.workspace.advance()
