"""One-GPU tests (marker ``gpu``): the executor's expert GEMMs (``executor.experts``) on a CUDA GPU, grouped
against the loop, eager and replayed from CUDA graphs; skipped without a CUDA GPU."""

from __future__ import annotations

import pytest
import torch

from benchmarks.support.expert_blocks import executor_units
from ficco.executor.context import CaptureError
from ficco.executor.experts import ExpertGemms, RoutedState, grouped_eligible, grouped_matmul
from ficco.features import Routing

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
K, N = 256, 384
TOLERANCE = 1e-2


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref.double()).norm() / ref.double().norm())


def _blocks(op: str, routing: Routing) -> list[ExpertGemms]:
    """Rank 0's whole expert-major buffer's block, then its blocks under shard and finer s4."""
    blocks = [ExpertGemms.whole(RoutedState(routing=routing, rank=0).expert_rows)]
    return blocks + [g for s in ("shard/dma", "finer/dma/s4/chunk") for g in executor_units(op, routing, s)]


ROUTINGS = {
    "balanced-64": Routing.synthetic(tokens=512, top_k=4, experts=128, world_size=2),
    "uneven-16": Routing.synthetic(tokens=300, top_k=2, experts=32, world_size=2, imbalance=1.5),
}


@pytest.mark.parametrize("label", list(ROUTINGS))
@pytest.mark.parametrize("op", ["a2a_gemm", "gemm_a2a"])
def test_grouped_blocks_match_the_loop_eager_and_replayed(op, label):
    routing = ROUTINGS[label]
    gen = torch.Generator(device="cuda").manual_seed(0)
    received = sum(routing.received(0))
    b = torch.randn(routing.local_experts, K, N, device="cuda", dtype=torch.bfloat16, generator=gen) / K**0.5
    for index, gemms in enumerate(_blocks(op, routing)):
        if op == "a2a_gemm":  # the block's rows as a view at an offset, as the executor's buffers hold them
            store = torch.randn(gemms.rows + 8, K, device="cuda", dtype=torch.bfloat16, generator=gen)
            a, out = store[8:], torch.empty(received, N, device="cuda", dtype=torch.bfloat16)
            run = gemms.dispatch
        else:
            a = torch.randn(received, K, device="cuda", dtype=torch.bfloat16, generator=gen)
            out = torch.empty(gemms.rows, N, device="cuda", dtype=torch.bfloat16)
            run = gemms.combine
        assert grouped_eligible(a, b)
        out.fill_(float("nan"))
        run(a, b, out, grouped=False)
        want = out.clone()
        written = ~want.isnan().any(dim=1)
        assert written.sum() == gemms.rows, (label, index)
        out.fill_(float("nan"))
        run(a, b, out, grouped=True)
        assert _rel(out[written], want[written]) <= TOLERANCE, (label, index)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run(a, b, out, grouped=True)
        out.fill_(float("nan"))
        a.mul_(2)
        graph.replay()
        torch.cuda.synchronize()
        assert _rel(out[written], 2 * want[written]) <= TOLERANCE, (label, index)


def test_grouped_matmul_refuses_capture_until_it_ran_once():
    rows = (5, 0, 17, 9, 3, 0, 8, 12, 1, 30)
    a = torch.randn(sum(rows), 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(len(rows), 64, 32, device="cuda", dtype=torch.bfloat16)
    ExpertGemms.whole.cache_clear()
    graph = torch.cuda.CUDAGraph()
    refused = pytest.raises(CaptureError, match="grouped_matmul cannot run inside CUDA graph capture")
    with refused, torch.cuda.graph(graph):
        grouped_matmul(a, b, rows)
    product = grouped_matmul(a, b, rows)  # eager: makes the offsets; no out: the grouped GEMM's own output
    loop = torch.cat([a[s : s + r] @ b[e] for e, (s, r) in enumerate(zip(_starts(rows), rows, strict=True))])
    assert _rel(product, loop) <= TOLERANCE
    out, graph = torch.empty_like(product), torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grouped_matmul(a, b, rows, out)
    graph.replay()
    torch.cuda.synchronize()
    assert _rel(out, loop) <= TOLERANCE


def test_only_bf16_with_aligned_widths_is_grouped():
    a = torch.randn(16, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2, 64, 32, device="cuda", dtype=torch.bfloat16)
    assert grouped_eligible(a, b) == (torch.cuda.get_device_capability() >= (9, 0))
    assert not grouped_eligible(a.half(), b.half())
    assert not grouped_eligible(a[:, :60], b[:, :60])


def _starts(rows: tuple[int, ...]) -> list[int]:
    return [sum(rows[:e]) for e in range(len(rows))]
