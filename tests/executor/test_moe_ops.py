"""Every MoE schedule against an independent reference, on CPU gloo worlds of 2 and 4 ranks.

Both ops (``all_to_all_matmul``, the dispatch; ``matmul_all_to_all``, the combine) run every candidate
schedule of a MoE scenario under a balanced routing, the scenario's uneven routings (rank 0 taking 1.5x,
2.5x, and every row) and a ragged hand-made routing (empty experts and blocks, sizes no split divides).
Each rank can build every rank's inputs (seeded by rank), so the reference is computed by hand from the
routing, not taken from the executor's serial path. Each schedule runs on poisoned buffers, again on doubled
inputs (the other half of the copy-engine double buffer), and from its string form.
"""

from __future__ import annotations

import pytest
from executor_world import assert_every_rank_refused, errors_of, run_world

WORLD_SIZES = (2, 4)
TOLERANCE = {"fp32": 1e-5, "bf16": 1e-2}
# (m, top_k, experts, imbalances, dtype) per world size: m * top_k divides by world_size * 8, so every
# finer split is a candidate; k, n below.
CASES = {
    2: [(8, 2, 4, (1.0, 1.5, 2.0), "fp32"), (8, 2, 2, (1.0,), "bf16")],
    4: [(16, 2, 8, (1.0, 2.5, 4.0), "fp32")],
}
K, N, D = 12, 10, 6
RAGGED = {  # counts[src][dst][e]: empty experts, an empty block, blocks of 1 row, sizes no split divides
    2: [[[3, 0], [5, 2]], [[0, 0], [1, 9]]],
    4: [[[2], [0], [7], [1]], [[3], [3], [0], [5]], [[1], [11], [2], [0]], [[0], [4], [4], [9]]],
}


def _dispatch_reference(routing, xs, bs, rank):
    """By hand: for each local expert, each source's rows for it, in source order, times the weight."""
    import torch

    parts = []
    for e in range(routing.local_experts):
        for q in range(routing.world_size):
            start = sum(routing.sent(q)[:rank]) + sum(routing.counts[q][rank][:e])
            parts.append(xs[q][start : start + routing.counts[q][rank][e]].double() @ bs[rank][e].double())
    return torch.cat(parts)


def _combine_reference(routing, hs, bs, rank):
    """By hand: the rows this rank routed, in ``x``'s order, each computed by its expert's rank."""
    import torch

    parts = []
    for p in range(routing.world_size):
        for e in range(routing.local_experts):
            start = sum(routing.expert_rows(p)[:e]) + sum(routing.counts[q][p][e] for q in range(rank))
            rows = hs[p][start : start + routing.counts[rank][p][e]]
            parts.append(rows.double() @ bs[p][e].double())
    return torch.cat(parts)


def _inputs(routing, dtype, rank_count, seed, dims=(K, N, D)):
    """Every rank's dispatch input, combine input and weights (the same on every rank); ``dims``: k, n, d."""
    import torch

    k, n, d = dims
    xs, hs, b1, b2 = [], [], [], []
    for q in range(rank_count):
        gen = torch.Generator().manual_seed(seed + q)
        xs.append(torch.randn(sum(routing.sent(q)), k, generator=gen).to(dtype))
        hs.append(torch.randn(sum(routing.received(q)), n, generator=gen).to(dtype))
        b1.append(torch.randn(routing.local_experts, k, n, generator=gen).to(dtype))
        b2.append(torch.randn(routing.local_experts, n, d, generator=gen).to(dtype))
    return xs, hs, b1, b2


