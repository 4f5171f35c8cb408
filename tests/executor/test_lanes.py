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
        ("scatter", "finer", 2, "chunk"),
    ],
)
def test_device_lanes_order_every_copy_barrier_and_gemm(cuda, direction, granularity, splits, grain):
    world_size, shard_rows, width = 2, 4, 3
    plan = make_plan(direction, world_size, granularity, splits, grain)
    workspace = FakeWorkspace(cuda, (world_size, shard_rows, width))
    lanes = DeviceLanes(torch.device("cpu"), plan.lanes, high_priority=False)
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
            assert len(peer_gemms) == len(barriers)  # these plans: one GEMM per round
            assert all(_before(b, g) for b, g in zip(barriers, peer_gemms, strict=True)), "read before landed"
            on_copy_lane = len(plan.rounds) == 1 and plan.lanes == 1
            assert (barriers[0][1] == copies[0][1]) == on_copy_lane
        else:
            assert all(_before(c, barriers[0]) for c in copies), "the barrier ran before a push"
            producers = [g for g in gemms if not g[0].startswith("mm 0/")]
            assert all(_before(producers[i], copies[i]) for i in range(len(copies))), "pushed before produced"


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
    with pytest.raises(
        CaptureError, match=r"schedule shard/sm/cta8 .* creates the NCCL group capped at 8 CTAs"
    ):
        ctx.p2p_group(False, 8, what="schedule shard/sm/cta8")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert ctx.p2p_group(False) is None  # normal priority, no cap: the caller's group, nothing created
    assert ctx.p2p_groups == {}


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
