"""The host-speed measurement: the interleaved timing loop, and the host factor on a gloo world of 2 ranks."""

from __future__ import annotations

import json

import pytest
from executor_world import run_world
from typer.testing import CliRunner

from ficco.cli import app
from ficco.features import Schedule
from ficco.features.launch_cost import host_us
from ficco.harness.host_factor import CASES, CPU_DEVICE, HostCase, HostSpeed, time_host_calls


class FakeClock:
    """Seconds that advance only when a call says so: timings without a real clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_time_host_calls_times_every_case_every_round_after_the_warm_up():
    clock, log = FakeClock(), []

    def call(name: str, seconds: float):
        def run() -> None:
            log.append(name)
            clock.now += seconds

        return run

    calls = {"a": call("a", 1e-6), "b": call("b", 3e-6)}
    syncs = []
    (times,) = time_host_calls(
        calls,
        rounds=4,
        batch=5,
        warmup=2,
        seed=0,
        sync=lambda: syncs.append(len(log)),
        clocks=(clock,),
        after_warmup=lambda: log.append("placed"),
    )
    assert log[:5] == ["a", "a", "b", "b", "placed"]  # warm-up of every case, then the hook, once
    assert log.count("placed") == 1 and len(log) == 5 + 4 * 2 * 5
    assert times == {"a": pytest.approx([1.0] * 4), "b": pytest.approx([3.0] * 4)}  # us per call
    assert len(syncs) == 4 * 2 + 1  # before every batch and at the end
    orders = [tuple(dict.fromkeys(log[5 + r * 10 : 5 + (r + 1) * 10])) for r in range(4)]
    assert len(set(orders)) == 2  # the order is shuffled per round


def test_summary_says_what_a_gloo_factor_is_and_how_to_use_a_gpu_one():
    case = HostCase(op="ag_gemm", schedule="serial/sm", measured_us=60.0, priced_us=47.5)
    gpu = HostSpeed(factor=1.26, cases=(case,), world_size=2, device="NVIDIA H200").summary()
    assert "--host-factor 1.26" in gpu and "host_factor=1.26" in gpu
    gloo = HostSpeed(factor=9.0, cases=(case,), world_size=2, device=CPU_DEVICE).summary()
    assert "not a GPU machine's host speed" in gloo and "--host-factor" not in gloo
    far = HostSpeed(factor=9.0, cases=(case,), world_size=2, device="NVIDIA H200").summary()
    assert "outside the range 0.25-8.0" in far


def _measure(rank: int, world_size: int) -> dict:
    from ficco.harness.host_factor import measure_host_factor

    return measure_host_factor(rounds=3, batch=2, warmup=1).to_dict()


def test_measure_host_factor_on_gloo_prices_every_case_and_agrees_on_every_rank():
    results = run_world(2, _measure)
    assert results[0] == results[1]  # every rank reports the slowest rank's times
    result = results[0]
    assert result["device"] == CPU_DEVICE and result["world_size"] == 2
    assert [(c["op"], c["schedule"]) for c in result["cases"]] == list(CASES)
    for c in result["cases"]:
        assert c["priced_us"] == host_us(c["op"], 2, Schedule.parse(c["schedule"]))
        assert c["measured_us"] > 0
    ratios = sorted(c["measured_us"] / c["priced_us"] for c in result["cases"])
    assert result["factor"] == pytest.approx((ratios[5] + ratios[6]) / 2, rel=1e-3)  # the median of 12


@pytest.mark.heavy
def test_cli_host_factor_runs_the_measurement_under_torchrun(tmp_path):
    out = tmp_path / "host.json"
    result = CliRunner().invoke(
        app, ["host-factor", "--backend", "gloo", "--rounds", "3", "--batch", "2", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["world_size"] == 2
