"""TorchBackend on a CPU gloo world of 2 ranks: ok rows, failed rows, baselines, lockstep between ranks, for
the dense ops and the MoE all-to-alls under uneven routing."""

from __future__ import annotations

import dataclasses
import math
import os
import re

import pytest
from executor_world import run_world

from benchmarks.support.alone import time_rounds
from ficco.features import Scenario, Schedule, candidates, get_hardware
from ficco.harness.backend import Timing


def _scenario(op: str, m: int, n: int, k: int, dtype: str = "fp32", **moe) -> Scenario:
    """A scenario of this world (2 ranks on an h200x2 profile)."""
    return Scenario(op=op, m=m, n=n, k=k, dtype=dtype, world_size=2, hardware=get_hardware("h200x2"), **moe)


AG = _scenario("ag_gemm", 24, 16, 8)
RS = _scenario("gemm_rs", 32, 8, 16, dtype="bf16")
# rank 0 gets 48 of each rank's 64 routed rows, rank 1 the other 16
A2A = _scenario("a2a_gemm", 32, 8, 16, dtype="bf16", experts=4, top_k=2, imbalance=1.5)
# imbalance = world size: every routed row goes to rank 0, rank 1's experts get none (its dispatch output
# is empty here, its combine input and GEMM input in GEMM_A2A)
A2A_ALL_TO_0 = dataclasses.replace(A2A, imbalance=2.0)
GEMM_A2A = _scenario("gemm_a2a", 24, 16, 8, experts=4, top_k=2, imbalance=2.0)
IMPOSSIBLE = Schedule.parse("finer/dma/s8/chunk")  # 24 rows do not split into 2 ranks x 8 sub-chunks
CORRUPTED = "shard/dma"  # the worker adds 1 to this schedule's output (ag_gemm and the MoE ops)
CORRUPTED_OPS = ("ag_gemm", "a2a_gemm", "gemm_a2a")


def _corrupting(real):
    def corrupting(*args, **kwargs):
        out = real(*args, **kwargs)
        if any(str(arg) == CORRUPTED for arg in args):
            out.add_(1.0)
        return out

    return corrupting


def _measure_world(rank: int, world_size: int) -> dict:
    import torch

    from ficco import executor
    from ficco.harness.cpu_placement import placement_for_rank
    from ficco.harness.torch_backend import TorchBackend, _Case

    real = dict(executor.OP_FUNCTIONS)
    executor.OP_FUNCTIONS.update({op: _corrupting(real[op]) for op in CORRUPTED_OPS})  # what run_op calls
    a_shard = torch.randn(8, 16)
    before = os.sched_getaffinity(0)
    placement = placement_for_rank("share", rank, world_size, None)
    try:
        pinned = TorchBackend(
            device="cpu",
            modes=("eager",),
            timing=Timing(rounds=2, max_rounds=4, timed_ms=1e6),
            placement=placement,
        )
        backend = TorchBackend(
            device="cpu", modes=("eager",), timing=Timing(rounds=3, max_rounds=3, block_ms=0.2)
        )
        return {
            "ag": backend.measure(AG, [*candidates(AG), IMPOSSIBLE]),
            "rs": backend.measure(RS, candidates(RS)[:6]),
            "a2a": backend.measure(A2A, candidates(A2A)),
            "gemm_a2a": backend.measure(GEMM_A2A, candidates(GEMM_A2A)),
            "a2a_all_to_0": backend.measure(A2A_ALL_TO_0, candidates(A2A_ALL_TO_0)),
            "async_tp": {  # what the GPU backend would time (gloo never times async-TP)
                s.op: _Case(s, backend.device, 0, rank).baseline("async_tp_ms") is not None
                for s in (AG, RS, A2A, GEMM_A2A)
            },
            "fingerprint": backend.fingerprint(),
            "identity": (backend.name, backend.rank, backend.world_size),
            "protocol": backend.protocol(),
            "alone": time_rounds(backend, lambda: executor.communicate("ag_gemm", a_shard, "dma")),
            "sized": pinned.measure(RS, candidates(RS)[:3]),
            "pinned": (pinned.protocol()["pin"], placement.cpus, sorted(os.sched_getaffinity(0))),
            "phases": sorted(backend.phase_seconds),
        }
    finally:
        executor.OP_FUNCTIONS.update(real)
        os.sched_setaffinity(0, before)


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_world(2, _measure_world)


