"""The NCCL path of the point-to-point transport (one coalesced group per batch), checked on the CPU with
a group that records its calls and lanes that do nothing."""

from __future__ import annotations

import pytest
import torch

from ficco.executor.lanes import InlineLanes
from ficco.executor.pipeline import run_pipeline
from ficco.executor.plan import make_plan
from ficco.executor.transport import PointToPointTransport


class RecordingGroup:
    """Records ``_start_coalescing``/``send``/``recv``/``_end_coalescing``; receives are filled with the
    sender's group rank + 1 (what landed), and every work is already done."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def _start_coalescing(self, device: torch.device) -> None:
        self.calls.append(("start", str(device)))

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Work:
        self.calls.append(("send", dst, tag, tensors[0].data_ptr()))
        return Work()  # gloo's per-op work (a coalesced group returns one at its end instead)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Work:
        tensors[0].fill_(src + 1)
        self.calls.append(("recv", src, tag))
        return Work()

    def _end_coalescing(self, device: torch.device) -> Work:
        self.calls.append(("end",))
        return Work()


class Work:
    def wait(self) -> None:
        pass


@pytest.mark.parametrize(("granularity", "splits", "grain"), [("shard", 1, "shard"), ("finer", 2, "chunk")])
def test_coalesced_gather_sends_the_own_rows_and_receives_every_peer(granularity, splits, grain):
    world_size, rank, shard_rows, width = 3, 1, 4, 2
    plan = make_plan("gather", world_size, granularity, splits, grain)
    source = torch.full((shard_rows, width), -1.0)
    dest = torch.zeros(world_size, shard_rows, width)
    group = RecordingGroup()
    transport = PointToPointTransport(
        group=group,
        global_ranks=[0, 1, 2],
        plan=plan,
        rank=rank,
        source=source,
        dest=dest,
        lanes=InlineLanes(),
    )
    transport._coalesce = True  # what a CUDA source selects
    seen = []
    run_pipeline(plan, transport, lambda rows, unit: seen.append(rows.clone()))

    starts = [c for c in group.calls if c[0] == "start"]
    assert len(starts) == len(plan.rounds) == sum(c[0] == "end" for c in group.calls)
    sends = [c for c in group.calls if c[0] == "send"]
    recvs = [c for c in group.calls if c[0] == "recv"]
    assert sorted(c[1] for c in sends) == sorted([0, 2] * splits)  # every peer gets every sub-chunk
    assert sorted(c[1] for c in recvs) == sorted([0, 2] * splits)
    own = {source[j * (shard_rows // splits) :].data_ptr() for j in range(splits)}
    assert {c[3] for c in sends} == own, "sent rows other than the own shard's"
    assert sorted(c[2] for c in sends) == sorted(c[2] for c in recvs), "a send without its receive's tag"
    for q in (0, 2):
        assert torch.all(dest[q] == q + 1), f"slot {q} did not receive rank {q}'s shard"
    assert len(seen) == len(plan.units)

    # the next call binds another source (as each call of a compiled graph does): its rows are sent
    group.calls.clear()
    other = torch.full((shard_rows, width), -2.0)
    transport.bind(other)
    run_pipeline(plan, transport, lambda rows, unit: None)
    sends = [c for c in group.calls if c[0] == "send"]
    assert {c[3] for c in sends} == {other[j * (shard_rows // splits) :].data_ptr() for j in range(splits)}


def test_direct_sends_address_the_peers_as_the_twin_group_numbers_them(monkeypatch):
    """An ``/hp`` schedule sends on the high-priority twin group, whose rank order need not be the call's
    group's: each layout peer is addressed by its rank in the group the sends go to."""
    import ficco.executor.transport as transport_module

    twin_rank = {10: 2, 11: 0, 12: 1}  # global rank -> rank in the twin group
    monkeypatch.setattr(transport_module.dist, "ProcessGroup", RecordingGroup)  # a direct group
    monkeypatch.setattr(transport_module.dist, "get_group_rank", lambda group, g: twin_rank[g])
    plan = make_plan("gather", 3, "shard", 1, "shard")
    group = RecordingGroup()
    transport = PointToPointTransport(
        group=group, global_ranks=[10, 11, 12], plan=plan, rank=1, source=torch.ones(4, 2),
        dest=torch.zeros(3, 4, 2), lanes=InlineLanes(),
    )  # fmt: skip
    run_pipeline(plan, transport, lambda rows, unit: None)
    sent_to = sorted(c[1] for c in group.calls if c[0] == "send")
    received_from = sorted(c[1] for c in group.calls if c[0] == "recv")
    assert sent_to == received_from == sorted([twin_rank[10], twin_rank[12]])  # layout peers 0 and 2
