"""The executor-overhead benchmark on gloo: it times every case, and ``--pin`` places each rank's threads
after the warm-up (a fresh rank keeps every CPU it was given otherwise)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from executor_world import run_world

from benchmarks import REPO, executor_overhead
from ficco.harness.cpu_placement import placement_from_env


def _run(rank: int, world_size: int, out: str) -> tuple[set[int], set[int]]:
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
    expected = set(placement_from_env("share", False).cpus)
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


def _overhead(*args: str) -> subprocess.CompletedProcess:
    """``python -m benchmarks.executor_overhead ARGS`` in a new interpreter (``--loopback`` makes its own
    group)."""
    command = [sys.executable, "-m", "benchmarks.executor_overhead", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_loopback_times_every_case_of_a_pretend_world_on_local_peer_memory(tmp_path):
    out = tmp_path / "loopback.json"
    ops, schedules = ["ag_gemm", "gemm_rs", "gemm_a2a"], ["serial/sm", "shard/sm", "finer/dma/s4/chunk"]
    done = _overhead("--device", "cpu", "--loopback", "--world-size", "4", "--ops", *ops, "--experts", "8",
                     "--tokens", "16", "--grouped-min", "3", "--knockout", "--schedules", *schedules,
                     "--rounds", "2", "--batch", "2", "--warmup", "1", "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "world 4 (loopback" in done.stdout
    data = json.loads(out.read_text())
    assert data["loopback"] is True and data["world_size"] == 4
    assert data["moe"] == {"experts": 8, "top_k": 8, "tokens": 16, "grouped_min_gemms": 3}
    rows = {(r["op"], r["schedule"]): r for r in data["results"]}
    assert set(rows) == {(op, s) for op in ops for s in schedules}
    assert all(r["host_us_per_call"] > 0 for r in rows.values())
    # the knockouts time the dense ops only (a no-op grouped GEMM returns nothing the MoE ops could use)
    knocked = {case for case, r in rows.items() if "knockout_us" in r}
    assert knocked == {(op, s) for op in ("ag_gemm", "gemm_rs") for s in schedules}
    assert set(rows["ag_gemm", "serial/sm"]["knockout_us"]) == set(executor_overhead.KNOCKOUTS)


def test_knockout_needs_the_loopback_world():
    done = _overhead("--device", "cpu", "--knockout", "--out", "unused.json")
    assert done.returncode == 2
    assert "--knockout needs --loopback" in done.stderr


def test_loopback_places_its_one_process_and_records_its_address_space_layout(tmp_path):
    out = tmp_path / "pinned.json"
    done = _overhead("--device", "cpu", "--loopback", "--pin", "share", "--schedules", "serial/sm",
                     "--rounds", "2", "--batch", "2", "--warmup", "1", "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "placement share: every thread on CPUs" in done.stdout
    data = json.loads(out.read_text())
    assert data["pin"] == "share" and data["address_space"] in {"random", "fixed"}
