"""Decomposition plans: which pieces move in which order, and which GEMMs consume or produce them.

A plan is plain Python over rank *offsets*, so the same plan serves every rank and two ranks' plans match
piece for piece. Rank ``q`` owns the shard ``[q * R, (q + 1) * R)`` of the split rows (``R = m / w``);
``finer`` splits each shard into ``splits`` sub-chunks.

``gather`` (all-gather -> GEMM): rank ``r`` receives piece ``(offset, sub)`` from rank ``(r + offset) % w``
and sends its own sub-chunk ``sub`` to rank ``(r - offset) % w``; a unit's GEMM consumes pieces.
``scatter`` (GEMM -> reduce-scatter): a unit's GEMM produces the partial rows of the shard owned by rank
``(r + offset) % w``; piece ``(offset, sub)`` is sent there, and the same piece arrives from
``(r - offset) % w``. The MoE all-to-alls use the same plans (dispatch: ``gather``, combine: ``scatter``)
over blocks of any size, which a :class:`Layout` places.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from typing import Literal

Direction = Literal["gather", "scatter"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Piece:
    """One transfer: sub-chunk ``sub`` of a shard, between ranks ``offset`` apart."""

    offset: int = 1
    """Peer distance in ``[1, world_size)`` (see the module docstring for who sends to whom)."""
    sub: int = 0
    """Sub-chunk index within the shard, in ``[0, splits)``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Unit:
    """One GEMM over a contiguous block of split rows."""

    offset: int | None = 0
    """Whose shard: ``0`` own, ``1..w-1`` the shard of rank ``(r + offset) % w``, ``None`` all rows."""
    first_sub: int = 0
    """First sub-chunk of the shard the GEMM covers."""
    n_subs: int = 1
    """Sub-chunks covered (``splits`` for a whole shard; 1 for ``whole`` units, which cover every shard)."""
    pieces: tuple[Piece, ...] = ()
    """The transfers this GEMM consumes (gather) or produces (scatter); empty for the own shard."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """A schedule's decomposition for one world size, in issue order."""

    direction: Direction = "gather"
    """``gather`` (all-gather -> GEMM) or ``scatter`` (GEMM -> reduce-scatter)."""
    world_size: int = 2
    splits: int = 1
    """Sub-chunks per shard (1 unless ``finer``)."""
    rounds: tuple[tuple[Piece, ...], ...] = ()
    """Transfer batches in issue order (gather; scatter issues each unit's pieces right after its GEMM)."""
    units: tuple[Unit, ...] = ()
    """GEMMs in issue order."""
    lanes: int = 1
    """Pieces in flight at once: one per peer when a round moves every peer's piece (``serial``, ``finer``),
    1 for a ring of one shard per round (``shard``). A copy-engine call spreads them over at most this many
    side streams (``executor.lanes.copy_lanes``)."""


def lane_of(piece: Piece, lanes: int) -> int:
    """The copy lane that moves ``piece`` when a call spreads its pieces over ``lanes`` lanes: peers in ring
    order (offset 1, 2, ...) take the lanes in turn."""
    return (piece.offset - 1) % lanes


