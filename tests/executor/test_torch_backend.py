"""TorchBackend on a CPU gloo world of 2 ranks: ok rows, failed rows, baselines, lockstep between ranks."""

from __future__ import annotations

import math

import pytest
from executor_world import run_world

from ficco.features import Scenario, Schedule, candidates, get_hardware

AG = Scenario(op="ag_gemm", m=24, n=16, k=8, dtype="fp32", world_size=2, hardware=get_hardware("h200x2"))
RS = Scenario(op="gemm_rs", m=32, n=8, k=16, dtype="bf16", world_size=2, hardware=get_hardware("h200x2"))
MOE = Scenario(
    op="a2a_gemm", m=32, n=8, k=16, experts=4, top_k=2, world_size=2, hardware=get_hardware("h200x2")
)
IMPOSSIBLE = Schedule.parse("finer/dma/s8/chunk")  # 24 rows do not split into 2 ranks x 8 sub-chunks
CORRUPTED = "shard/dma"  # the worker adds 1 to this schedule's output


def _measure_world(rank: int, world_size: int) -> dict:
    import torch

    from ficco import executor
    from ficco.harness.torch_backend import TorchBackend

    real = executor.all_gather_matmul

    def corrupting(a_shard, b, schedule, group=None, **kwargs):
        out = real(a_shard, b, schedule, group, **kwargs)
        if str(schedule) == CORRUPTED:
            out.add_(1.0)
        return out

    executor.all_gather_matmul = corrupting
    a_shard = torch.randn(8, 16)
    try:
        backend = TorchBackend(device="cpu", modes=("eager",), rounds=3, block_ms=0.2)
        return {
            "ag": backend.measure(AG, [*candidates(AG), IMPOSSIBLE]),
            "rs": backend.measure(RS, candidates(RS)[:6]),
            "moe": backend.measure(MOE, candidates(MOE)[:2]),
            "fingerprint": backend.fingerprint(),
            "identity": (backend.name, backend.rank, backend.world_size),
            "protocol": backend.protocol(),
            "alone": backend.time_rounds(lambda: executor.communicate("ag_gemm", a_shard, "dma")),
        }
    finally:
        executor.all_gather_matmul = real


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_world(2, _measure_world)


def test_measure_times_every_good_schedule(results):
    for key, scenario in (("ag", AG), ("rs", RS)):
        rows = results[0][key].measurements
        good = [m for m in rows if m.schedule not in (CORRUPTED, str(IMPOSSIBLE)) or key == "rs"]
        assert good and all(m.ok and m.error == "" for m in good), [m for m in good if not m.ok]
        for m in good:
            assert 0 < m.p10_ms <= m.median_ms <= m.p90_ms, m
            assert m.mode == "eager" and len(m.round_ms) == 3 and min(m.round_ms) <= m.median_ms, m
        assert [m.schedule for m in rows][: len(candidates(scenario)[:6])] == [
            str(s) for s in candidates(scenario)[:6]
        ]


def test_measure_records_a_wrong_result_as_failed(results):
    row = next(m for m in results[0]["ag"].measurements if m.schedule == CORRUPTED)
    assert not row.ok and "wrong result" in row.error and math.isnan(row.median_ms)


def test_measure_records_an_impossible_schedule_as_failed(results):
    row = results[0]["ag"].measurements[-1]
    assert row.schedule == str(IMPOSSIBLE) and not row.ok
    assert "divisible by world_size * splits = 16" in row.error


def test_measure_keeps_ranks_in_lockstep(results):
    first, second = ([(m.schedule, m.ok, m.error, m.round_ms) for m in r["ag"].measurements] for r in results)
    assert first == second  # the same outcomes, and the same round times (each the maximum over ranks)


def test_measure_reports_baselines(results):
    for key in ("ag", "rs"):
        assert set(results[0][key].baselines) == {"eager"}
        baselines = results[0][key].baselines["eager"]
        assert set(baselines) == {"gemm_alone_ms", "nccl_comm_ms", "dma_comm_ms", "async_tp_ms"}
        assert all(baselines[k] > 0 for k in ("gemm_alone_ms", "nccl_comm_ms", "dma_comm_ms")), baselines
        assert math.isnan(baselines["async_tp_ms"])  # no async-TP on the CPU


def test_measure_fails_every_schedule_of_an_op_the_executor_does_not_run(results):
    result = results[0]["moe"]
    assert len(result.measurements) == 2
    assert all(not m.ok and "not run by the executor" in m.error for m in result.measurements)


def test_torch_backend_identity_and_fingerprint(results):
    assert [r["identity"] for r in results] == [("gloo", 0, 2), ("gloo", 1, 2)]
    assert results[0]["fingerprint"]["backend"] == "gloo" and results[0]["fingerprint"]["world_size"] == 2
    assert results[0]["protocol"]["modes"] == ["eager"] and results[0]["protocol"]["rounds"] == 3


def test_time_rounds_gives_one_time_per_round_the_same_on_every_rank(results):
    assert len(results[0]["alone"]) == 3 and all(t > 0 for t in results[0]["alone"])
    assert results[0]["alone"] == results[1]["alone"]  # each round's maximum over ranks


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"device": "tpu"}, "device"),
        ({"rounds": 0}, "rounds"),
        ({"block_ms": 0}, "block_ms"),
        ({"device": "cpu", "modes": ("graph",)}, "modes"),
    ],
)
def test_torch_backend_rejects_bad_arguments(kwargs, message):
    from ficco.harness.torch_backend import TorchBackend

    with pytest.raises(ValueError, match=f"TorchBackend.{message}"):
        TorchBackend(**kwargs)
