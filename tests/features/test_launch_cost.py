"""Host time per call: launch counts against the executor's plans, prices against the measured overhead, and
the host-over-GPU column."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from ficco.features import (
    DENSE_OPS,
    MOE_OPS,
    OP_SPECS,
    Routing,
    Scenario,
    Schedule,
    all_schedules,
    feature_matrix,
    roofline_comm_us,
    roofline_gemm_us,
)
from ficco.features.launch_cost import (
    FIT_TOLERANCE,
    HOST_FACTOR_RANGE,
    TWIN_OF,
    HostCosts,
    LaunchCounts,
    check_host_factor,
    estimate_host_factor,
    host_over_gpu,
    host_prices,
    host_us,
    launch_counts,
)

OVERHEAD = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "executor-overhead-h200x2.json"
OVERLAPPED = [s for s in all_schedules() if str(s) != "serial/sm"]


def _plan(op: str, world_size: int, schedule):
    from ficco.executor.plan import make_plan

    spec = OP_SPECS[op]
    return make_plan(spec.direction, world_size, schedule.granularity, schedule.splits, schedule.grain)


@pytest.mark.parametrize("world_size", [2, 4, 8])
@pytest.mark.parametrize("op", DENSE_OPS)
def test_dense_counts_follow_the_executor_plan(op, world_size):
    for schedule in OVERLAPPED:
        plan = _plan(op, world_size, schedule)
        counts = launch_counts(op, world_size, schedule)
        pieces = sum(len(batch) for batch in plan.rounds)
        sending = sum(1 for unit in plan.units if unit.pieces)
        gather = OP_SPECS[op].direction == "gather"
        assert counts.gemms == len(plan.units), schedule
        if schedule.executor == "sm":
            assert counts.p2p_groups == (len(plan.rounds) if gather else sending), schedule
            assert counts.peer_copies == counts.barriers == 0
        else:
            assert counts.peer_copies == pieces, schedule
            assert counts.barriers == (len(plan.rounds) if gather else 1), schedule
        assert counts.collectives == 0 and counts.calls == 1


def test_the_reference_is_one_collective_and_one_gemm_per_expert():
    serial = all_schedules()[0]
    assert launch_counts("ag_gemm", 4, serial) == LaunchCounts(gemms=1, collectives=1)
    assert launch_counts("a2a_gemm", 2, serial, local_experts=16) == LaunchCounts(
        gemms=16, kernels=1, collectives=1
    )


@pytest.mark.parametrize("op", ["ag_gemm", "gemm_rs"])
def test_one_copy_stream_runs_serial_copies_inline_and_shares_a_lane(op):
    """Under the shipped copy arrangement (one side stream): ``serial/dma`` has no GEMM to overlap, so its
    copies run on the caller's stream with no events; a finer call's rounds use one lane, not one per peer."""
    serial = Schedule.parse("serial/dma")
    inline = launch_counts(op, 4, serial, copy_streams=1)
    per_peer = launch_counts(op, 4, serial)
    assert inline.syncs == 0 < per_peer.syncs
    assert (inline.peer_copies, inline.barriers, inline.gemms) == (per_peer.peer_copies, per_peer.barriers, 1)
    finer = Schedule.parse("finer/dma/s4/chunk")
    one_lane, lanes = launch_counts(op, 4, finer, copy_streams=1), launch_counts(op, 4, finer)
    assert one_lane.syncs < lanes.syncs and one_lane.peer_copies == lanes.peer_copies
    # at 2 ranks every arrangement has one lane; only serial/dma changes
    assert launch_counts(op, 2, finer, copy_streams=1) == launch_counts(op, 2, finer)


@pytest.mark.parametrize(("experts", "world_size"), [(8, 2), (16, 2), (6, 2), (32, 4)])
@pytest.mark.parametrize("op", MOE_OPS)
def test_moe_gemms_are_the_executors_segments_on_balanced_routing(op, experts, world_size):
    from ficco.executor.experts import RoutedState

    routing = Routing.synthetic(tokens=4096, top_k=2, experts=experts, world_size=world_size)
    state = RoutedState(routing=routing, rank=0)
    local = experts // world_size
    for schedule in OVERLAPPED:
        plan = _plan(op, world_size, schedule)
        gemms = state.unit_gemms(plan, state.layout(OP_SPECS[op].direction, plan.splits))
        # a whole unit (serial) runs one GEMM per expert over every row
        want = sum(len(gemms[id(unit)].segments) for unit in plan.units)
        assert launch_counts(op, world_size, schedule, local).gemms == want, schedule


def test_prices_reproduce_the_measured_host_time_per_call():
    from ficco.features import Schedule

    rows = json.loads(OVERHEAD.read_text())["results"]
    assert len(rows) >= 14
    for row in rows:
        price = host_us(row["op"], 2, Schedule.parse(row["schedule"]))
        assert price == pytest.approx(row["host_us_per_call"], rel=FIT_TOLERANCE), row


def test_twins_launch_the_same_for_every_op_and_world_size():
    names = [str(s) for s in all_schedules()]
    assert len(set(TWIN_OF.tolist())) == 16 and names[TWIN_OF[names.index("shard/dma/hp")]] == "shard/dma"
    for op in (*DENSE_OPS, *MOE_OPS):
        for world_size in (2, 4, 8):
            counts = [launch_counts(op, world_size, s, 4) for s in all_schedules()]
            assert all(counts[i] == counts[t] for i, t in enumerate(TWIN_OF))


def test_every_launch_kind_has_a_price():
    assert [f.name for f in fields(HostCosts)] == [f.name for f in fields(LaunchCounts)]


def test_host_over_gpu_is_the_price_over_the_roofline_work():
    scenarios = [
        Scenario(m=1024, n=1024, k=1024),
        Scenario(op="gemm_rs", m=65536, n=8192, k=8192, world_size=2),
        Scenario(op="gemm_a2a", m=4096, n=2048, k=7168, experts=256, top_k=8, imbalance=1.5),
    ]
    X = feature_matrix(scenarios)
    ratio = host_over_gpu(X)
    assert ratio.shape == (3, len(all_schedules())) and np.all(ratio > 0)
    for i, s in enumerate(scenarios):
        local = max(s.experts // s.world_size, 1)
        gpu_us = roofline_gemm_us(s) + roofline_comm_us(s)
        want = [host_us(s.op, s.world_size, schedule, local) / gpu_us for schedule in all_schedules()]
        np.testing.assert_allclose(ratio[i], want, rtol=1e-9)
        assert np.array_equal(host_over_gpu(X[i : i + 1])[0], ratio[i])  # one row: the same numbers
    # a small GEMM is host-bound, a large one is not; 128 local experts pay 128 GEMM launches
    assert ratio[0, 0] > 1 > ratio[1, 0] and ratio[2, 0] > ratio[1, 0]
    assert host_over_gpu(X[:0]).shape == (0, len(all_schedules()))


# host_over_gpu of REFERENCE (tests/features/test_vector.py's) for serial/sm, shard/dma, finer/sm/s8/chunk:
# if prices, counts or the formula change, bump FEATURE_SCHEMA_VERSION in features/vector.py and re-pin.
REFERENCE = Scenario(op="gemm_rs", m=16384, n=8192, k=14336, world_size=2)
PINNED_REFERENCE = (0.01134, 0.02256, 0.11911)


def test_schema_pins_the_host_column_of_the_reference():
    names = [str(s) for s in all_schedules()]
    ratio = host_over_gpu(feature_matrix([REFERENCE]))[0]
    got = tuple(
        round(float(ratio[names.index(s)]), 5) for s in ("serial/sm", "shard/dma", "finer/sm/s8/chunk")
    )
    assert got == PINNED_REFERENCE


def test_host_prices_are_host_us_and_the_host_factor_scales_the_ratio():
    scenarios = [Scenario(op="ag_gemm", m=512), Scenario(op="gemm_rs", m=65536, n=8192, k=8192)]
    X = feature_matrix(scenarios)
    prices = host_prices(X)
    for row, s in zip(prices, scenarios, strict=True):
        assert row.tolist() == [host_us(s.op, s.world_size, schedule) for schedule in all_schedules()]
    np.testing.assert_allclose(host_over_gpu(X, 1.5), 1.5 * host_over_gpu(X))
    np.testing.assert_allclose(host_over_gpu(X[:1], 0.5), 0.5 * host_over_gpu(X[:1]))  # the one-row path


def test_estimate_host_factor_reads_the_host_bound_pairs_only():
    prices = np.array([[50.0, 80.0, 120.0], [50.0, 80.0, 120.0]])  # us
    eager = prices * 1.3e-3  # host-bound: 1.3x the prices, in ms
    eager[1] = [2.0, 1.8, 1.7]  # a large scenario: GPU-bound
    graph = np.array([[0.02, 0.02, 0.03], [1.9, 1.7, 1.6]])
    assert estimate_host_factor(eager, graph, prices) == pytest.approx(1.3)
    eager[0, 2] = np.nan  # unmeasured pairs are left out
    assert estimate_host_factor(eager, graph, prices) == pytest.approx(1.3)
    assert np.isnan(estimate_host_factor(eager[1:], graph[1:], prices[1:]))  # nothing host-bound


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), HOST_FACTOR_RANGE[1] * 2])
def test_check_host_factor_names_the_value_and_the_range(bad):
    with pytest.raises(ValueError, match=r"host_factor must be in \[0.25, 8\].*got"):
        check_host_factor(bad)
    assert check_host_factor(1) == 1.0