@lru_cache(maxsize=512)
def make_plan(direction: Direction, world_size: int, granularity: str, splits: int, grain: str) -> Plan:
    """The plan of a schedule (``granularity``, ``splits``, ``grain`` as in ``features.Schedule``).

    - ``serial``: one round moving every peer's whole shard; one GEMM over all rows.
    - ``shard``: ring order, one shard per round (``offset`` 1, 2, ...); one GEMM per shard, the own shard
      first for gather (it needs no transfer) and last for scatter (it is not sent).
    - ``finer``: round ``j`` moves sub-chunk ``j`` of every peer's shard at once (one lane per peer);
      grain ``chunk`` runs one GEMM per piece, grain ``shard`` one GEMM per peer shard once all of its
      sub-chunks have moved.
    """
    if world_size < 2:
        raise ValueError(f"make_plan needs world_size >= 2; got {world_size}")
    peers = range(1, world_size)
    own = Unit(offset=0, first_sub=0, n_subs=splits)
    if granularity == "serial":
        pieces = tuple(Piece(offset=o, sub=0) for o in peers)
        return Plan(
            direction=direction,
            world_size=world_size,
            splits=1,
            rounds=(pieces,),
            units=(Unit(offset=None, pieces=pieces),),
            lanes=world_size - 1,
        )
    if granularity == "shard":
        rounds = tuple((Piece(offset=o, sub=0),) for o in peers)
        peer_units = tuple(Unit(offset=o, pieces=(Piece(offset=o, sub=0),)) for o in peers)
        lanes = 1
    elif granularity == "finer":
        rounds = tuple(tuple(Piece(offset=o, sub=j) for o in peers) for j in range(splits))
        if grain == "chunk":
            peer_units = tuple(
                Unit(offset=p.offset, first_sub=p.sub, n_subs=1, pieces=(p,))
                for batch in rounds
                for p in batch
            )
        else:
            peer_units = tuple(
                Unit(offset=o, n_subs=splits, pieces=tuple(Piece(offset=o, sub=j) for j in range(splits)))
                for o in peers
            )
        lanes = world_size - 1
    else:
        raise ValueError(f"granularity must be one of ['serial', 'shard', 'finer']; got {granularity!r}")
    units = (own, *peer_units) if direction == "gather" else (*peer_units, own)
    return Plan(
        direction=direction, world_size=world_size, splits=splits, rounds=rounds, units=units, lanes=lanes
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """Where one rank's blocks lie, per peer ``p`` (the rank itself included): the block it sends to ``p``
    (rows of its source), the block it receives from ``p`` (rows of its destination), and where its block
    lands in ``p``'s destination. Sub-chunk ``j`` of a block of ``n`` rows is its rows
    ``[j * n // splits, (j + 1) * n // splits)`` (exact shards when ``splits`` divides ``n``)."""

    direction: Direction = "gather"
    """The plan direction: who the rank sends a piece to and receives it from (module docstring)."""
    rank: int = 0
    splits: int = 1
    """Sub-chunks per block."""
    send_start: tuple[int, ...] = (0, 0)
    """Per peer: first source row of the block sent to it."""
    send_rows: tuple[int, ...] = (1, 1)
    """Per peer: rows sent to it."""
    recv_start: tuple[int, ...] = (0, 1)
    """Per peer: first destination row of the block received from it."""
    recv_rows: tuple[int, ...] = (1, 1)
    """Per peer: rows received from it."""
    remote_start: tuple[int, ...] = (0, 0)
    """Per peer: first row of that peer's destination where the block sent to it lands."""
    dest_rows: tuple[int, ...] = (2, 2)
    """Per peer: rows of that peer's whole destination (its peer-memory buffer)."""

    @property
    def world_size(self) -> int:
        return len(self.send_rows)

    @classmethod
    def shards(cls, direction: Direction, rank: int, world_size: int, shard_rows: int, splits: int) -> Layout:
        """The all-gather (``gather``: the own shard goes to every peer) or reduce-scatter (``scatter``: the
        partial rows of peer ``p``'s shard go to ``p``) layout: shards of ``shard_rows`` rows, slot ``q``
        of the destination holding what rank ``q`` sent."""
        w, r = world_size, shard_rows
        return cls(
            direction=direction,
            rank=rank,
            splits=splits,
            send_start=(0,) * w if direction == "gather" else tuple(p * r for p in range(w)),
            send_rows=(r,) * w,
            recv_start=tuple(q * r for q in range(w)),
            recv_rows=(r,) * w,
            remote_start=(rank * r,) * w,
            dest_rows=(w * r,) * w,
        )

    @classmethod
    def routed(
        cls, direction: Direction, rank: int, moved: tuple[tuple[int, ...], ...], splits: int
    ) -> Layout:
        """An all-to-all: rank ``src`` sends ``moved[src][dst]`` rows to rank ``dst``; every source holds
        its blocks in destination order, every destination its blocks in source order."""
        w = len(moved)
        into = [[moved[q][p] for q in range(w)] for p in range(w)]  # into[p][q]: rows p receives from q
        return cls(
            direction=direction,
            rank=rank,
            splits=splits,
            send_start=block_starts(moved[rank]),
            send_rows=tuple(moved[rank]),
            recv_start=block_starts(into[rank]),
            recv_rows=tuple(into[rank]),
            remote_start=tuple(block_starts(into[p])[rank] for p in range(w)),
            dest_rows=tuple(sum(into[p]) for p in range(w)),
        )

    def peer_to(self, piece: Piece) -> int:
        """The rank this rank sends ``piece`` to."""
        step = -piece.offset if self.direction == "gather" else piece.offset
        return (self.rank + step) % self.world_size

    def peer_from(self, piece: Piece) -> int:
        """The rank this rank receives ``piece`` from."""
        step = piece.offset if self.direction == "gather" else -piece.offset
        return (self.rank + step) % self.world_size

    def _sub(self, rows: int, first: int, count: int) -> tuple[int, int]:
        """Rows ``[start, stop)`` of sub-chunks ``first .. first + count - 1`` of a block of ``rows``."""
        return first * rows // self.splits, (first + count) * rows // self.splits

    def sent(self, piece: Piece) -> slice:
        """Source rows sent as ``piece``."""
        peer = self.peer_to(piece)
        lo, hi = self._sub(self.send_rows[peer], piece.sub, 1)
        return slice(self.send_start[peer] + lo, self.send_start[peer] + hi)

    def landed(self, piece: Piece) -> slice:
        """Destination rows where ``piece`` lands here."""
        peer = self.peer_from(piece)
        lo, hi = self._sub(self.recv_rows[peer], piece.sub, 1)
        return slice(self.recv_start[peer] + lo, self.recv_start[peer] + hi)

    def remote(self, piece: Piece) -> slice:
        """Rows of the receiver's destination where this rank's ``piece`` lands."""
        peer = self.peer_to(piece)
        lo, hi = self._sub(self.send_rows[peer], piece.sub, 1)
        return slice(self.remote_start[peer] + lo, self.remote_start[peer] + hi)

    def own_block(self) -> tuple[slice, slice]:
        """The rows the rank keeps: where they lie in its source and in its destination."""
        r = self.rank
        return (
            slice(self.send_start[r], self.send_start[r] + self.send_rows[r]),
            slice(self.recv_start[r], self.recv_start[r] + self.recv_rows[r]),
        )

    def block_of(self, unit: Unit) -> tuple[int, int, int]:
        """``(peer, start, stop)``: the peer whose block ``unit``'s GEMM covers and the rows of that block
        it covers (``[0, rows)``: the whole block). gather: the block received from the peer; scatter: the
        block sent to it. Not for ``whole`` units (``offset`` None)."""
        peer = (self.rank + unit.offset) % self.world_size
        rows = self.recv_rows[peer] if self.direction == "gather" else self.send_rows[peer]
        return (peer, *self._sub(rows, unit.first_sub, unit.n_subs))

    def split_rows(self, unit: Unit) -> slice:
        """The rows ``unit``'s GEMM covers: of the destination (gather) or of the source (scatter)."""
        gather = self.direction == "gather"
        if unit.offset is None:
            return slice(0, sum(self.recv_rows if gather else self.send_rows))
        peer, lo, hi = self.block_of(unit)
        start = (self.recv_start if gather else self.send_start)[peer]
        return slice(start + lo, start + hi)


def block_starts(rows: Sequence[int]) -> tuple[int, ...]:
    """Running sums: where each of consecutive blocks of ``rows`` starts."""
    return tuple(accumulate(rows, initial=0))[:-1]