def _check_world(rank: int, world_size: int) -> dict:
    """Runs on every rank: every (routing, op, schedule); returns what the tests assert on."""
    from ficco import executor
    from ficco.executor.checks import DTYPES
    from ficco.features import Routing, Scenario, all_schedules, candidates, get_hardware

    dtypes = {name: d for d, name in DTYPES.items()}
    report: dict = {"results": [], "schedules_run": {}, "communicate": []}
    routings = []
    for m, top_k, experts, imbalances, dtype_name in CASES[world_size]:
        for imbalance in imbalances:
            scenario = Scenario(
                op="a2a_gemm",
                m=m,
                n=N,
                k=K,
                dtype=dtype_name,
                world_size=world_size,
                experts=experts,
                top_k=top_k,
                imbalance=imbalance,
                hardware=get_hardware("h200x8"),
            )
            label = f"m{m}-e{experts}-t{top_k}-i{imbalance:g}-{dtype_name}"
            routings.append((label, Routing.for_scenario(scenario), dtype_name, candidates(scenario)))
    routings.append(("ragged", Routing(RAGGED[world_size]), "fp32", all_schedules()))
    for label, routing, dtype_name, schedules in routings:
        xs, hs, b1, b2 = _inputs(routing, dtypes[dtype_name], world_size, seed=1000)
        want = {
            "a2a_gemm": _dispatch_reference(routing, xs, b1, rank),
            "gemm_a2a": _combine_reference(routing, hs, b2, rank),
        }
        args = {"a2a_gemm": (xs[rank], b1[rank]), "gemm_a2a": (hs[rank], b2[rank])}
        report["schedules_run"][label] = [str(s) for s in schedules]
        for op, (a, b) in args.items():
            for schedule in schedules:
                executor.poison_buffers()
                first = executor.run_op(op, a, b, schedule, routing=routing)
                again = executor.run_op(op, a * 2, b, schedule, routing=routing)
                third = executor.run_op(op, a, b, str(schedule), routing=routing)
                errors = [_rel(first, want[op]), _rel(again, 2 * want[op]), _rel(third, want[op])]
                report["results"].append((label, op, dtype_name, str(schedule), errors, tuple(first.shape)))
        for op in ("a2a_gemm", "gemm_a2a"):
            report["communicate"].append((label, op, _communicated(rank, routing, args[op][0], op)))
    report["piles"] = _state_after_many_routings(rank, world_size)
    report["bad_inputs"] = _bad_inputs(rank, world_size)
    return report


def _state_after_many_routings(rank: int, world_size: int) -> list[tuple[int, int, int]]:
    """(buffers, workspace views, routings kept) after each of 24 calls with a new routing every call (what
    an eager MoE layer does): what the executor keeps must not grow with the number of routings."""
    import torch

    from ficco import executor
    from ficco.executor.context import get_context
    from ficco.features import Routing

    executor.clear_buffers()
    ctx = get_context(None, torch.device("cpu"))
    seen = []
    for step in range(24):
        ranks = range(world_size)
        routing = Routing([[[(3 * src + 5 * dst + step) % 7 + 1] for dst in ranks] for src in ranks])
        x = torch.randn(sum(routing.sent(rank)), K)
        for schedule in ("serial/sm", "shard/sm", "finer/dma/s2/chunk", "serial/dma"):
            y = executor.all_to_all_matmul(x, torch.randn(1, K, N), routing, schedule)
            executor.matmul_all_to_all(y, torch.randn(1, N, D), routing, schedule)
        seen.append((len(ctx.buffers), len(ctx.workspace._views), len(ctx.routed)))
    return seen


def _communicated(rank, routing, x, op) -> bool:
    """Whether ``communicate`` of the all-to-all leaves the same rows on both executors and both stream
    layouts (the receive buffer of ``sm``, this rank's half of the peer memory for ``dma``)."""
    import torch

    from ficco import executor
    from ficco.executor.context import get_context
    from ficco.features import OP_SPECS

    ctx = get_context(None, x.device)
    direction = OP_SPECS[op].direction
    rows = sum(routing.received(rank)) if direction == "gather" else sum(routing.sent(rank))
    executor.communicate(op, x, "sm", routing=routing)
    want = ctx.rows_buffer("received", x.shape[1], x.dtype, rows)[:rows].clone()
    same = []
    for streams in ("auto", "current", "per_peer"):
        executor.poison_buffers()
        executor.communicate(op, x, "dma", routing=routing, streams=streams)
        ctx.workspace.advance()  # back to the half this call used
        got = ctx.workspace.rows(rank, x.shape[1], x.dtype)[:rows].clone()
        ctx.workspace.advance()
        same.append(bool(torch.equal(got, want)))
    return all(same)


