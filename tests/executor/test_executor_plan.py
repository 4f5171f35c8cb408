"""Plans: every schedule's units cover the rows once, every piece moves once, both ends agree."""

from __future__ import annotations

import pytest
import torch

from ficco.executor.lanes import InlineLanes
from ficco.executor.plan import Layout, Piece, Unit, lane_of, make_plan
from ficco.executor.transport import PointToPointTransport
from ficco.features import all_schedules

OVERLAPPED = [s for s in all_schedules() if s.granularity != "serial"]


def shard_rows_of(unit: Unit, *, rank: int, world_size: int, shard_rows: int, splits: int) -> slice:
    """The split rows ``[start, stop)`` that ``unit`` covers on ``rank`` (``shard_rows`` = m / world_size)."""
    if unit.offset is None:
        return slice(0, world_size * shard_rows)
    owner = (rank + unit.offset) % world_size
    sub_rows = shard_rows // splits
    start = owner * shard_rows + unit.first_sub * sub_rows
    return slice(start, start + unit.n_subs * sub_rows)


def _plan(direction, world_size, schedule):
    return make_plan(direction, world_size, schedule.granularity, schedule.splits, schedule.grain)


@pytest.mark.parametrize("direction", ["gather", "scatter"])
@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_make_plan_units_cover_every_row_once(direction, world_size):
    shard_rows = 16
    for schedule in all_schedules():
        plan = _plan(direction, world_size, schedule)
        for rank in range(world_size):
            covered = sorted(
                (s.start, s.stop)
                for s in (
                    shard_rows_of(
                        u, rank=rank, world_size=world_size, shard_rows=shard_rows, splits=plan.splits
                    )
                    for u in plan.units
                )
            )
            edges = [0] + [stop for _, stop in covered]
            assert [start for start, _ in covered] == edges[:-1], (schedule, rank, covered)
            assert edges[-1] == world_size * shard_rows, (schedule, rank)


@pytest.mark.parametrize("direction", ["gather", "scatter"])
@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_make_plan_moves_every_peer_piece_once(direction, world_size):
    for schedule in all_schedules():
        plan = _plan(direction, world_size, schedule)
        expected = {Piece(offset=o, sub=j) for o in range(1, world_size) for j in range(plan.splits)}
        issued = [p for batch in plan.rounds for p in batch]
        consumed = [p for unit in plan.units for p in unit.pieces]
        assert sorted(issued, key=str) == sorted(expected, key=str), schedule
        assert sorted(consumed, key=str) == sorted(expected, key=str), schedule


def test_make_plan_orders_the_own_shard_first_for_gather_and_last_for_scatter():
    for schedule in OVERLAPPED:
        assert _plan("gather", 4, schedule).units[0].offset == 0, schedule
        assert _plan("scatter", 4, schedule).units[-1].offset == 0, schedule


def test_make_plan_fetches_all_peers_at_once_only_for_finer():
    for schedule in OVERLAPPED:
        plan = _plan("gather", 4, schedule)
        if schedule.granularity == "finer":
            assert plan.lanes == 3 and len(plan.rounds) == schedule.splits
            assert all(len(batch) == 3 for batch in plan.rounds)
            assert {lane_of(p, plan.lanes) for p in plan.rounds[0]} == {0, 1, 2}
            assert {lane_of(p, 1) for p in plan.rounds[0]} == {0}
        else:
            assert plan.lanes == 1 and [b[0].offset for b in plan.rounds] == [1, 2, 3]


def test_make_plan_grain_chunk_runs_one_gemm_per_piece_and_shard_one_per_shard():
    chunk = make_plan("gather", 4, "finer", 4, "chunk")
    shard = make_plan("gather", 4, "finer", 4, "shard")
    assert len(chunk.units) == 1 + 3 * 4
    assert len(shard.units) == 1 + 3 and all(len(u.pieces) == 4 for u in shard.units[1:])


