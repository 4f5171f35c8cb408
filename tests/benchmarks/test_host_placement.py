"""benchmarks.studies.host.host_placement: its jobs' commands (loopback, a fixed address-space layout),
the summary per (policy, layout, op, schedule) of the jobs' host times, their median, spread and
coefficient of variation, and the drift table that divides each job's times by its pure-Python reference."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest

from benchmarks.studies.host.host_placement import (
    PYTHON_REFERENCE,
    drift,
    fixed_layout_refused,
    job_command,
    slowest,
    summarize,
)


def _job(pin: str, us: float, layout: str | None = None, python_us: float | None = None) -> dict:
    job = {"pin": pin, "results": [{"op": "ag_gemm", "schedule": "shard/dma", "host_us_per_call": us}]}
    if layout:
        job["layout"] = layout
    if python_us:
        job["primitives"] = [{"primitive": PYTHON_REFERENCE, "host_us_per_call": python_us}]
    return job


def test_summary_keeps_every_job_and_measures_the_spread_between_them():
    times = [("none", 60.0), ("core", 50.0), ("none", 80.0), ("core", 51.0), ("none", 70.0)]
    jobs = [_job(pin, us) for pin, us in times]
    rows = {row["policy"]: row for row in summarize(jobs)}
    assert rows["none"]["jobs_us"] == [60.0, 80.0, 70.0] and rows["none"]["median_us"] == 70.0
    assert rows["none"]["spread"] == pytest.approx(80 / 60, abs=1e-3)
    assert rows["core"]["spread"] == pytest.approx(51 / 50, abs=1e-3)
    assert rows["core"]["cv"] < rows["none"]["cv"]
    assert {row["layout"] for row in rows.values()} == {"random"}  # jobs from before the layouts


def test_summary_keeps_layouts_and_primitives_apart():
    jobs = [_job("none", 60.0, "random", 3.0), _job("none", 90.0, "fixed", 3.0),
            _job("none", 66.0, "random", 3.3)]  # fmt: skip
    rows = {(r["layout"], r["op"], r["schedule"]): r for r in summarize(jobs)}
    assert rows["random", "ag_gemm", "shard/dma"]["jobs_us"] == [60.0, 66.0]
    assert rows["fixed", "ag_gemm", "shard/dma"]["jobs_us"] == [90.0]
    assert rows["random", "primitive", PYTHON_REFERENCE]["jobs_us"] == [3.0, 3.3]


def test_drift_tells_the_interpreters_speed_from_the_rest():
    # random: calls move 1.5x with the interpreter; fixed: calls move 1.5x while the interpreter holds still
    jobs = [_job("core", 60.0, "random", 2.0), _job("core", 90.0, "random", 3.0),
            _job("core", 60.0, "fixed", 2.0), _job("core", 90.0, "fixed", 2.0)]  # fmt: skip
    rows = {r["layout"]: r for r in drift(jobs)}
    assert rows["random"]["calls_spread"] == pytest.approx(1.5) and rows["random"]["python_spread"] == 1.5
    assert rows["random"]["calls_over_python_spread"] == pytest.approx(1.0)
    assert rows["fixed"]["python_spread"] == 1.0 and rows["fixed"]["calls_over_python_spread"] == 1.5
    assert rows["fixed"]["jobs"] == 2
    assert drift([_job("core", 60.0), _job("core", 90.0)]) == []  # no reference: no drift table


def _args(**kwargs) -> argparse.Namespace:
    base = {"loopback": False, "world_size": 2, "nproc": 2, "device": "cuda", "rounds": 3, "batch": 5,
            "schedules": ["serial/sm"], "primitives": False}  # fmt: skip
    return argparse.Namespace(**base | kwargs)


def test_job_commands_run_torchrun_or_one_loopback_process_under_the_layout():
    torchrun = job_command("share", "random", Path("o.json"), _args())
    assert "torch.distributed.run" in torchrun and "--loopback" not in torchrun
    assert torchrun[torchrun.index("--pin") + 1] == "share"
    args = _args(loopback=True, world_size=4, primitives=True)
    loopback = job_command("core", "fixed", Path("o.json"), args)
    assert loopback[:3] == ["setarch", loopback[1], "-R"] and "torch.distributed.run" not in loopback
    assert loopback[loopback.index("--world-size") + 1] == "4" and "--primitives" in loopback


def test_setarch_turns_address_space_randomisation_off_for_the_job():
    if refused := fixed_layout_refused():
        pytest.skip(refused)
    command = job_command("none", "fixed", Path("o.json"), _args())
    setarch = command[: command.index("-R") + 1]
    personality = subprocess.run([*setarch, "cat", "/proc/self/personality"], capture_output=True, text=True)
    assert int(personality.stdout, 16) & 0x0040000  # ADDR_NO_RANDOMIZE


def test_a_job_of_several_processes_takes_each_cases_slowest_process():
    bodies = [_job("seek", 60.0, python_us=3.0), _job("seek", 75.0, python_us=2.5), _job("seek", 70.0)]
    bodies[2]["primitives"] = [{"primitive": PYTHON_REFERENCE, "host_us_per_call": 2.8}]
    merged = slowest(bodies)
    assert merged["results"][0]["host_us_per_call"] == 75.0
    assert merged["primitives"][0]["host_us_per_call"] == 3.0