def _bad_inputs(rank: int, world_size: int) -> list[tuple[str, str]]:
    """Each bad call's error (type: message) on this rank, then one good call to show no rank hangs."""
    import torch

    from ficco import executor
    from ficco.features import Routing

    w = world_size
    routing = Routing.synthetic(tokens=4, top_k=2, experts=2 * w, world_size=w)  # 8 rows per rank
    x, b = torch.randn(8, 16), torch.randn(2, 16, 4)
    calls = {
        "routing_type": lambda: executor.all_to_all_matmul(x, b, [[[1]]], "shard/sm"),
        "routing_ranks": lambda: executor.all_to_all_matmul(
            x, b, Routing.synthetic(tokens=4, top_k=2, experts=2 * (w + 1), world_size=w + 1), "serial/sm"
        ),
        "b_2d": lambda: executor.all_to_all_matmul(x, torch.randn(16, 4), routing, "shard/dma"),
        "b_experts": lambda: executor.all_to_all_matmul(x, torch.randn(3, 16, 4), routing, "shard/dma"),
        "b_k": lambda: executor.matmul_all_to_all(x, torch.randn(2, 12, 4), routing, "finer/sm/s2/chunk"),
        "x_rows": lambda: executor.all_to_all_matmul(torch.randn(9, 16), b, routing, "serial/dma"),
        "x_dtype": lambda: executor.matmul_all_to_all(x, b.to(torch.bfloat16), routing, "shard/sm"),
        "out": lambda: executor.all_to_all_matmul(x, b, routing, "shard/sm", out=torch.empty(3, 4)),
        "schedule": lambda: executor.all_to_all_matmul(x, b, routing, "finer/dma/s3/chunk"),
        "comm_routing": lambda: executor.communicate("a2a_gemm", x, "dma"),
        "comm_rows": lambda: executor.communicate("gemm_a2a", torch.randn(5, 4), "sm", routing=routing),
        "comm_op": lambda: executor.communicate("a2a", x, "sm", routing=routing),
        "run_op_routing": lambda: executor.run_op("ag_gemm", x, b[0], "serial/sm", routing=routing),
    }
    out = errors_of(calls)
    y = executor.all_to_all_matmul(x, b, routing, "finer/dma/s2/chunk")
    out.append(("good_call_after", str(tuple(y.shape))))
    return out


GROUPED_DIMS = (16, 24, 8)
"""k, n, d of the grouped world: multiples of 8, as ``torch._grouped_mm`` needs (``grouped_eligible``)."""


def _grouped_world(rank: int, world_size: int) -> dict:
    """Runs on every rank: every schedule of both ops in bf16 with every block's GEMMs grouped
    (``GROUPED_MIN_GEMMS`` = 1), on a balanced and a ragged routing (empty experts and blocks), with and
    without ``out``; counts the grouped GEMMs run (``torch._grouped_mm`` wrapped)."""
    import torch

    from ficco import executor
    from ficco.executor import experts as expert_module
    from ficco.features import Routing, all_schedules

    expert_module.GROUPED_MIN_GEMMS = 1
    calls = {"grouped": 0}
    grouped_mm = torch._grouped_mm

    def counting(*args, **kwargs):
        calls["grouped"] += 1
        return grouped_mm(*args, **kwargs)

    torch._grouped_mm = counting
    w = world_size
    routings = {
        "balanced": Routing.synthetic(tokens=8 * w, top_k=2, experts=4 * w, world_size=w),
        "ragged": Routing(RAGGED[world_size]),
    }
    results = []
    for label, routing in routings.items():
        xs, hs, b1, b2 = _inputs(routing, torch.bfloat16, world_size, seed=7, dims=GROUPED_DIMS)
        want = {
            "a2a_gemm": _dispatch_reference(routing, xs, b1, rank),
            "gemm_a2a": _combine_reference(routing, hs, b2, rank),
        }
        args = {"a2a_gemm": (xs[rank], b1[rank]), "gemm_a2a": (hs[rank], b2[rank])}
        for op, (a, b) in args.items():
            for schedule in all_schedules():
                executor.poison_buffers()
                got = executor.run_op(op, a, b, schedule, routing=routing)
                into = torch.full_like(got, float("nan"))
                executor.run_op(op, a, b, schedule, routing=routing, out=into)
                results.append((label, op, str(schedule), _rel(got, want[op]), _rel(into, want[op])))
    torch._grouped_mm = grouped_mm
    return {"results": results, "grouped_calls": calls["grouped"]}


