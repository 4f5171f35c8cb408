"""One-GPU tests (marker ``gpu``) of the ``torch.ops.ficco`` custom ops in a loopback world
(``benchmarks.support.loopback``: this process is rank 0, peers hold zeros, collectives move nothing):

- a training step of the runtime layers compiled with ``torch.compile(fullgraph=True)`` (Inductor), then
  captured into CUDA graphs (``runtime.GraphedCall``), leaves the eager step's gradients on every replay;
- what ran is what the profiler saw: a ``dma`` schedule issues one device-to-device copy per peer piece on
  its side lanes (the copy engines) and is reported as run; a ``dma`` schedule that cannot run at its shape
  issues exactly what ``serial/sm`` issues (one warning) and the op's report and the planner's table say so.

Skipped without a CUDA GPU. ``python3 -m pytest -m gpu tests/gpu/test_gpu_ficco_ops.py``
"""

from __future__ import annotations

import warnings

import pytest
import torch

from benchmarks.support.loopback import loopback_world
from ficco import executor

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("world", [2, 4])
def test_compiled_and_graph_captured_step_gives_the_eager_gradients(world):
    import torch.nn.functional as F

    from ficco.runtime import ColumnParallelLinear, FixedSource, PlannedOps, Planner, RowParallelLinear
    from ficco.runtime.graphs import GraphedCall

    tokens, d_in, hidden, d_out = 512, 256, 512, 256
    failures = []
    with loopback_world(world) as device:
        gen = torch.Generator(device="cuda").manual_seed(3)
        for schedule in ("serial/dma", "shard/dma", "finer/dma/s2/chunk"):
            for keep in (True, False):
                ops = PlannedOps(Planner(FixedSource(schedule), mode="graph", hardware=f"h200x{world}"))
                layer = {"ops": ops, "device": device, "dtype": torch.bfloat16}
                up = ColumnParallelLinear(d_in, hidden, name="up", keep_gathered=keep, **layer)
                down = RowParallelLinear(hidden, d_out, name="down", **layer)
                x = torch.randn(tokens // world, d_in, device="cuda", dtype=torch.bfloat16, generator=gen)
                x.requires_grad_()
                grad_y = torch.randn(
                    tokens // world, d_out, device="cuda", dtype=torch.bfloat16, generator=gen
                )
                leaves = [up.weight, down.weight, x]

                def forward(x, up=up, down=down):
                    return down(F.gelu(up(x)))

                compiled = torch.compile(forward, fullgraph=True)

                def step(fn, x=x, grad_y=grad_y, leaves=leaves) -> None:
                    for leaf in leaves:
                        if leaf.grad is not None:
                            leaf.grad.zero_()
                    fn(x).backward(grad_y)

                step(forward)
                step(forward)
                eager = [leaf.grad.clone() for leaf in leaves]
                names = ("up.weight", "down.weight", "x")
                step(compiled)
                for name, leaf, want in zip(names, leaves, eager, strict=True):
                    if not torch.allclose(leaf.grad, want, rtol=1e-2, atol=1e-2):
                        failures.append(f"{schedule} keep={keep} compiled grad of {name} differs")
                graphed = GraphedCall(lambda compiled=compiled, step=step: step(compiled))
                for replay in range(2):  # both captures
                    for leaf in leaves:
                        leaf.grad.fill_(float("nan"))
                    graphed()
                    torch.cuda.synchronize()
                    for name, leaf, want in zip(names, leaves, eager, strict=True):
                        if not torch.allclose(leaf.grad, want, rtol=1e-2, atol=1e-2):
                            failures.append(f"{schedule} keep={keep} replay {replay} grad of {name} differs")
                del graphed
                torch._dynamo.reset()
                executor.clear_buffers()
    assert not failures, failures


def _copies(fn) -> dict[str, int]:
    """Device-to-device copies the profiler sees while ``fn`` runs: ``{"caller": n, "side": n}``, those on
    the caller's stream and those on any other stream (the copy engines' side lanes).

    The caller's stream is named by a marker kernel (``torch.cuda._sleep``: ``spin_kernel``) issued on it
    just before ``fn``."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(1)
        fn()
        torch.cuda.synchronize()
    device = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    (caller,) = {e.device_resource_id for e in device if "spin_kernel" in e.name}
    copies = [e.device_resource_id for e in device if "Memcpy" in e.name and "DtoD" in e.name]
    return {"caller": copies.count(caller), "side": len(copies) - copies.count(caller)}


def test_what_ran_is_what_the_profiler_saw():
    """A ``dma`` schedule moves each peer piece with one copy on a side lane (a copy engine) and nothing on
    the caller's stream; ``serial/sm`` copies nothing on a side lane (its collective is the process group's:
    in the loopback world the fake group's all-gather copies the shard into every slot on the caller's
    stream, under NCCL it is a kernel); a ``dma`` schedule that cannot run at its shape issues exactly what
    ``serial/sm`` issues at that shape."""
    import torch.distributed as dist

    from ficco.executor import library
    from ficco.executor.checks import as_schedule
    from ficco.executor.plan import make_plan
    from ficco.runtime import FixedSource, PlannedOps, Planner
    from ficco.runtime.planner import OpRequest

    with loopback_world(2) as device:
        group = dist.group.WORLD.group_name
        b = torch.randn(256, 256, device=device, dtype=torch.bfloat16)
        good = torch.randn(128, 256, device=device, dtype=torch.bfloat16)  # 128 rows per rank
        odd = torch.randn(12, 256, device=device, dtype=torch.bfloat16)  # 12 rows: s8 cannot split them

        def ag(a, schedule):
            return lambda: torch.ops.ficco.all_gather_matmul(a, [b], 0, group, schedule)

        for _ in range(2):  # plan and allocate before profiling
            ag(good, "shard/dma")()
            ag(good, "serial/sm")()
            ag(odd, "serial/sm")()
        shard = as_schedule("shard/dma")
        plan = make_plan("gather", 2, shard.granularity, shard.splits, shard.grain)
        peer_pieces = sum(len(batch) for batch in plan.rounds)
        assert peer_pieces == 1  # the own shard is multiplied in place; the peer's slot gets one push
        assert _copies(ag(good, "shard/dma")) == {"caller": 0, "side": peer_pieces}
        serial = _copies(ag(good, "serial/sm"))
        assert serial["side"] == 0, serial
        serial_odd = _copies(ag(odd, "serial/sm"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ag(odd, "finer/dma/s8/chunk")()
            copies = _copies(ag(odd, "finer/dma/s8/chunk"))
        assert copies == serial_odd  # it ran serial/sm: no push on a side lane, serial's copies only
        fallbacks = [w for w in caught if issubclass(w.category, library.ScheduleFallbackWarning)]
        assert len(fallbacks) == 1
        assert "finer/dma/s8/chunk cannot run at this shape" in str(fallbacks[0].message)
        run = library.ran("ag_gemm", 24, 256, 256, "bf16", 2, "finer/dma/s8/chunk")
        assert run.ran == "serial/sm" and "splits=8" in run.reason
        assert library.ran("ag_gemm", 256, 256, 256, "bf16", 2, "shard/dma").ran == "shard/dma"

        # the planner's table: what its pick ran as
        planner = Planner(FixedSource("shard/dma"), hardware="h200x2")
        ops = PlannedOps(planner)
        request = OpRequest(
            layer="qkv", direction="fwd", op="ag_gemm", m=256, n=256, k=256, dtype="bf16", world_size=2
        )
        ops.all_gather_matmul(good, [b], request, None, return_gathered=False)
        (row,) = planner.rows()
        assert (row["schedule"], row["ran"]) == ("shard/dma", "shard/dma"), row


def test_workspaces_are_allocated_outside_the_callers_graph_pool():
    """What the executor keeps across calls (scratch buffers, peer memory) is allocated outside a memory
    pool the calling thread allocates to, as Inductor's CUDA graph trees route a warm-up's allocations: once
    the outputs are gone, nothing of the op is left in the pool."""
    import torch.distributed as dist

    pool = torch.cuda.MemPool()
    with loopback_world(2) as device:
        group = dist.group.WORLD.group_name
        b = torch.randn(256, 256, device=device, dtype=torch.bfloat16)
        a = torch.randn(128, 256, device=device, dtype=torch.bfloat16)
        for schedule in ("shard/dma", "serial/sm"):
            with torch.cuda.use_mem_pool(pool):
                out = torch.ops.ficco.all_gather_matmul(a, [b], 0, group, schedule)
                out = torch.ops.ficco.matmul_reduce_scatter(out[1][0], b, "sum", 0, group, schedule)
            del out
            torch.cuda.synchronize()
            assert torch._C._cuda_checkPoolLiveAllocations(device.index, pool.id, set()), schedule
        executor.clear_buffers()
