"""Decomposition plans: which pieces move in which order, and which GEMMs consume or produce them.

A plan is plain Python over rank *offsets*, so the same plan serves every rank and two ranks' plans
always match piece for piece (what point-to-point transports need). Rows are the split rows of the
scenario (``m``): rank ``q`` owns the shard ``[q * R, (q + 1) * R)`` with ``R = m / world_size``, and
``finer`` splits each shard into ``splits`` sub-chunks of ``R / splits`` rows.

``gather`` (all-gather -> GEMM): rank ``r`` receives piece ``(offset, sub)`` from rank ``(r + offset) % w``
and sends its own sub-chunk ``sub`` to rank ``(r - offset) % w``; a unit's GEMM consumes pieces.
``scatter`` (GEMM -> reduce-scatter): a unit's GEMM produces the partial rows of the shard owned by rank
``(r + offset) % w``; piece ``(offset, sub)`` is sent there, and the same piece arrives from
``(r - offset) % w``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
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
    """Ranks in the group."""
    splits: int = 1
    """Sub-chunks per shard (1 unless ``finer``)."""
    rounds: tuple[tuple[Piece, ...], ...] = ()
    """Transfer batches in issue order (gather; scatter issues each unit's pieces right after its GEMM)."""
    units: tuple[Unit, ...] = ()
    """GEMMs in issue order."""
    lanes: int = 1
    """Copy lanes (side streams) the pieces spread over: one per peer when all peers move at once."""

    def lane_of(self, piece: Piece) -> int:
        """The copy lane that moves ``piece``."""
        return (piece.offset - 1) % self.lanes


@lru_cache(maxsize=512)
def make_plan(direction: Direction, world_size: int, granularity: str, splits: int, grain: str) -> Plan:
    """The plan of a schedule (``granularity``, ``splits``, ``grain`` as in ``features.Schedule``).

    - ``serial``: one round moving every peer's whole shard; one GEMM over all rows.
    - ``shard``: ring order, one shard per round (``offset`` 1, 2, ...); one GEMM per shard, the own shard
      first for gather (it needs no transfer) and last for scatter (it is not sent).
    - ``finer``: round ``j`` moves sub-chunk ``j`` of every peer's shard at once (one lane per peer);
      grain ``chunk`` runs one GEMM per piece, grain ``shard`` one GEMM per peer shard once all of its
      sub-chunks have moved.

    Plans are immutable and cached (a call on the hot path only looks one up).
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


def shard_rows_of(unit: Unit, *, rank: int, world_size: int, shard_rows: int, splits: int) -> slice:
    """The split rows ``[start, stop)`` that ``unit`` covers on ``rank`` (``shard_rows`` = m / world_size)."""
    if unit.offset is None:
        return slice(0, world_size * shard_rows)
    owner = (rank + unit.offset) % world_size
    sub_rows = shard_rows // splits
    start = owner * shard_rows + unit.first_sub * sub_rows
    return slice(start, start + unit.n_subs * sub_rows)


def sub_rows_of(piece: Piece, *, shard_rows: int, splits: int) -> slice:
    """The rows of ``piece`` within its shard (``[sub * R / splits, (sub + 1) * R / splits)``)."""
    sub_rows = shard_rows // splits
    return slice(piece.sub * sub_rows, (piece.sub + 1) * sub_rows)
