"""Every candidate schedule of both ops against the serial reference, on CPU gloo worlds of 2, 4 and 8 ranks.

One world per world size runs every check inside its ranks (``_check_world``) and returns a report; the
tests below assert on it. Each schedule runs with the executor's buffers poisoned (NaN) first, so a piece
that never moves cannot pass on data a previous schedule left behind, then again on doubled inputs
(buffer reuse across calls, including the second half of the copy-engine double buffer).
"""

from __future__ import annotations

import pytest
from executor_world import assert_every_rank_refused, errors_of, run_world

WORLD_SIZES = (2, 4, 8)
TOLERANCE = {"fp32": 1e-5, "bf16": 1e-2, "fp16": 1e-2}
# (m, n, k, dtype) per world size; m must divide by world_size * 8 for every finer split to be a candidate.
CASES = {
    2: [(32, 24, 40, "fp32"), (48, 40, 24, "bf16"), (16, 8, 8, "fp16")],
    4: [(64, 24, 40, "fp32"), (96, 16, 24, "bf16")],
    8: [(64, 16, 24, "bf16")],
}


def _check_world(rank: int, world_size: int) -> dict:
    """Runs on every rank: the whole check matrix; returns what the tests assert on."""
    import torch

    from ficco import executor
    from ficco.executor.checks import DTYPES
    from ficco.features import SERIAL, Scenario, candidates, get_hardware

    dtypes = {name: d for d, name in DTYPES.items()}
    report: dict = {"results": [], "gathered": [], "schedules_run": {}}
    gen = torch.Generator().manual_seed(1234 + rank)
    for m, n, k, dtype_name in CASES[world_size]:
        dtype = dtypes[dtype_name]
        for op in ("ag_gemm", "gemm_rs"):
            hardware = get_hardware("h200x8")
            scenario = Scenario(
                op=op, m=m, n=n, k=k, dtype=dtype_name, world_size=world_size, hardware=hardware
            )
            rows = m // world_size if op == "ag_gemm" else m
            a = torch.randn(rows, k, generator=gen).to(dtype)
            b = torch.randn(k, n, generator=gen).to(dtype)
            fn = executor.all_gather_matmul if op == "ag_gemm" else executor.matmul_reduce_scatter
            ref = fn(a, b, SERIAL).float()
            schedules = candidates(scenario)
            report["schedules_run"][(op, m, n, k, dtype_name)] = [str(s) for s in schedules]
            for schedule in schedules:
                executor.poison_buffers()
                first = fn(a, b, schedule).float()
                again = fn(a * 2, b, schedule).float()  # reuse: the other half of the double buffer
                third = fn(a, b, str(schedule)).float()  # the string form, back on the first half
                errors = [_rel(first, ref), _rel(again, 2 * ref), _rel(third, ref)]
                report["results"].append((op, m, n, k, dtype_name, str(schedule), errors, tuple(first.shape)))
                if op == "ag_gemm":
                    c, gathered = fn(a, b, schedule, return_gathered=True)
                    full = torch.empty(m, k, dtype=dtype)
                    torch.distributed.all_gather_into_tensor(full, a)
                    report["gathered"].append(
                        (str(schedule), bool(torch.equal(gathered, full)), _rel(c.float(), ref))
                    )
    report["bad_inputs"] = _bad_inputs(rank, world_size)
    return report