@pytest.mark.parametrize(
    ("key", "scenario"),
    [("ag", AG), ("rs", RS), ("a2a", A2A), ("gemm_a2a", GEMM_A2A), ("a2a_all_to_0", A2A_ALL_TO_0)],
)
def test_measure_times_every_good_schedule(results, key, scenario):
    rows = results[0][key].measurements
    good = [m for m in rows if m.schedule not in (CORRUPTED, str(IMPOSSIBLE)) or key == "rs"]
    assert good and all(m.ok and m.error == "" for m in good), [m for m in good if not m.ok]
    for m in good:
        assert 0 < m.p10_ms <= m.median_ms <= m.p90_ms, m
        assert m.mode == "eager" and len(m.round_ms) == 3 and min(m.round_ms) <= m.median_ms, m
    assert [m.schedule for m in rows][: len(candidates(scenario)[:6])] == [
        str(s) for s in candidates(scenario)[:6]
    ]


@pytest.mark.parametrize(
    ("key", "scenario"), [("a2a", A2A), ("gemm_a2a", GEMM_A2A), ("a2a_all_to_0", A2A_ALL_TO_0)]
)
def test_measure_runs_every_candidate_of_a_moe_op(results, key, scenario):
    rows = results[0][key].measurements
    assert len(candidates(scenario)) == 30  # every schedule: 64 or 48 routed rows split 2 x 8 ways
    assert [m.schedule for m in rows] == [str(s) for s in candidates(scenario)]
    assert [m.schedule for m in rows if not m.ok] == [CORRUPTED]


@pytest.mark.parametrize("key", ["ag", "a2a", "gemm_a2a"])
def test_measure_records_a_wrong_result_as_failed(results, key):
    row = next(m for m in results[0][key].measurements if m.schedule == CORRUPTED)
    assert not row.ok and "wrong result" in row.error and math.isnan(row.median_ms)


def test_measure_records_an_impossible_schedule_as_failed(results):
    row = results[0]["ag"].measurements[-1]
    assert row.schedule == str(IMPOSSIBLE) and not row.ok
    assert "divisible by world_size * splits = 16" in row.error


@pytest.mark.parametrize("key", ["ag", "a2a", "gemm_a2a"])
def test_measure_keeps_ranks_in_lockstep(results, key):
    first, second = ([(m.schedule, m.ok, m.error, m.round_ms) for m in r[key].measurements] for r in results)
    assert first == second  # the same outcomes, and the same round times (each the maximum over ranks)


@pytest.mark.parametrize("key", ["ag", "rs", "a2a", "gemm_a2a", "a2a_all_to_0"])
def test_measure_reports_baselines(results, key):
    assert set(results[0][key].baselines) == {"eager"}
    baselines = results[0][key].baselines["eager"]
    assert set(baselines) == {"gemm_alone_ms", "nccl_comm_ms", "dma_comm_ms", "async_tp_ms"}
    assert all(baselines[k] > 0 for k in ("gemm_alone_ms", "nccl_comm_ms", "dma_comm_ms")), baselines
    assert math.isnan(baselines["async_tp_ms"])  # no async-TP on the CPU


def test_async_tp_baseline_only_for_the_dense_ops(results):
    # PyTorch has no fused all-to-all + GEMM: on the GPU the MoE ops' async_tp_ms is "not measurable here"
    for result in results:
        assert result["async_tp"] == {"ag_gemm": True, "gemm_rs": True, "a2a_gemm": False, "gemm_a2a": False}


def test_torch_backend_identity_and_fingerprint(results):
    assert [r["identity"] for r in results] == [("gloo", 0, 2), ("gloo", 1, 2)]
    assert results[0]["fingerprint"]["backend"] == "gloo" and results[0]["fingerprint"]["world_size"] == 2
    assert results[0]["protocol"]["modes"] == ["eager"] and results[0]["protocol"]["rounds"] == 3


