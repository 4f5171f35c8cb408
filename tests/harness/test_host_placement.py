"""benchmarks/host_placement.py's summary: per (policy, op, schedule), the jobs' host times, their median,
spread and coefficient of variation."""

from __future__ import annotations

import pytest

from benchmarks.host_placement import summarize


def _job(pin: str, us: float) -> dict:
    return {"pin": pin, "results": [{"op": "ag_gemm", "schedule": "shard/dma", "host_us_per_call": us}]}


def test_summary_keeps_every_job_and_measures_the_spread_between_them():
    times = [("none", 60.0), ("core", 50.0), ("none", 80.0), ("core", 51.0), ("none", 70.0)]
    jobs = [_job(pin, us) for pin, us in times]
    rows = {row["policy"]: row for row in summarize(jobs)}
    assert rows["none"]["jobs_us"] == [60.0, 80.0, 70.0] and rows["none"]["median_us"] == 70.0
    assert rows["none"]["spread"] == pytest.approx(80 / 60, abs=1e-3)
    assert rows["core"]["spread"] == pytest.approx(51 / 50, abs=1e-3)
    assert rows["core"]["cv"] < rows["none"]["cv"]
