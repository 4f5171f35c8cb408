"""verify_plan: the planned step against serial variants, timed in place; what loses is pinned to
serial/sm on every rank alike, what wins keeps its schedule, and nothing is timed when nothing is planned.

The step here sleeps for each op a time that depends on the schedule the planner hands it, so which
variant is fastest is known (gaps of several milliseconds, far above the sleep's jitter)."""

from __future__ import annotations

import time

import pytest
import torch
from executor_world import run_world

from ficco.features import SERIAL
from ficco.runtime import FixedSource, OpRequest, Planner, verify_plan
from ficco.runtime.verify import ALL_SERIAL, PLANNED

UNIT_S = 0.004
"""One unit of simulated op time, seconds."""


def _request(m: int) -> OpRequest:
    return OpRequest(
        layer=f"l{m}", direction="fwd", op="ag_gemm", m=m, n=32, k=16, dtype="bf16", world_size=2
    )


def _step(planner: Planner, costs: dict[int, tuple[float, float]]) -> callable:
    """A step running one op per ``m`` in ``costs``; each sleeps ``costs[m][0]`` units when its schedule is
    ``serial/sm``, ``costs[m][1]`` otherwise."""
    requests = [_request(m) for m in costs]

    def step() -> None:
        for r in requests:
            serial_units, planned_units = costs[r.m]
            units = serial_units if str(planner.schedule(r)) == "serial/sm" else planned_units
            time.sleep(units * UNIT_S)

    return step


def _verify_world(rank: int, world_size: int, costs_by_rank: list[dict], kwargs: dict) -> dict:
    planner = Planner(FixedSource("shard/dma"))
    step = _step(planner, costs_by_rank[rank])
    verdict = verify_plan(
        planner, lambda: step, device=torch.device("cpu"), warmup=1, rounds=3, reps=2, **kwargs
    )
    schedules = {k.m: str(d.schedule) for k, d in planner.decisions.items()}
    reasons = {k.m: d.reason for k, d in planner.decisions.items()}
    return {
        "verdict": verdict.to_dict(),
        "schedules": schedules,
        "reasons": reasons,
        "table": planner.table(),
    }


# m -> (serial units, planned units): op 64 loses 2 units when overlapped, op 128 gains 1.
MIXED = {64: (1.0, 3.0), 128: (1.5, 0.5)}


@pytest.mark.slow
def test_a_single_losing_decision_is_pinned_and_the_winning_one_kept():
    out = run_world(2, _verify_world, [MIXED, MIXED], {})
    for rank_out in out:
        assert rank_out["verdict"]["winner"] == "serial:ag_gemm m=64 n=32 k=16 eager"
        assert rank_out["schedules"] == {64: "serial/sm", 128: "shard/dma"}
        assert "measured in the step" in rank_out["reasons"][64]
        assert "measured in the step" in rank_out["table"]
    times = out[0]["verdict"]["times_ms"]
    assert set(times) == {PLANNED, ALL_SERIAL, *(f"serial:ag_gemm m={m} n=32 k=16 eager" for m in MIXED)}
    assert set(out[0]["verdict"]["confirm_ms"]) == {PLANNED, "serial:ag_gemm m=64 n=32 k=16 eager"}


@pytest.mark.slow
def test_without_flips_the_whole_plan_goes_serial():
    out = run_world(2, _verify_world, [MIXED, MIXED], {"flips": False})
    assert out[0]["verdict"]["winner"] == ALL_SERIAL
    assert out[0]["schedules"] == {64: "serial/sm", 128: "serial/sm"}
    assert set(out[0]["verdict"]["times_ms"]) == {PLANNED, ALL_SERIAL}


@pytest.mark.slow
def test_a_faster_plan_is_kept():
    faster = {64: (3.0, 1.0), 128: (2.0, 1.0)}
    out = run_world(2, _verify_world, [faster, faster], {})
    assert out[0]["verdict"]["winner"] == PLANNED and out[0]["verdict"]["pinned"] == []
    assert out[0]["schedules"] == {64: "shard/dma", 128: "shard/dma"}