def _bad_inputs(rank: int, world_size: int) -> list[tuple[str, str]]:
    """Each bad call's error (type: message) on this rank, then one good call to show no rank hangs."""
    import torch

    from ficco import executor

    w = world_size
    a_shard, b = torch.randn(8, 16), torch.randn(16, 4)
    calls = {
        "ag_b_rows": lambda: executor.all_gather_matmul(a_shard, torch.randn(12, 4), "serial/sm"),
        "ag_dtype": lambda: executor.all_gather_matmul(a_shard, b.to(torch.bfloat16), "shard/dma"),
        "ag_splits": lambda: executor.all_gather_matmul(torch.randn(6, 16), b, "finer/sm/s4/chunk"),
        "ag_out": lambda: executor.all_gather_matmul(a_shard, b, "serial/dma", out=torch.empty(3, 4)),
        "ag_1d": lambda: executor.all_gather_matmul(torch.randn(8), b, "serial/sm"),
        "ag_int": lambda: executor.all_gather_matmul(a_shard.long(), b.long(), "serial/sm"),
        "ag_schedule": lambda: executor.all_gather_matmul(a_shard, b, "finer/dma/s3/chunk"),
        "rs_rows": lambda: executor.matmul_reduce_scatter(torch.randn(4 * w + 1, 16), b, "shard/sm"),
        "rs_splits": lambda: executor.matmul_reduce_scatter(torch.randn(4 * w, 16), b, "finer/dma/s8/shard"),
        "rs_b_cols": lambda: executor.matmul_reduce_scatter(
            torch.randn(8 * w, 16), torch.randn(4, 16), "shard/dma"
        ),
    }
    out = errors_of(calls)
    c = executor.all_gather_matmul(a_shard, b, "finer/dma/s2/chunk")
    out.append(("good_call_after", str(tuple(c.shape))))
    return out


def _rel(x, ref) -> float:
    return float((x - ref).norm() / ref.norm())


@pytest.fixture(scope="module", params=WORLD_SIZES, ids=[f"w{w}" for w in WORLD_SIZES])
def world(request) -> tuple[int, list[dict]]:
    return request.param, run_world(request.param, _check_world)


def test_every_candidate_matches_serial(world):
    world_size, reports = world
    for report in reports:
        bad = [r for r in report["results"] if not all(e <= TOLERANCE[r[4]] for e in r[6])]
        assert not bad, f"world {world_size}: schedules differing from serial/sm: {bad[:5]}"


def test_every_candidate_runs_for_every_case(world):
    world_size, reports = world
    for report in reports:
        for (op, m, n, k, dtype), schedules in report["schedules_run"].items():
            ran = [r[5] for r in report["results"] if r[:5] == (op, m, n, k, dtype)]
            assert ran == schedules and len(schedules) == 30, (world_size, op, m, len(ran))


def test_output_shapes_follow_the_op(world):
    world_size, reports = world
    for report in reports:
        for op, m, n, _k, _dtype, schedule, _errors, shape in report["results"]:
            expected = (m, n) if op == "ag_gemm" else (m // world_size, n)
            assert shape == expected, (op, schedule, shape, expected)


def test_return_gathered_is_the_all_gather(world):
    world_size, reports = world
    for report in reports:
        assert report["gathered"], world_size
        for schedule, equal, err in report["gathered"]:
            assert equal, f"world {world_size}, {schedule}: gathered A differs from all_gather"
            assert err <= 1e-2, (schedule, err)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ("ag_b_rows", ["ValueError", "b has shape [12, 4]", "expected [k, n] = [16, n]"]),
        ("ag_dtype", ["ValueError", "b has dtype torch.bfloat16", "expected torch.float32"]),
        ("ag_splits", ["ValueError", "a_shard has shape [6, 16]", "splits=4"]),
        ("ag_out", ["ValueError", "out has shape [3, 4]", "expected [m, n]"]),
        ("ag_1d", ["ValueError", "a_shard has shape [8]", "2-D"]),
        ("ag_int", ["ValueError", "a_shard has dtype torch.int64"]),
        ("ag_schedule", ["ValueError", "finer/dma/s3/chunk"]),
        ("rs_rows", ["ValueError", "a has shape", "world_size * splits"]),
        ("rs_splits", ["ValueError", "finer/dma/s8/shard", "world_size * splits"]),
        ("rs_b_cols", ["ValueError", "b has shape [4, 16]", "expected [k, n] = [16, n]"]),
    ],
)
def test_bad_input_raises_value_error_on_every_rank(world, call, expected):
    assert_every_rank_refused(world, call, expected)


def test_bad_input_leaves_the_group_usable(world):
    world_size, reports = world
    for report in reports:
        assert dict(report["bad_inputs"])["good_call_after"] == str((8 * world_size, 4))
