"""The executor's ops as PyTorch custom ops (``executor.library``), on gloo worlds of 2 and 4 ranks:
``torch.library.opcheck`` (schema, fake implementation, autograd registration, AOT dispatch with dynamic
shapes) for every op over gather/scatter dims, several weights and schedule tables; values and gradients
against plain autograd on the full tensors for a schedule of every family; a schedule that cannot run at a
shape runs serial with one warning and is reported. Every world runs twice, its batched (sequence-parallel)
calls under each layout an overlapped schedule chooses between (``executor.layout``): GEMMs where the rows
lie (one per unit and sequence), and over rank-major rows moved once."""

from __future__ import annotations

import pytest
from executor_world import run_world

FAMILIES = ["serial/sm", "serial/dma", "shard/sm", "shard/dma/hp", "finer/sm/s2/chunk", "finer/dma/s2/shard"]
TABLE = "0:serial/sm;16:finer/dma/s2/chunk;64:shard/sm"


def _ops_world(rank: int, world_size: int, layout: str) -> dict:
    from ficco.executor.layout import forced

    with forced(layout):
        return _ops_checks(rank, world_size)


def _ops_checks(rank: int, world_size: int) -> dict:
    import warnings

    import torch
    import torch.distributed as dist

    from ficco.executor import library

    group = dist.group.WORLD.group_name
    ag, rs = torch.ops.ficco.all_gather_matmul, torch.ops.ficco.matmul_reduce_scatter
    rs_sum = torch.ops.ficco.matmuls_reduce_scatter
    twins = {
        ag: torch.ops.ficco._all_gather_matmul,
        rs: torch.ops.ficco._matmul_reduce_scatter,
        rs_sum: torch.ops.ficco._matmuls_reduce_scatter,
    }
    gen = torch.Generator().manual_seed(5)  # the same full tensors on every rank
    batch, seq, k, n1, n2 = 2, 4 * world_size, 12, 4, 3
    x = torch.randn(batch, seq, k, generator=gen)
    b1, b2 = torch.randn(k, n1, generator=gen), torch.randn(k, n2, generator=gen)
    g1, g2 = torch.randn(batch, seq, n1, generator=gen), torch.randn(batch, seq, n2, generator=gen)
    s = seq // world_size
    mine = slice(rank * s, (rank + 1) * s)
    ks = slice(rank * k // world_size, (rank + 1) * k // world_size)
    out: dict = {"errors": {}, "opchecks": 0, "layouts": {}, "autocast": {}}

    def err(got, want):
        return float((got - want).norm() / want.norm())

    # opcheck (world of 2: it compiles, so once is enough): every op and its twin without autograd, gather
    # dims 0 and 1 (N-D), several weights, the gathered input, a table
    shard = x[:, mine].contiguous()
    for args in (
        []
        if world_size > 2
        else [
            (shard, [b1, b2], 1, group, "shard/dma", True),
            (shard, [b1], 1, group, TABLE, False, "finer/sm/s2/shard"),
            (x[0, mine].contiguous(), [b1], 0, group, "finer/sm/s2/chunk", True),
        ]
    ):
        for op in (ag, twins[ag]):
            torch.library.opcheck(op.default, args)
            out["opchecks"] += 1
    rs_cases = [(x, b1, "sum", 1, group, "shard/sm"), (x[0], b2, "sum", 0, group, TABLE, "shard/dma")]
    for args in [] if world_size > 2 else rs_cases:
        for op in (rs, twins[rs]):
            torch.library.opcheck(op.default, args)
            out["opchecks"] += 1
    summed = ([x, x[..., :5]], [b1, b1[:5]], "sum", 1, group, "finer/sm/s2/chunk")
    for op in () if world_size > 2 else (rs_sum, twins[rs_sum]):
        torch.library.opcheck(op.default, summed)
        out["opchecks"] += 1
    x4 = torch.randn(2, seq, 3, k, generator=gen)  # dims before and after the gathered one
    w4 = torch.randn(n1, k, generator=gen)  # nn.Linear's weight: the op takes its transpose

    # values and gradients against autograd on the full tensors
    for schedule in FAMILIES:
        for return_a in (True, False):
            xs = shard.clone().requires_grad_()
            w1, w2 = b1.clone().requires_grad_(), b2.clone().requires_grad_()
            a, (c1, c2) = ag(xs, [w1, w2], 1, group, schedule, return_a)
            loss = (c1 * g1).sum() + (c2 * g2).sum() + ((a * x).sum() if return_a else 0)
            loss.backward()
            ref = [t.clone().requires_grad_() for t in (x, b1, b2)]
            ((ref[0] @ ref[1]) * g1).sum().add(((ref[0] @ ref[2]) * g2).sum()).add(
                (ref[0] * x).sum() * return_a
            ).backward()
            # the outputs in the input's layout, contiguous: nothing downstream copies them
            layouts = [c1, c2, a] if return_a else [c1, c2]
            out["layouts"][("ag", schedule, return_a)] = all(t.is_contiguous() for t in layouts)
            out["errors"][("ag", schedule, return_a)] = {
                "c1": err(c1, x @ b1),
                "c2": err(c2, x @ b2),
                # every rank's loss holds the whole product (the same weights on every rank): the
                # reduce-scatter of the input gradient adds world_size copies
                "x": err(xs.grad, world_size * ref[0].grad[:, mine]),
                "b1": err(w1.grad, ref[1].grad),
                "b2": err(w2.grad, ref[2].grad),
                "a": err(a, x) if return_a else float(a.numel()),
            }
        # GEMM -> reduce-scatter of this rank's slice of k: the sum over ranks is x @ b1
        xa, wb = x[..., ks].clone().requires_grad_(), b1[ks].clone().requires_grad_()
        y = rs(xa, wb, "sum", 1, group, schedule)
        (y * g1[:, mine]).sum().backward()
        ref = [t.clone().requires_grad_() for t in (x, b1)]
        ((ref[0] @ ref[1]) * g1).sum().backward()
        out["errors"][("rs", schedule)] = {
            "y": err(y, (x @ b1)[:, mine]),
            "x": err(xa.grad, ref[0].grad[..., ks]),
            "b": err(wb.grad, ref[1].grad[ks]),
        }
        # the reduce-scatter of two GEMMs summed, each accumulating in place
        k2 = slice(0, 5)
        parts = [t.clone().requires_grad_() for t in (x[..., ks], x[..., k2], b1[ks], b1.flip(0)[k2])]
        y = rs_sum(parts[:2], parts[2:], "sum", 1, group, schedule)
        (y * g1[:, mine]).sum().backward()
        # ranks hold slices of k for the first pair, the same whole operands for the second: the sum over
        # ranks is x @ b1 plus world_size times the second product
        want = x @ b1 + world_size * (x[..., k2] @ b1.flip(0)[k2])
        g_rows = g1.flatten(0, 1)
        out["errors"][("rs_sum", schedule)] = {
            "y": err(y, want[:, mine]),
            "x1": err(parts[0].grad, g1 @ b1[ks].t()),
            "x2": err(parts[1].grad, g1 @ b1.flip(0)[k2].t()),
            "b1": err(parts[2].grad, x[..., ks].flatten(0, 1).t() @ g_rows),
            "b2": err(parts[3].grad, x[..., k2].flatten(0, 1).t() @ g_rows),
        }
        # a 4-D input gathered along dim 1 against nn.Linear's transposed weight: the weight's gradient is
        # contiguous in the parameter's layout, as PyTorch's is
        xs4, wt = x4[:, mine].clone().requires_grad_(), w4.clone().requires_grad_()
        _, (c4,) = ag(xs4, [wt.t()], 1, group, schedule, False)
        (c4 * c4).sum().backward()
        ref = [t.clone().requires_grad_() for t in (x4, w4)]
        (lambda c: (c * c).sum())(ref[0] @ ref[1].t()).backward()
        out["layouts"][("ag4", schedule)] = c4.is_contiguous() and wt.grad.is_contiguous()
        out["errors"][("ag4", schedule)] = {
            "c": err(c4, x4 @ w4.t()),
            "x": err(xs4.grad, world_size * ref[0].grad[:, mine]),
            "w": err(wt.grad, ref[1].grad),
        }

    # under torch.autocast, as F.linear: the GEMMs in bf16, the gathered input as given, fp32 gradients
    for schedule in ("serial/sm", "finer/dma/s2/chunk"):
        xs, w1 = shard.clone().requires_grad_(), b1.clone().requires_grad_()
        xa, wb = x[..., ks].clone().requires_grad_(), b1[ks].clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a, (c1,) = ag(xs, [w1], 1, group, schedule, True)
            y = rs(xa, wb, "sum", 1, group, schedule)
            want_c = torch.nn.functional.linear(x, b1.t())
        (c1.float().sum() + y.float().sum()).backward()
        out["autocast"][schedule] = {
            "dtypes": [str(t.dtype) for t in (c1, a, y, xs.grad, w1.grad, xa.grad, wb.grad)],
            "c": err(c1.float(), want_c.float()),
            "a": err(a, x),
            "y": err(y.float(), (x @ b1)[:, mine]),  # the ranks' bf16 partial products summed
        }

    # a schedule that cannot run at this shape: serial, one warning, reported
    odd = torch.randn(3, k, generator=gen)  # 3 rows per rank: s8 cannot split them
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            ag(odd, [b1], 0, group, "finer/dma/s8/chunk")
    fallbacks = [w for w in caught if issubclass(w.category, library.ScheduleFallbackWarning)]
    out["warnings"] = [str(w.message) for w in fallbacks]
    out["fallback"] = library.ran("ag_gemm", 3 * world_size, n1, k, "fp32", world_size, "finer/dma/s8/chunk")
    # a mistake serial cannot run either is the caller's, and raised
    try:
        ag(odd, [torch.randn(k + 1, n1)], 0, group, "shard/sm")
    except ValueError as exc:
        out["refused"] = str(exc)
    return out


@pytest.fixture(scope="module")
def worlds() -> dict[int, list[dict]]:
    return {w: run_world(w, _ops_world, "segmented") + run_world(w, _ops_world, "rank_major") for w in (2, 4)}


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_opcheck_passes_for_every_op(worlds, world_size):
    assert all(report["opchecks"] == (12 if world_size == 2 else 0) for report in worlds[world_size])


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_values_and_gradients_match_autograd_for_every_family(worlds, world_size):
    for rank, report in enumerate(worlds[world_size]):
        assert len(report["errors"]) == len(FAMILIES) * 5
        for case, errs in report["errors"].items():
            bad = {k: e for k, e in errs.items() if not e <= 1e-5}
            assert not bad, f"rank {rank} {case}: relative errors {bad}"
        assert all(report["layouts"].values()), report["layouts"]


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_the_ops_follow_autocast_as_f_linear(worlds, world_size):
    """Under ``torch.autocast(bfloat16)`` of fp32 tensors: the GEMMs' outputs bf16 and F.linear's values
    exactly, the gathered input fp32 (gathered as given), every gradient fp32."""
    for report in worlds[world_size]:
        assert list(report["autocast"]) == ["serial/sm", "finer/dma/s2/chunk"]
        for case in report["autocast"].values():
            bf16, fp32 = "torch.bfloat16", "torch.float32"
            assert case["dtypes"] == [bf16, fp32, bf16, fp32, fp32, fp32, fp32]
            assert case["c"] == 0.0 and case["a"] == 0.0 and case["y"] <= 1e-2


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_a_schedule_that_cannot_run_runs_serial_with_one_warning(worlds, world_size):
    for report in worlds[world_size]:
        (message,) = report["warnings"]
        assert "ficco.all_gather_matmul (ag_gemm m=" in message
        assert "schedule finer/dma/s8/chunk cannot run at this shape, running serial/sm" in message
        assert "multiple of splits=8" in message
        run = report["fallback"]
        assert run.ran == "serial/sm" and run.asked == "finer/dma/s8/chunk" and "splits=8" in run.reason
        assert "b has shape [13, 4]; expected [k, n] = [12, n]" in report["refused"]


MOE_SCHEDULES = ["serial/sm", "shard/dma", "finer/sm/s2/chunk", "0:serial/dma;16:finer/dma/s2/shard"]


def _moe_world(rank: int, world_size: int) -> dict:
    """The MoE pair on an uneven routing (empty blocks included): opcheck, and dispatch -> tanh -> combine
    against autograd on every rank's tensors in one process."""
    import torch
    import torch.distributed as dist

    from ficco.features import Routing

    group = dist.group.WORLD.group_name
    gen = torch.Generator().manual_seed(3)  # the same tensors on every rank
    experts, k, n = 2, 6, 5
    counts = torch.randint(0, 4, (world_size, world_size, experts), generator=gen).tolist()
    routing, flat = Routing(counts=counts), [c for row in counts for pair in row for c in pair]
    xs = [torch.randn(sum(routing.sent(q)), k, generator=gen) for q in range(world_size)]
    bs = [torch.randn(experts, k, n, generator=gen) for _ in range(world_size)]
    b2s = [torch.randn(experts, n, k, generator=gen) for _ in range(world_size)]

    # the reference: every routed block through its expert's two GEMMs, back in x's row order
    ref = [t.clone().requires_grad_() for t in (*xs, *bs, *b2s)]
    rx, rb, rb2 = ref[:world_size], ref[world_size : 2 * world_size], ref[2 * world_size :]
    loss = 0
    for q in range(world_size):
        blocks, start = [], 0
        for p in range(world_size):
            for e in range(experts):
                rows = rx[q][start : start + counts[q][p][e]]
                blocks.append(torch.tanh(rows @ rb[p][e]) @ rb2[p][e])
                start += counts[q][p][e]
        loss = loss + (torch.cat(blocks) ** 2).sum()
    loss.backward()

    out: dict = {"errors": {}}
    for schedule in MOE_SCHEDULES:
        x, b, b2 = (t[rank].clone().requires_grad_() for t in (xs, bs, b2s))
        y = torch.ops.ficco.all_to_all_matmul(x, b, flat, group, schedule)
        z = torch.ops.ficco.matmul_all_to_all(torch.tanh(y), b2, flat, group, schedule)
        (z * z).sum().backward()
        out["errors"][schedule] = {
            name: float((got - want.grad).norm() / want.grad.norm())
            for name, got, want in (
                ("x", x.grad, rx[rank]),
                ("b", b.grad, rb[rank]),
                ("b2", b2.grad, rb2[rank]),
            )
        }
    if world_size == 2:  # each op and its twin without autograd
        y = torch.ops.ficco.all_to_all_matmul(xs[rank], bs[rank], flat, group, "serial/sm")
        for name, args in (
            ("all_to_all_matmul", (xs[rank], bs[rank], flat, group, "shard/sm")),
            ("matmul_all_to_all", (y, b2s[rank], flat, group, "finer/dma/s2/shard")),
        ):
            for op in (name, "_" + name):
                torch.library.opcheck(getattr(torch.ops.ficco, op).default, args)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_moe_ops_pass_opcheck_and_match_autograd(world_size):
    for rank, report in enumerate(run_world(world_size, _moe_world)):
        assert list(report["errors"]) == MOE_SCHEDULES
        for schedule, errs in report["errors"].items():
            bad = {k: e for k, e in errs.items() if not e <= 1e-5}
            assert not bad, f"rank {rank} {schedule}: relative gradient errors {bad}"


def test_a_gathered_input_nothing_uses_costs_no_reduce_scatter_in_the_backward():
    """``return_a`` keeps the gathered A for the weights' gradients; when nothing downstream uses it, its
    gradient is None (not materialised zeros), so the backward runs no reduce-scatter of it, eager or
    compiled (a loopback world of 2 on the CPU: one process, no peers)."""
    from unittest import mock

    import torch
    import torch.distributed as dist

    from benchmarks.support.loopback import loopback_world
    from ficco.executor import library

    calls = []
    real = library._reduce_scatter

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    with loopback_world(2, "cpu"), mock.patch.object(library, "_reduce_scatter", counted):
        group = dist.group.WORLD.group_name
        a = torch.randn(4, 8, requires_grad=True)
        b = torch.randn(8, 6, requires_grad=True)

        def step(a, b):
            _, (c,) = torch.ops.ficco.all_gather_matmul(a, [b], 0, group, "serial/sm", True)
            return c

        step(a, b).sum().backward()
        torch.compile(step, backend="aot_eager", fullgraph=True)(a, b).sum().backward()
        torch._dynamo.reset()
    assert calls == []


def test_a_call_signature_remembered_in_one_world_is_forgotten_with_it():
    """The ops remember each call signature's schedule and executor context, in the executor's one check
    cache beside the executor's own calls; a world torn down and one of another size started with the same
    group name must not reuse the old context (its size, its group)."""
    import torch
    import torch.distributed as dist

    from benchmarks.support.loopback import loopback_world
    from ficco import executor
    from ficco.executor.context import checked_calls

    a, b = torch.randn(4, 8), torch.randn(8, 8)
    rows = []
    for world in (2, 4):
        with loopback_world(world, "cpu"):
            group = dist.group.WORLD.group_name
            _, (c,) = torch.ops.ficco.all_gather_matmul(a, [b], 0, group, "shard/dma")
            _, (c,) = torch.ops.ficco.all_gather_matmul(a, [b], 0, group, "shard/dma")  # the remembered path
            executor.all_gather_matmul(a, b, "shard/dma")
            assert len(checked_calls) == 2  # the custom op's signature and the executor's, one cache
            rows.append((group, c.shape[0]))
        assert checked_calls == {}
    assert rows[0][0] == rows[1][0]  # the same name for both worlds' groups
    assert [n for _, n in rows] == [8, 16]
