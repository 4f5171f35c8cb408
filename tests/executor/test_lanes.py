"""The CUDA stream ordering of the copy-engine transport, checked without a GPU.

``torch.cuda``'s streams, events and stream context are replaced by fakes that keep vector clocks (one
counter per stream; an event record copies the stream's clock, a stream wait takes the element-wise
maximum), so ``DeviceLanes`` and ``PeerCopyTransport`` run their real CUDA-path code on the CPU and every
ordering the executor relies on can be asserted as happens-before between logged operations.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from executor_world import run_world

from ficco.executor.lanes import DeviceLanes
from ficco.executor.pipeline import run_pipeline
from ficco.executor.plan import make_plan
from ficco.executor.transport import PeerCopyTransport


class FakeStream:
    names = itertools.count()

    def __init__(self, name: str | None = None, **_: object) -> None:
        self.name = name or f"lane{next(FakeStream.names)}"
        self.clock: dict[str, int] = {}

    def tick(self) -> dict[str, int]:
        self.clock[self.name] = self.clock.get(self.name, 0) + 1
        return dict(self.clock)

    def wait_event(self, event: FakeEvent) -> None:
        for name, count in event.clock.items():
            self.clock[name] = max(self.clock.get(name, 0), count)


class FakeEvent:
    def __init__(self, **_: object) -> None:
        self.clock: dict[str, int] = {}

    def record(self, stream: FakeStream) -> None:
        self.clock = dict(stream.clock)


class FakeCuda:
    """The current stream and a log of (what, stream name, vector clock) operations."""

    def __init__(self) -> None:
        self.current = FakeStream("current")
        self.log: list[tuple[str, str, dict[str, int]]] = []

    def op(self, what: str) -> None:
        self.log.append((what, self.current.name, self.current.tick()))

    def set_stream(self, stream: FakeStream) -> None:
        self.current = stream


def _before(first: tuple, then: tuple) -> bool:
    """``first`` happens before ``then`` (vector clocks)."""
    return first[2][first[1]] <= then[2].get(first[1], 0)


class FakeWorkspace:
    """Peer memory of one rank whose peers are the same process: pushes land in this rank's slots."""

    def __init__(self, cuda: FakeCuda, shape: tuple[int, ...]) -> None:
        self.cuda = cuda
        self.dest = torch.zeros(shape)

    def slots(self, peer: int, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        numel = 1
        for size in shape:
            numel *= size
        return self.dest.view(-1)[:numel].view(shape)

    def rows(self, peer: int, width: int, dtype: torch.dtype) -> torch.Tensor:
        return self.dest.view(-1, width)

    def barrier(self) -> None:
        self.cuda.op("barrier")

    def advance(self) -> None:
        pass


class LoggedCopy:
    def __init__(self, cuda: FakeCuda, target: torch.Tensor) -> None:
        self.cuda, self.target = cuda, target

    def copy_(self, source: torch.Tensor) -> None:
        self.cuda.op("copy")
        self.target.copy_(source)


@pytest.fixture
def cuda(monkeypatch):
    fake = FakeCuda()
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: fake.current)
    monkeypatch.setattr(DeviceLanes, "caller_stream", lambda self: fake.current)
    monkeypatch.setattr(torch.cuda, "set_stream", fake.set_stream)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    return fake


