"""The all-to-all latency benchmark's CPU dry run (gloo, tiny sizes): every CPU variant runs and moves the
rows ``all_to_all_single`` moves; the JSON and markdown have the documented shape; the crossover and goal
arithmetic; the ctypes layout of ``cudaMemcpyAttributes``."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import pytest
from executor_world import run_world

from benchmarks import a2a_bench as bench
from benchmarks import variants


def _dry_run(rank: int, world_size: int, out: str, op: str) -> dict:
    return bench.main(["--cpu-dry-run", "--out", out, "--rounds", "5", "--op", op, "--name", f"a2a-{op}"])


@pytest.fixture(scope="module", params=[(2, "a2a_gemm"), (4, "gemm_a2a")], ids=["w2-dispatch", "w4-combine"])
def dry_run(request, tmp_path_factory) -> tuple[int, dict, Path]:
    world_size, op = request.param
    out = tmp_path_factory.mktemp("a2a")
    results = run_world(world_size, _dry_run, str(out), op)
    return world_size, results[0], out / f"a2a-{op}.json"


@pytest.mark.slow
def test_dry_run_times_every_cpu_variant_at_every_size(dry_run):
    world_size, result, _ = dry_run
    assert [r["bytes_per_rank"] for r in result["sizes"]] == [16 << 10, 32 << 10, 64 << 10]
    for row in result["sizes"]:
        assert row["bytes_per_peer"] == row["bytes_per_rank"] // world_size
        for variant in ("nccl", "dma", "dma_per_peer", "dma_current"):
            assert row[f"{variant}_ms"] > 0 and row[f"{variant}_host_ms"] > 0, (variant, row)
        assert set(row["errors"]) == {"dma_batched", "nccl_graph", "dma_graph"}, row["errors"]
        assert all("needs CUDA" in why for why in row["errors"].values())
        assert set(row) >= {f"{v}_ms" for v in bench.VARIANTS}
    assert set(result["crossover"]) == {"dma", "dma_per_peer", "dma_current"}


@pytest.mark.slow
def test_dry_run_writes_the_json_and_the_markdown(dry_run):
    _, result, path = dry_run
    saved = json.loads(path.read_text())
    assert saved["sizes"] == result["sizes"] and saved["meta"]["op"] == result["meta"]["op"]
    markdown = path.with_suffix(".md").read_text()
    assert "| KiB per peer | nccl ms | dma ms |" in markdown and "## Crossover" in markdown
    sizes = ", ".join(f"{r['bytes_per_peer'] >> 10} KiB" for r in saved["sizes"])
    assert f"## Not measured\n\n- `dma_batched` at {sizes} per peer: rank 0: needs CUDA" in markdown


def test_crossover_is_where_the_copy_engines_stay_ahead_and_the_goal_reads_both_sides():
    rows = [
        {"bytes_per_peer": 256 << 10, "nccl_ms": 0.02, "dma_ms": 0.023},
        {"bytes_per_peer": 512 << 10, "nccl_ms": 0.03, "dma_ms": 0.029},
        {"bytes_per_peer": 1 << 20, "nccl_ms": 0.05, "dma_ms": 0.04},
        {"bytes_per_peer": 2 << 20, "nccl_ms": 0.09, "dma_ms": 0.07},
    ]
    assert bench.crossovers(rows) == {"dma": 512 << 10}
    g = bench.goal(rows)
    assert g["met"] and g["worst_at_or_above"] == pytest.approx(0.8)
    assert g["worst_below"] == pytest.approx(1.15)
    rows[0]["dma_ms"] = 0.025  # 1.25x below 1 MiB per peer
    assert not bench.goal(rows)["met"]
    rows[-1]["dma_ms"] = 0.1  # slower at the largest size: no crossover
    assert bench.crossovers(rows) == {"dma": None}
    rows[-1]["nccl_ms"] = None  # not measured there: the crossover reads the sizes where both were
    assert bench.crossovers(rows) == {"dma": 512 << 10}


def test_memcpy_attributes_match_the_cuda_runtime_layout():
    """``cudaMemcpyAttributes``: srcAccessOrder (enum), srcLocHint and dstLocHint (cudaMemLocation: type,
    id), flags (unsigned int): 24 bytes."""
    cls = variants.MemcpyAttributes
    offsets = [getattr(cls, name).offset for name in ("srcAccessOrder", "srcLocHint", "dstLocHint", "flags")]
    assert ctypes.sizeof(cls) == 24 and offsets == [0, 4, 12, 20]