@pytest.mark.slow
def test_the_slowest_rank_decides_for_every_rank():
    """Only rank 1's op 64 loses when overlapped: both ranks pin it (a differing schedule would hang)."""
    fine = {64: (1.0, 0.5), 128: (1.5, 0.5)}
    out = run_world(2, _verify_world, [fine, MIXED], {})
    assert out[0]["schedules"] == out[1]["schedules"] == {64: "serial/sm", 128: "shard/dma"}
    assert out[0]["verdict"] == out[1]["verdict"]


@pytest.mark.slow
def test_a_gain_within_the_margin_keeps_the_plan():
    slightly = {64: (3.0, 3.2)}  # serial ~6% faster, inside a 50% margin
    out = run_world(2, _verify_world, [slightly, slightly], {"margin": 0.5})
    assert out[0]["verdict"]["winner"] == PLANNED
    assert out[0]["schedules"] == {64: "shard/dma"}


def _fading_world(rank: int, world_size: int) -> dict:
    """Op 64 is fast under serial/sm for its first 7 serial calls (all of the screening: 1 warm-up + 3
    rounds x 2 steps), slow after: the confirmation must catch the screening's lucky winner."""
    planner = Planner(FixedSource("shard/dma"))
    request, serial_calls = _request(64), []

    def step() -> None:
        if str(planner.schedule(request)) == "serial/sm":
            serial_calls.append(1)
            time.sleep((1.0 if len(serial_calls) <= 7 else 4.0) * UNIT_S)
        else:
            time.sleep(3.0 * UNIT_S)

    verdict = verify_plan(planner, lambda: step, device=torch.device("cpu"), warmup=1, rounds=3, reps=2)
    return {"verdict": verdict.to_dict(), "schedule": str(planner.decisions[planner.key(request)].schedule)}


@pytest.mark.slow
def test_a_gain_that_does_not_hold_on_fresh_timings_is_not_taken():
    out = run_world(2, _fading_world)[0]
    assert out["verdict"]["times_ms"][ALL_SERIAL] < out["verdict"]["times_ms"][PLANNED]  # screening: lucky
    assert set(out["verdict"]["confirm_ms"]) == {PLANNED, ALL_SERIAL}
    assert out["verdict"]["winner"] == PLANNED and out["schedule"] == "shard/dma"


def test_nothing_planned_times_nothing():
    planner = Planner(FixedSource("serial/sm"))
    calls = []
    step = _step(planner, {64: (0.0, 0.0)})
    verdict = verify_plan(planner, lambda: calls.append(1) or step, device=torch.device("cpu"))
    assert verdict.times_ms == {} == verdict.confirm_ms and verdict.pinned == () and verdict.winner == PLANNED
    assert calls == [1]  # built once (to record the keys), never timed


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rounds": 0}, r"verify_plan: rounds must be an int >= 1; got 0"),
        ({"warmup": -1}, r"verify_plan: warmup must be an int >= 0; got -1"),
        ({"margin": 1.0}, r"verify_plan: margin must be a fraction in \[0, 1\); got 1.0"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    planner = Planner(FixedSource("shard/dma"))
    with pytest.raises(ValueError, match=message):
        verify_plan(planner, lambda: lambda: None, device=torch.device("cpu"), **kwargs)


def test_override_and_recording_leave_the_decisions_alone():
    planner = Planner(FixedSource("shard/dma"))
    request = _request(64)
    with planner.recording() as used:
        assert str(planner.schedule(request)) == "shard/dma"
    key = planner.key(request)
    assert used == {key}
    planner.override({key: SERIAL})
    assert str(planner.schedule(request)) == "serial/sm"  # the hot path sees the override
    planner.override({})
    assert str(planner.schedule(request)) == "shard/dma"
    assert str(planner.decisions[key].schedule) == "shard/dma"
