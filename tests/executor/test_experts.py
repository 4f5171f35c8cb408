"""executor.experts.ExpertGemms on the CPU: the grouped form's offsets and row index, when a block is grouped,
and grouped against the loop on the executor's own blocks (bf16, torch's CPU grouped GEMM)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.support.expert_blocks import executor_units
from ficco.executor import experts, ops
from ficco.executor.experts import ExpertGemms, RoutedState, grouped_eligible, grouped_matmul
from ficco.features import Routing


def test_offsets_end_each_expert_and_the_index_places_each_row():
    gemms = ExpertGemms(((0, 3, 0, 10), (3, 5, 2, 20)), 4)
    offs, index = gemms.tensors(torch.device("cpu"))
    assert offs.dtype == torch.int32 and offs.tolist() == [3, 3, 5, 5]  # empty experts end where the last did
    assert index.tolist() == [10, 11, 12, 20, 21] and gemms.rows == 5 and not gemms.aligned


def test_a_whole_expert_major_buffer_needs_no_index():
    gemms = ExpertGemms.whole((2, 0, 3))
    assert gemms.aligned and gemms.segments == ((0, 2, 0, 0), (2, 5, 2, 2))
    assert gemms.tensors(torch.device("cpu"))[1] is None
    assert ExpertGemms.whole((2, 0, 3)) is gemms  # kept, with its device tensors


def test_blocks_of_at_least_the_threshold_with_eligible_operands_are_grouped():
    a, b = torch.randn(16, 8, dtype=torch.bfloat16), torch.randn(8, 8, 16, dtype=torch.bfloat16)
    many = ExpertGemms.whole((2,) * experts.GROUPED_MIN_GEMMS)
    few = ExpertGemms.whole((2,) * (experts.GROUPED_MIN_GEMMS - 1) + (0,))
    assert many.grouped(a, b) and not few.grouped(a, b)
    assert not many.grouped(a.float(), b.float())  # bf16 only
    assert not grouped_eligible(torch.randn(16, 12, dtype=torch.bfloat16), b[:, :4])  # k not a multiple of 8
    assert not grouped_eligible(a, b.transpose(1, 2).contiguous().transpose(1, 2))  # b not contiguous


def _blocks(op: str, routing: Routing, rank: int) -> list[ExpertGemms]:
    """The whole expert-major buffer's block, then every block of every plan shape of ``rank``."""
    schedules = ("serial/dma", "shard/dma", "finer/dma/s2/chunk", "finer/dma/s4/chunk")
    blocks = [ExpertGemms.whole(RoutedState(routing=routing, rank=rank).expert_rows)]
    return blocks + [g for s in schedules for g in executor_units(op, routing, s, rank)]


ROUTINGS = {
    "balanced": Routing.synthetic(tokens=24, top_k=2, experts=12, world_size=2),
    "uneven": Routing.synthetic(tokens=40, top_k=3, experts=16, world_size=4, imbalance=2.5),
    "ragged": Routing([[[3, 0, 1], [5, 2, 0]], [[0, 0, 0], [1, 9, 4]]]),
}


@pytest.mark.parametrize("label", list(ROUTINGS))
def test_grouped_blocks_write_what_the_loop_writes(label):
    routing = ROUTINGS[label]
    gen = torch.Generator().manual_seed(0)
    k, n = 16, 8
    b = torch.randn(routing.local_experts, k, n, generator=gen).bfloat16()
    for rank in range(routing.world_size):
        received = sum(routing.received(rank))
        for op in ("a2a_gemm", "gemm_a2a"):
            for gemms in _blocks(op, routing, rank):
                if op == "a2a_gemm":
                    a = torch.randn(gemms.rows, k, generator=gen).bfloat16()
                    out, run = torch.full((received, n), float("nan")).bfloat16(), gemms.dispatch
                else:
                    a = torch.randn(received, k, generator=gen).bfloat16()
                    out, run = torch.full((gemms.rows, n), float("nan")).bfloat16(), gemms.combine
                run(a, b, out, grouped=False)
                want = out.clone()
                out.fill_(float("nan"))
                run(a, b, out, grouped=True)
                assert torch.equal(out.isnan(), want.isnan()), (label, rank, op, gemms)  # same rows
                assert torch.allclose(
                    out.float().nan_to_num(), want.float().nan_to_num(), rtol=1e-2, atol=1e-2
                )


@pytest.mark.parametrize("rows", [(3, 0, 5, 2, 1, 4, 1, 2, 6, 2), (3, 0, 5, 2)], ids=["grouped", "loop"])
def test_grouped_matmul_returns_its_output_or_writes_out(rows):
    a, b = torch.randn(sum(rows), 16).bfloat16(), torch.randn(len(rows), 16, 8).bfloat16()
    assert ExpertGemms.whole(rows).grouped(a, b) == (len(rows) > 4)
    starts = [sum(rows[:e]) for e in range(len(rows))]
    pairs = enumerate(zip(starts, rows, strict=True))
    want = torch.cat([a[s : s + r].float() @ b[e].float() for e, (s, r) in pairs])
    out = torch.empty(sum(rows), 8, dtype=torch.bfloat16)
    assert grouped_matmul(a, b, rows, out) is out
    for got in (grouped_matmul(a, b, list(rows)), out):
        assert torch.allclose(got.float(), want, rtol=2e-2, atol=2e-2)


def test_weights_are_unbound_only_for_a_call_with_a_block_that_loops():
    cpu, b = torch.device("cpu"), torch.randn(3, 8, 8)
    grouped, looping = ExpertGemms.whole((2, 1, 3)), ExpertGemms(((0, 2, 0, 0), (2, 4, 1, 2)), 3)
    grouped.tensors(cpu)  # a grouped block's tensors are made before its first call
    assert ops._loop_weights({1: grouped}, b, cpu) is None
    weights = ops._loop_weights({1: grouped, 2: looping}, b, cpu)
    assert len(weights) == 3 and all(torch.equal(w, b[e]) for e, w in enumerate(weights))
