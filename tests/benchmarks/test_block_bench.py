"""The end-to-end block benchmark's CPU smoke mode (gloo, a tiny block): every variant runs, matches the
serial reference, and the JSON, markdown and plot are written in the documented shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from executor_world import run_world

from benchmarks import block_bench as bench

pytestmark = pytest.mark.heavy


def _smoke(rank: int, world_size: int, out: str) -> dict:
    argv = [
        "--cpu-smoke",
        "--out",
        out,
        "--warmup",
        "1",
        "--rounds",
        "2",
        "--reps",
        "2",
        "--oracle-reps",
        "1",
    ]
    return bench.main(argv)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("block")
    results = run_world(2, _smoke, str(out))
    return results[0], out


@pytest.mark.slow
def test_every_point_has_every_variant(smoke):
    result, _ = smoke
    points = {(p["phase"], p["tokens"]) for p in result["points"]}
    assert points == {("train", 32), ("train", 64), ("train_graph", 32), ("inference", 16), ("inference", 32)}
    for p in result["points"]:
        assert set(p["step_ms"]) == set(bench.VARIANTS)
        assert p["step_ms"]["async_tp"] is None  # PyTorch's symmetric-memory ops need GPUs
        assert all(p["step_ms"][v] > 0 for v in ("serial", "shard_dma", "planner", "verified", "oracle"))
        assert set(p["host_ms"]) == set(p["step_ms"]) - {"async_tp"} | set(p["extra_ms"])
        assert all(p["host_ms"][v] > 0 for v in p["host_ms"])
        assert 0.0 <= p["comm_share"] <= 1.0
        assert p["errors"] == {}
        expected = {"shard_dma", "planner", "verified", "oracle"}
        expected |= {"planner_regather"} if p["phase"] == "train" else set()
        assert set(p["rel_err"]) == expected
        assert all(e <= bench.TOLERANCE["fp32"] for e in p["rel_err"].values()), p["rel_err"]
        assert set(p["verify"]) == {"times_ms", "confirm_ms", "winner", "pinned"}  # verify_plan's verdict
    assert result["skipped"] == []
    assert result["summary"]["rel_err_ok"]
    assert set(result["summary"]["goals"]) == {"planner", "verified"}
    assert "vs_serial_comm_heavy_train_graph" in result["summary"]["goals"]["planner"]


@pytest.mark.slow
def test_decisions_cover_every_layer_and_the_oracle_says_where_it_came_from(smoke):
    result, _ = smoke
    train = result["decisions"]["tiny/train/planner"]
    layers = {"attn.qkv", "attn.out", "mlp.gate_up", "mlp.down"}
    assert {(r["layer"], r["direction"]) for r in train} == {
        (layer, d) for layer in layers for d in ("fwd", "bwd-input", "bwd-weight")
    }
    graphed = result["decisions"]["tiny/train_graph/planner"]  # the same ops, asked for in graph mode
    assert {(r["layer"], r["direction"]) for r in graphed} == {(r["layer"], r["direction"]) for r in train}
    oracle = [r for r in result["decisions"]["tiny/inference/oracle"] if r["direction"] != "bwd-weight"]
    assert {r["origin"] for r in oracle} <= {"dataset", "measured"}
    meta = result["meta"]
    smoke_tokens = {name: phase.smoke_tokens for name, phase in bench.PHASES.items()}
    needed = bench.needed_keys({"tiny": bench.CPU_SMOKE}, smoke_tokens, 16)
    assert meta["oracle_measured_ops"] + meta["oracle_dataset_ops"] == len(needed)
    assert meta["pin"] == "share"  # each rank's threads on its share of the CPUs, as ficco bench places them


@pytest.mark.slow
def test_outputs_are_written(smoke):
    result, out = smoke
    on_disk = json.loads((out / "block-smoke.json").read_text())
    assert on_disk["points"] == result["points"]
    table = (out / "block-smoke.md").read_text()
    assert "| model | phase | tokens | comm share | serial | async-TP |" in table
    assert table.count("| tiny |") == 5
    pytest.importorskip("matplotlib")
    assert (out / "block-smoke.png").stat().st_size > 1000