def test_rounds_are_sized_by_time_and_agreed_by_every_rank(results):
    # a tiny scenario is cheap: its schedules get max_rounds rounds (its baselines only the fewest)
    for result in results:
        assert [len(m.round_ms) for m in result["sized"].measurements] == [4, 4, 4]
    assert results[0]["sized"].measurements == results[1]["sized"].measurements
    assert results[0]["phases"] == ["captures", "checks", "inputs", "timing eager"]


def test_a_placement_pins_the_main_thread_before_timing_and_is_recorded(results):
    for result in results:
        policy, share, affinity = result["pinned"]
        assert policy == "share" and affinity == list(share)
    assert results[0]["pinned"][1] != results[1]["pinned"][1] or len(os.sched_getaffinity(0)) < 2
    assert results[0]["protocol"]["pin"] == "none"  # a backend built without a placement


def test_the_protocol_records_the_expert_gemms_and_the_copy_arrangement(results):
    from ficco.executor.context import DEFAULT_COPY_STREAMS
    from ficco.executor.experts import GROUPED_MIN_GEMMS

    assert results[0]["protocol"]["expert_gemms"] == f"grouped from {GROUPED_MIN_GEMMS}"
    assert results[0]["protocol"]["copy_streams"] == DEFAULT_COPY_STREAMS  # the executor's copy arrangement


def test_time_rounds_gives_one_time_per_round_the_same_on_every_rank(results):
    assert len(results[0]["alone"]) == 3 and all(t > 0 for t in results[0]["alone"])
    assert results[0]["alone"] == results[1]["alone"]  # each round's maximum over ranks


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"device": "tpu"}, "device"),
        ({"timing": {"rounds": 5}}, "TorchBackend.timing must be a Timing"),
        ({"device": "cpu", "modes": ("graph",)}, "modes"),
    ],
)
def test_torch_backend_rejects_bad_arguments(kwargs, message):
    from ficco.harness.torch_backend import TorchBackend

    with pytest.raises(ValueError, match=message if " " in message else f"TorchBackend.{message}"):
        TorchBackend(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rounds": 0}, "Timing.rounds must be an int >= 1; got 0"),
        ({"rounds": 5, "max_rounds": 4}, "Timing.max_rounds must be >= rounds=5; got 4"),
        ({"block_ms": 0}, "Timing.block_ms must be a number > 0; got 0"),
        ({"timed_ms": -1.0}, "Timing.timed_ms must be a number >= 0; got -1.0"),
    ],
)
def test_timing_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Timing(**kwargs)


def test_timing_sizes_rounds_by_time_within_bounds():
    timing = Timing(rounds=5, max_rounds=20, timed_ms=200.0)
    assert timing.rounds_for(100.0, "graph") == 5  # a long round: the fewest
    assert timing.rounds_for(20.0, "graph") == 10  # ceil(200 / 20)
    assert timing.rounds_for(19.0, "graph") == 11
    assert timing.rounds_for(1.0, "graph") == 20  # a short round: the most
    assert timing.rounds_for(100.0, "eager") == 6  # ceil(3 x 200 / 100): eager times 3x as long
    assert timing.rounds_for(20.0, "eager") == 20  # capped
    assert Timing(rounds=5, max_rounds=20, timed_ms=0).rounds_for(1.0, "eager") == 5  # sizing off
    assert timing.to_dict()["eager_timed_factor"] == 3.0  # recorded: a resume under another factor is refused


def test_graph_blocks_replay_an_even_number_of_calls():
    from ficco.harness.torch_backend import MAX_GRAPH_CALLS, graph_calls

    assert graph_calls(1) == (1, 1)
    for calls in (2, 5, 16, 63):
        per_graph, replays = graph_calls(calls)
        assert per_graph % 2 == 0 and per_graph <= MAX_GRAPH_CALLS  # the double-buffered halves alternate
        assert calls <= per_graph * replays < calls + per_graph
