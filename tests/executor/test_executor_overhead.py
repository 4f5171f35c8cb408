"""The executor-overhead benchmark on gloo: it times every case, and ``--pin`` places each rank's threads
after the warm-up (a fresh rank keeps every CPU it was given otherwise)."""

from __future__ import annotations

import json
import os
import sys

from executor_world import run_world

from benchmarks import executor_overhead
from ficco.harness.affinity import placement_from_env


def _run(rank: int, world_size: int, out: str) -> tuple[set[int], set[int]]:
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
    expected = set(placement_from_env("share", False).threads)
    sys.argv = ["executor_overhead.py", "--device", "cpu", "--pin", "share", "--schedules", "serial/sm",
                "shard/dma", "--rounds", "2", "--batch", "2", "--warmup", "1", "--out", out]  # fmt: skip
    executor_overhead.main()
    return expected, os.sched_getaffinity(0)


def test_pin_share_confines_each_rank_to_its_share_and_every_case_is_timed(tmp_path):
    out = tmp_path / "overhead.json"
    for expected, after in run_world(2, _run, str(out)):
        assert after == expected
    data = json.loads(out.read_text())
    cases = {(r["op"], r["schedule"]) for r in data["results"]}
    assert cases == {(op, s) for op in ("ag_gemm", "gemm_rs") for s in ("serial/sm", "shard/dma")}
    assert all(r["host_us_per_call"] > 0 and len(r["round_us"]) == 2 for r in data["results"])
    assert data["pin"] == "share"