def test_make_plan_rejects_bad_arguments():
    with pytest.raises(ValueError, match="world_size >= 2"):
        make_plan("gather", 1, "shard", 1, "shard")
    with pytest.raises(ValueError, match="granularity must be one of"):
        make_plan("gather", 2, "coarse", 1, "shard")


@pytest.mark.parametrize("direction", ["gather", "scatter"])
def test_point_to_point_ends_agree_on_every_piece(direction):
    world_size, shard_rows = 4, 8
    for schedule in OVERLAPPED:
        plan = _plan(direction, world_size, schedule)
        ends = [
            PointToPointTransport(
                group=None,
                global_ranks=list(range(world_size)),
                plan=plan,
                rank=r,
                source=torch.zeros(shard_rows if direction == "gather" else world_size * shard_rows, 2),
                dest=torch.zeros(world_size, shard_rows, 2),
                lanes=InlineLanes(),
            )
            for r in range(world_size)
        ]
        for batch in plan.rounds:
            for piece in batch:
                for r, end in enumerate(ends):
                    assert ends[end.layout.peer_to(piece)].layout.peer_from(piece) == r, (schedule, piece, r)


@pytest.mark.parametrize("direction", ["gather", "scatter"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_shard_layout_is_the_shard_arithmetic(direction, world_size):
    for schedule in all_schedules():
        plan = _plan(direction, world_size, schedule)
        for rank in range(world_size):
            layout = Layout.shards(direction, rank, world_size, 16, plan.splits)
            for unit in plan.units:
                expected = shard_rows_of(
                    unit, rank=rank, world_size=world_size, shard_rows=16, splits=plan.splits
                )
                assert layout.split_rows(unit) == expected, (schedule, rank, unit)


ROUTED = {  # moved[src][dst]: rows each rank sends each rank in one all-to-all (zeros, odd sizes)
    2: ((3, 5), (0, 7)),
    4: ((2, 0, 7, 1), (3, 3, 0, 5), (1, 11, 2, 0), (0, 4, 4, 9)),
}


@pytest.mark.parametrize("direction", ["gather", "scatter"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_routed_layout_units_cover_every_row_once(direction, world_size):
    moved = ROUTED[world_size]
    for schedule in all_schedules():
        plan = _plan(direction, world_size, schedule)
        for rank in range(world_size):
            layout = Layout.routed(direction, rank, moved, plan.splits)
            covered = sorted((layout.split_rows(u).start, layout.split_rows(u).stop) for u in plan.units)
            edges = [0] + [stop for _, stop in covered]
            assert [start for start, _ in covered] == edges[:-1], (schedule, rank, covered)
            total = sum(layout.recv_rows) if direction == "gather" else sum(layout.send_rows)
            assert edges[-1] == total, (schedule, rank)


@pytest.mark.parametrize("direction", ["gather", "scatter"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_routed_layout_pushes_land_where_the_receiver_reads_them(direction, world_size):
    moved = ROUTED[world_size]
    for splits in (1, 2, 8):
        layouts = [Layout.routed(direction, r, moved, splits) for r in range(world_size)]
        sent_rows = {r: set() for r in range(world_size)}
        for offset in range(1, world_size):
            for sub in range(splits):
                piece = Piece(offset=offset, sub=sub)
                for r, layout in enumerate(layouts):
                    receiver = layouts[layout.peer_to(piece)]
                    assert receiver.peer_from(piece) == r
                    assert layout.remote(piece) == receiver.landed(piece), (splits, piece, r)
                    sent = layout.sent(piece)
                    assert (
                        sent.stop - sent.start == receiver.landed(piece).stop - receiver.landed(piece).start
                    )
                    sent_rows[r] |= set(range(sent.start, sent.stop))
        for r, layout in enumerate(layouts):  # every row but the kept block is sent exactly once
            own_source, _ = layout.own_block()
            assert sent_rows[r] == set(range(sum(layout.send_rows))) - set(
                range(own_source.start, own_source.stop)
            )