@pytest.mark.slow
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_grouped_expert_gemms_match_the_reference_under_every_schedule(world_size):
    for report in run_world(world_size, _grouped_world):
        bad = [r for r in report["results"] if max(r[3:]) > TOLERANCE["bf16"]]
        assert not bad, f"world {world_size}: grouped schedules differing from the reference: {bad[:5]}"
        assert len(report["results"]) == 2 * 2 * 30
        assert report["grouped_calls"] >= len(report["results"])  # at least one grouped GEMM per call


def _rel(x, ref) -> float:
    if x.shape != ref.shape:
        return float("inf")
    return float((x.double() - ref).norm() / ref.norm()) if ref.numel() else 0.0  # no rows routed here


@pytest.fixture(scope="module", params=WORLD_SIZES, ids=[f"w{w}" for w in WORLD_SIZES])
def world(request) -> tuple[int, list[dict]]:
    return request.param, run_world(request.param, _check_world)


@pytest.mark.slow
def test_every_moe_schedule_matches_the_reference(world):
    world_size, reports = world
    for report in reports:
        bad = [r for r in report["results"] if not all(e <= TOLERANCE[r[2]] for e in r[4])]
        assert not bad, f"world {world_size}: schedules differing from the reference: {bad[:5]}"


@pytest.mark.slow
def test_every_candidate_runs_for_both_ops(world):
    world_size, reports = world
    for report in reports:
        for label, schedules in report["schedules_run"].items():
            for op in ("a2a_gemm", "gemm_a2a"):
                ran = [r[3] for r in report["results"] if r[:2] == (label, op)]
                assert ran == schedules and len(schedules) == 30, (world_size, label, op, len(ran))


@pytest.mark.slow
def test_communicate_moves_the_same_rows_on_both_executors(world):
    _, reports = world
    for report in reports:
        moved = report["communicate"]
        assert moved and all(same for *_, same in moved), moved


@pytest.mark.slow
@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ("routing_type", ["ValueError", "routing must be a features.Routing", "got list"]),
        ("routing_ranks", ["ValueError", "routing has counts for", "world_size="]),
        ("b_2d", ["ValueError", "b has shape [16, 4]", "3-D tensor [experts/world_size, k, n]"]),
        ("b_experts", ["ValueError", "b has shape [3, 16, 4]", "= [2, 16, n]"]),
        ("b_k", ["ValueError", "b has shape [2, 12, 4]", "= [2, 16, n]"]),
        ("x_rows", ["ValueError", "x has shape [9, 16]", "route 8 rows (routing.sent(", "expected [8, k]"]),
        ("x_dtype", ["ValueError", "b has dtype torch.bfloat16", "expected torch.float32"]),
        ("out", ["ValueError", "out has shape [3, 4]", "expected [rows, n] = [8, 4]"]),
        ("schedule", ["ValueError", "finer/dma/s3/chunk"]),
        ("comm_routing", ["ValueError", "routing must be a features.Routing", "got NoneType"]),
        ("comm_rows", ["ValueError", "x has shape [5, 4]", "expected [8, width]"]),
        ("comm_op", ["ValueError", "op in ['ag_gemm', 'gemm_rs', 'a2a_gemm', 'gemm_a2a']", "got op='a2a'"]),
        ("run_op_routing", ["ValueError", "routing applies only to the MoE ops"]),
    ],
)
def test_bad_input_raises_value_error_on_every_rank(world, call, expected):
    assert_every_rank_refused(world, call, expected)


@pytest.mark.slow
def test_new_routings_every_call_pile_up_no_buffers_or_views(world):
    from ficco.executor.experts import ROUTED_MAX

    _, reports = world
    for report in reports:
        seen = report["piles"]
        assert all(routed <= ROUTED_MAX for _, _, routed in seen), seen
        assert seen[-1][:2] == seen[len(seen) // 2][:2], seen  # buffers and views stop growing


@pytest.mark.slow
def test_bad_input_leaves_the_group_usable(world):
    _, reports = world
    for report in reports:
        assert dict(report["bad_inputs"])["good_call_after"] == str((8, 4))


def test_every_op_of_the_table_has_its_executor_function():
    from ficco import executor
    from ficco.features import OP_SPECS

    assert list(executor.OP_FUNCTIONS) == list(OP_SPECS)
    for name, spec in OP_SPECS.items():
        assert executor.OP_FUNCTIONS[name] is getattr(executor, spec.executor_fn), name