@pytest.mark.parametrize(
    ("direction", "granularity", "splits", "grain"),
    [
        ("gather", "shard", 1, "shard"),  # one round on one lane: the barrier runs on the copy lane
        ("gather", "serial", 1, "whole"),
        ("gather", "finer", 2, "chunk"),  # two rounds: barriers on the signal lane
        ("scatter", "shard", 1, "shard"),
        ("scatter", "serial", 1, "whole"),
        ("scatter", "finer", 2, "chunk"),
    ],
)
@pytest.mark.parametrize(("world_size", "count"), [(2, None), (4, None), (4, 2), (4, 1)])
def test_device_lanes_order_every_copy_barrier_and_gemm(
    cuda, direction, granularity, splits, grain, world_size, count
):
    """Every copy after the fork, before its barrier and the join; gathered pieces read only after their
    round's barrier, scattered ones pushed only after their GEMM; with the peers' pieces on one lane per
    peer (``count`` None) or sharing fewer lanes in ring order."""
    shard_rows, width = 4, 3
    plan = make_plan(direction, world_size, granularity, splits, grain)
    count = plan.lanes if count is None else min(count, plan.lanes)
    workspace = FakeWorkspace(cuda, (world_size, shard_rows, width))
    lanes = DeviceLanes(torch.device("cpu"), count, high_priority=False)
    rows = shard_rows if direction == "gather" else world_size * shard_rows
    transport = PeerCopyTransport(
        workspace=workspace,
        plan=plan,
        rank=0,
        source=torch.ones(rows, width),
        dest=workspace.dest,
        lanes=lanes,
    )
    transport.remote_incoming = lambda piece, plain=transport.remote_incoming: LoggedCopy(cuda, plain(piece))

    for call in range(2):  # the second call reuses every cached event
        start = len(cuda.log)
        cuda.op("before")
        run_pipeline(plan, transport, lambda _rows, unit: cuda.op(f"mm {unit.offset}/{unit.first_sub}"))
        assert cuda.current.name == "current", "a lane was left current"
        cuda.op("after")
        log = cuda.log[start:]
        before, after = log[0], log[-1]
        copies = [e for e in log if e[0] == "copy"]
        barriers = [e for e in log if e[0] == "barrier"]
        gemms = [e for e in log if e[0].startswith("mm")]
        assert copies and len(barriers) == (len(plan.rounds) if direction == "gather" else 1), call
        assert all(_before(before, e) for e in copies + barriers), "a lane started before the fork"
        assert all(_before(e, after) for e in log[1:-1]), "the join missed a lane"
        if direction == "gather":
            peer_gemms = [g for g in gemms if not g[0].startswith("mm 0/")]
            for j, barrier in enumerate(barriers):
                round_copies = copies[j * len(plan.rounds[j]) : (j + 1) * len(plan.rounds[j])]
                assert all(_before(c, barrier) for c in round_copies), "a barrier ran before its copies"
            per_round = len(peer_gemms) // len(barriers)  # shard, finer chunk: a GEMM per piece
            for j, barrier in enumerate(barriers):
                round_gemms = peer_gemms[j * per_round : (j + 1) * per_round]
                assert all(_before(barrier, g) for g in round_gemms), "read before landed"
            on_copy_lane = len(plan.rounds) == 1 and count == 1
            assert (barriers[0][1] == copies[0][1]) == on_copy_lane
        else:
            assert all(_before(c, barriers[0]) for c in copies), "the barrier ran before a push"
            producers = [g for g in gemms if not g[0].startswith("mm 0/")]
            per_gemm = len(copies) // len(producers)  # serial: one GEMM produces every piece
            for i, copy in enumerate(copies):
                assert _before(producers[i // per_gemm], copy), "pushed before produced"
        streams = {stream for _, stream, _ in copies}
        assert len(streams) == count, f"copies on {sorted(streams)}, expected {count} lanes"
        if count < world_size - 1:  # peers share lanes: a lane's copies follow each other in ring order
            for stream in streams:
                mine = [c for c in copies if c[1] == stream]
                assert all(_before(a, b) for a, b in itertools.pairwise(mine))


def test_growing_peer_memory_inside_graph_capture_names_the_schedule(monkeypatch):
    """The first call of a shape grows the peer memory (a rendezvous): inside capture it is refused with an
    error naming the schedule and the fix, before anything collective starts."""
    from ficco.executor import CaptureError
    from ficco.executor.context import GroupContext

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    ctx = GroupContext(group=None, device=torch.device("cuda", 0), rank=0, world_size=2, global_ranks=[0, 1])
    grows = r"schedule shard/dma .* grows the peer memory to 4\.0 MiB per half"
    with pytest.raises(CaptureError, match=grows):
        ctx.get_workspace(4 << 20, what="schedule shard/dma")
    with pytest.raises(CaptureError, match=r"creates the high-priority NCCL group.*once eagerly"):
        ctx.p2p_group(True, what="schedule shard/sm/hp")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert ctx.p2p_group(False) is None  # normal priority: the caller's group, nothing created
    assert ctx.p2p_high is None


@pytest.mark.parametrize("direction", ["gather", "scatter"])
def test_inline_lanes_put_every_copy_and_the_barrier_on_the_callers_stream(cuda, direction):
    """``communicate``'s copy path on two ranks (``lanes=0``): the all-to-all's copies, then its barrier,
    all on the caller's stream, in that order; no side stream is made."""
    from ficco.executor.lanes import InlineLanes
    from ficco.executor.plan import Layout

    moved = ((3, 5), (2, 7))
    plan = make_plan(direction, 2, "serial", 1, "whole")
    layout = Layout.routed(direction, 0, moved, 1)
    workspace = FakeWorkspace(cuda, (16, 3))
    transport = PeerCopyTransport(
        workspace=workspace,
        plan=plan,
        rank=0,
        source=torch.ones(sum(layout.send_rows), 3),
        dest=workspace.slots(0, (sum(layout.recv_rows), 3), torch.float32),
        lanes=InlineLanes(),
        layout=layout,
    )
    transport.remote_incoming = lambda piece, plain=transport.remote_incoming: LoggedCopy(cuda, plain(piece))
    streams = FakeStream.names
    made_before = next(streams)
    run_pipeline(plan, transport, None)
    assert next(streams) == made_before + 1, "a side stream was made"
    assert [(what, stream) for what, stream, _ in cuda.log] == [("copy", "current"), ("barrier", "current")]


def test_making_the_routing_permutation_inside_graph_capture_names_the_schedule(monkeypatch):
    """A routing first seen inside capture would copy its row permutation to the device: refused, naming
    the schedule and the fix, before any work is issued."""
    from ficco.executor import CaptureError
    from ficco.executor.context import GroupContext
    from ficco.executor.experts import RoutedState
    from ficco.executor.ops import _permutation
    from ficco.features import Routing, Schedule

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    ctx = GroupContext(group=None, device=torch.device("cuda", 0), rank=0, world_size=2, global_ranks=[0, 1])
    state = RoutedState(routing=Routing([[[1], [2]], [[3], [4]]]), rank=0)
    with pytest.raises(CaptureError, match=r"schedule serial/dma .* row permutation .* once eagerly"):
        _permutation(ctx, state, Schedule.parse("serial/dma"))


def test_copy_streams_parse_print_and_look_up_by_piece_size():
    from ficco.executor.lanes import CopyStreams

    assert CopyStreams.parse("per_peer") == CopyStreams()
    one = CopyStreams.parse("1")
    assert one.at(0) == one.at(1 << 40) == 1 and str(one) == "1"
    table = CopyStreams.parse("0:1;16:per_peer")
    assert table.bounds == (0, 16 << 20) and table.streams == (1, None)
    assert table.at((16 << 20) - 1) == 1 and table.at(16 << 20) is None
    assert str(table) == "0:1;16:per_peer" and CopyStreams.parse(str(table)) == table
    for bad in ("0", "two", "1:per_peer", "0:1;0:2", "0:1;8", "-1"):
        with pytest.raises(ValueError, match=r"copy streams .* are none of 'per_peer'"):
            CopyStreams.parse(bad)


@pytest.mark.parametrize(
    ("policy", "peers", "overlaps", "lanes"),
    [
        ("per_peer", 3, True, 3),  # finer at 4 ranks: every peer's piece at once
        ("per_peer", 3, False, 3),  # serial: the same, nothing to overlap but three copies at once
        ("per_peer", 1, False, 0),  # serial at 2 ranks: one copy, on the caller's stream
        ("per_peer", 1, True, 1),  # shard: a ring on one side lane, beside the GEMMs
        ("1", 3, True, 1),  # ring order on one side lane beside the GEMMs
        ("1", 3, False, 0),  # ring order on the caller's stream
        ("2", 3, True, 2),
        ("2", 7, False, 2),
    ],
)
def test_copy_lanes_cap_the_peers_in_flight_and_keep_a_lone_serial_lane_inline(
    policy, peers, overlaps, lanes
):
    from ficco.executor.lanes import CopyStreams, copy_lanes

    assert copy_lanes(CopyStreams.parse(policy), peers, 1 << 20, overlaps) == lanes


def test_copy_lanes_follow_the_table_by_piece_size():
    from ficco.executor.lanes import CopyStreams, copy_lanes

    table = CopyStreams.parse("0:1;16:per_peer")
    assert copy_lanes(table, 3, 4 << 20, overlaps=False) == 0
    assert copy_lanes(table, 3, 4 << 20, overlaps=True) == 1
    assert copy_lanes(table, 3, 64 << 20, overlaps=True) == 3


def _lanes_asked(rank: int, world_size: int) -> dict:
    """Runs on every rank: the copy lanes each dma call asks its context for, under each arrangement, and
    whether the results still match serial."""
    from ficco import executor
    from ficco.executor.context import GroupContext
    from ficco.features import Routing

    asked: list[int] = []
    plain = GroupContext.get_lanes

    def get_lanes(self, count, high_priority):
        asked.append(count)
        return plain(self, count, high_priority)

    GroupContext.get_lanes = get_lanes
    gen = torch.Generator().manual_seed(rank)
    a_shard, b = torch.randn(8, 16, generator=gen), torch.randn(16, 8, generator=gen)
    routing = Routing([[[2]] * world_size] * world_size)
    x, w_experts = torch.randn(2 * world_size, 16, generator=gen), torch.randn(1, 16, 8, generator=gen)
    want = executor.all_gather_matmul(a_shard, b, "serial/sm")
    out: dict = {}
    try:
        for policy in ("per_peer", "1", "2"):
            executor.set_copy_streams(policy)
            for schedule in ("serial/dma", "shard/dma", "finer/dma/s2/chunk"):
                executor.clear_buffers()  # no transport kept from another call: each asks for its lanes
                asked.clear()
                got = executor.all_gather_matmul(a_shard, b, schedule)
                executor.all_to_all_matmul(x, w_experts, routing, schedule)
                out[(policy, schedule)] = (list(asked), bool(torch.allclose(got, want, atol=1e-5)))
            executor.clear_buffers()
            asked.clear()
            executor.communicate("ag_gemm", a_shard, "dma")
            executor.communicate("ag_gemm", a_shard, "dma", streams="per_peer")
            out[(policy, "communicate")] = list(asked)
    finally:
        GroupContext.get_lanes = plain
        executor.set_copy_streams("per_peer")
    return out


def test_the_copy_arrangement_sets_the_lanes_of_every_copy_engine_call():
    """At 4 ranks (3 peers): ``per_peer`` gives serial and finer calls 3 lanes, ``1`` runs serial on the
    caller's stream and finer on one lane, ``2`` caps both at 2; shard (one peer at a time) keeps 1; the
    all-to-all follows the same rule; ``communicate(streams="per_peer")`` ignores the arrangement."""
    out = run_world(4, _lanes_asked)[0]
    lanes = {key: value[0] if isinstance(value, tuple) else value for key, value in out.items()}
    assert all(ok for value in out.values() if isinstance(value, tuple) for ok in value[1:])
    assert lanes[("per_peer", "serial/dma")] == [3, 3]
    assert lanes[("1", "serial/dma")] == [0, 0]
    assert lanes[("2", "serial/dma")] == [2, 2]
    for policy in ("per_peer", "1", "2"):
        assert lanes[(policy, "shard/dma")] == [1, 1]
    assert lanes[("per_peer", "finer/dma/s2/chunk")] == [3, 3]
    assert lanes[("1", "finer/dma/s2/chunk")] == [1, 1]
    assert lanes[("2", "finer/dma/s2/chunk")] == [2, 2]
    assert lanes[("per_peer", "communicate")] == [3, 3]
    assert lanes[("1", "communicate")] == [0, 3]


def test_a_bad_copy_arrangement_in_the_environment_names_the_variable(monkeypatch):
    from ficco.executor import context

    monkeypatch.setenv(context.COPY_STREAMS_ENV, "several")
    with pytest.raises(ValueError, match="FICCO_COPY_STREAMS: copy streams 'several' are none of"):
        context._copy_streams_from_env()
    monkeypatch.setenv(context.COPY_STREAMS_ENV, "0:1;16:per_peer")
    assert str(context._copy_streams_from_env()) == "0:1;16:per_peer"


def test_waiting_on_work_never_recorded_is_an_error_not_a_no_op(cuda):
    """A wait on a key nothing recorded would order nothing (a race); it raises instead."""
    lanes = DeviceLanes(torch.device("cpu"), 2, high_priority=False)
    lanes.fork(signal=True)
    lanes.mark_produced(0)
    lanes.after_produced(1, 0)  # recorded: fine
    with pytest.raises(KeyError):
        lanes.after_produced(1, 7)
    with pytest.raises(KeyError):
        lanes.signal_after([0], key=3, barrier=lambda: None)  # round 3's copies were never marked
    with pytest.raises(KeyError):
        lanes.wait_signal(5)
