"""The pull-against-push benchmark's CPU plumbing (gloo, tiny shapes): every schedule runs both ways and
matches serial, and the JSON holds one record per (shape, schedule, way) with the push / pull summary."""

from __future__ import annotations

import json

from executor_world import run_world

from benchmarks import gather_pull as bench


def _run(rank: int, world_size: int, out: str) -> None:
    bench.main(["--device", "cpu", "--scale-down", "256", "--rounds", "1", "--timed-ms", "0", "--out", out])


def test_cpu_run_times_every_schedule_both_ways(tmp_path):
    run_world(2, _run, str(tmp_path))
    data = json.loads((tmp_path / "gather-pull-cpu-x2.json").read_text())
    records = data["records"]
    assert not data["failed"] and all(r["rel_err"] <= bench.TOLERANCE for r in records)
    ways = {(r["m"], r["n"], r["k"], r["schedule"], r["way"]) for r in records}
    assert len(ways) == len(records) == len(bench.SHAPES) * (2 * len(bench.SCHEDULES) + len(bench.REFERENCES))
    assert all(r["ms"] > 0 and r["mode"] == "eager" for r in records)
    rows, gmean = bench.summarize(records)
    assert len(rows) == len(bench.SHAPES) * len(bench.SCHEDULES) and set(gmean) == {"eager"}
    assert data["gmean_push_over_pull"] == gmean
