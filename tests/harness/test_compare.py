"""``ficco dataset compare`` (harness/compare.py): neighbour matching, shifts judged against the re-measure's
noise band, the work classes where no neighbours exist, refusals, and the shifts on the committed datasets."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from ficco.cli import app
from ficco.features import get_hardware
from ficco.features.dataset import require_manifest
from ficco.harness.compare import (
    GEMM_ALONE,
    SERIAL_TIME,
    compare,
    family_of,
    match_scenarios,
    render,
)
from ficco.harness.dataset import write_json_atomic, write_parquet_atomic
from ficco.harness.plan import plan_scenarios
from ficco.harness.sim import SimBackend
from ficco.harness.sweep import run_noise, run_sweep

DATASETS = Path(__file__).resolve().parents[2] / "datasets"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """A simulated sweep of 12 grid scenarios with 5% noise per round and 12 of them re-measured."""
    hw = get_hardware("h200x2")
    plan = plan_scenarios([], grid_size=12, hardware=hw, seed=5)
    out = tmp_path_factory.mktemp("compare") / "a"
    run_sweep(plan, SimBackend(hw, seed=0, noise=0.05), out, progress=False)
    return run_noise(plan, SimBackend(hw, seed=1, noise=0.05), out, 12, progress=False)


def scaled_copy(source: Path, target: Path, scale: dict[str, float]) -> Path:
    """A copy of dataset ``source`` at ``target`` whose schedules in ``scale`` take that factor longer
    (every time column, every round), with no re-measure."""
    shutil.copytree(source, target)
    (target / "noise.parquet").unlink(missing_ok=True)
    for part in require_manifest(target)["parts"]:
        path = target / part["file"]
        frame = pd.read_parquet(path)
        factor = frame["schedule"].map(scale).fillna(1.0).to_numpy()
        for column in ("median_ms", "p10_ms", "p90_ms"):
            frame[column] = frame[column] * factor
        frame["round_ms"] = [list(np.asarray(r) * f) for r, f in zip(frame["round_ms"], factor, strict=True)]
        write_parquet_atomic(path, frame)
    return target


def edited_manifest(source: Path, target: Path, edit) -> Path:
    """A copy of dataset ``source`` at ``target`` whose manifest ``edit(manifest)`` changed."""
    shutil.copytree(source, target)
    manifest = require_manifest(target)
    edit(manifest)
    write_json_atomic(target / "manifest.json", manifest)
    return target


def _row(rows: list[dict], **match) -> dict:
    found = [r for r in rows if all(r[k] == v for k, v in match.items())]
    assert len(found) == 1, (match, found)
    return found[0]


def test_a_shift_beyond_noise_is_reported_and_one_within_it_is_not(sweep, tmp_path):
    other = scaled_copy(sweep, tmp_path / "b", {"serial/dma": 1.5, "shard/dma": 1.005})
    result = compare(sweep, other)
    assert result["noise_from"] == ["A"] and result["noise_bands"]
    assert result["matching"] == [
        {"group": "dense", "scenarios_a": 12, "matched": 12, "same_id": 12, "median_distance": 1.0,
         "nearest_spread": 1.0}
    ]  # fmt: skip
    shifts = result["pairs"]["shifts"]
    for mode in ("eager", "graph"):
        dma = _row(shifts, group="dense", mode=mode, family="serial/dma", size="all sizes")
        assert math.exp(dma["shift"]) == pytest.approx(1.5) and dma["beyond"] is True
        shard = _row(shifts, group="dense", mode=mode, family="shard/dma", size="all sizes")
        assert math.exp(shard["shift"]) == pytest.approx(1.005) and shard["beyond"] is False
        untouched = _row(shifts, group="dense", mode=mode, family="finer/dma/hp", size="all sizes")
        assert untouched["shift"] == pytest.approx(0.0) and untouched["beyond"] is False
        assert _row(shifts, mode=mode, family=SERIAL_TIME, size="all sizes")["beyond"] is False
    flagged = {(s["family"]) for s in shifts if s["beyond"]}
    assert flagged == {"serial/dma"}
    text = render(result)
    assert "Largest shifts beyond noise (" in text and "serial/dma" in text.split("Largest shifts")[1]
    assert "shard/dma  " not in text.split("Largest shifts")[1]


def test_a_dataset_against_itself_moves_nothing_and_without_a_re_measure_nothing_is_judged(sweep, tmp_path):
    same = compare(sweep, sweep)
    assert all(s["shift"] == 0 and s["beyond"] in (False, None) for s in same["pairs"]["shifts"])
    assert sum(s["beyond"] is False for s in same["pairs"]["shifts"]) > 40  # judged, from 3 scenarios up
    assert all(p["same"] == 1.0 and p["loss_median"] == 0.0 for p in same["pairs"]["picks"])
    bare = scaled_copy(sweep, tmp_path / "bare", {"serial/dma": 1.5})
    alone = compare(bare, bare)
    assert alone["noise_from"] == [] and all(s["beyond"] is None for s in alone["pairs"]["shifts"])
    assert "neither dataset holds a re-measure" in render(alone)


def _scenarios(*rows: tuple) -> pd.DataFrame:
    """Scenario tables (``harness.compare.scenario_table``'s columns) of (id, op, experts, rows, n, k)."""
    return pd.DataFrame(
        [
            {"scenario_id": sid, "op": op, "world_size": 2, "dtype": "bf16", "experts": experts,
             "imbalance": 1.0, "rows": r, "n": n, "k": k, "group": "g", "size": "s"}
            for sid, op, experts, r, n, k in rows
        ]
    )  # fmt: skip


def test_neighbours_lie_within_the_box_on_every_axis_and_the_same_id_comes_first():
    a = _scenarios(("a1", "ag_gemm", 0, 1024, 4096, 4096), ("a2", "ag_gemm", 0, 256, 512, 512),
                   ("a3", "a2a_gemm", 8, 4096, 2048, 2048))  # fmt: skip
    b = _scenarios(
        ("b-inside", "ag_gemm", 0, 1900, 4096, 4096),  # 1.86x on rows
        ("b-beyond", "ag_gemm", 0, 1024, 8704, 4096),  # 2.125x on n: outside the 2x box
        ("b-op", "gemm_rs", 0, 1024, 4096, 4096),  # another op
        ("a2", "ag_gemm", 0, 256, 512, 512),  # the same scenario
        ("a2-near", "ag_gemm", 0, 256, 512, 520),  # nearer than nothing, but not the same id
        ("b-experts", "a2a_gemm", 16, 4096, 2048, 2048),  # other expert count
    )
    matches = match_scenarios(a, b).set_index("a_id")
    assert matches.loc["a1", "b_id"] == "b-inside" and not matches.loc["a1", "exact"]
    assert matches.loc["a1", "spread"] == pytest.approx(1900 / 1024)
    assert matches.loc["a2", "b_id"] == "a2" and matches.loc["a2", "exact"]
    assert "a3" not in matches.index  # only an expert count of another layer near it
    wide = match_scenarios(a, b.drop(index=0), within=2.2).set_index("a_id")
    assert wide.loc["a1", "b_id"] == "b-beyond"
    assert match_scenarios(a, b.drop(index=[0, 1])).set_index("a_id").index.tolist() == ["a2"]
    with pytest.raises(ValueError, match="within must be a factor >= 1"):
        match_scenarios(a, b, within=0.5)


def test_without_neighbours_the_work_classes_compare_unpaired(sweep, tmp_path):
    """B's scenarios of the other dense op (no neighbour: ops match exactly): the work classes compare."""
    other = scaled_copy(sweep, tmp_path / "b", {"serial/dma": 1.5})
    for part in require_manifest(other)["parts"]:
        frame = pd.read_parquet(other / part["file"])
        frame["op"] = frame["op"].map({"ag_gemm": "gemm_rs", "gemm_rs": "ag_gemm"})
        frame["scenario_id"] = frame["scenario_id"] + "-swapped"
        write_parquet_atomic(other / part["file"], frame)
    result = compare(sweep, other)
    assert result["pairs"]["shifts"] == [] and result["matching"][0]["matched"] == 0
    classes = result["classes"]["shifts"]
    assert classes and {c["size"] for c in classes} <= {"< 10 GFLOP", "10-100 GFLOP", "0.1-1 TFLOP",
                                                         "1-10 TFLOP", ">= 10 TFLOP"}  # fmt: skip
    assert not any(c["family"] in (SERIAL_TIME, GEMM_ALONE) for c in classes)  # times compare in pairs only
    text = render(result)
    assert "No scenario of A has a neighbour within 2x in B" in text and "Work classes, unpaired" in text


def test_other_hardware_and_other_world_sizes_are_refused_with_the_values(sweep, tmp_path):
    def h100(manifest):
        manifest["fingerprint"]["gpu_name"] = "NVIDIA H100"
        manifest["backend"] = manifest["fingerprint"]["backend"] = "gpu"

    measured = edited_manifest(sweep, tmp_path / "measured", lambda m: m.update(backend="gpu"))
    other = edited_manifest(sweep, tmp_path / "h100", h100)
    with pytest.raises(
        ValueError, match=r"fingerprint\.gpu_name None in .* vs 'NVIDIA H100' in .*--other-hardware"
    ):
        compare(measured, other)
    assert compare(measured, other, other_hardware=True)["differences"]

    def four(manifest):
        manifest["fingerprint"]["world_size"] = 4

    wide = edited_manifest(sweep, tmp_path / "w4", four)
    with pytest.raises(
        ValueError, match=r"world size 2 and .* at 4: scenarios compare only at one world size"
    ):
        compare(sweep, wide, other_hardware=True)
    with pytest.raises(ValueError, match="does not exist"):
        compare(sweep, tmp_path / "missing")


def test_family_of_keeps_the_hp_twins_apart():
    assert family_of("finer/dma/s4/chunk/hp") == "finer/dma/hp"
    assert family_of("shard/sm") == "shard/sm" and family_of("serial/dma") == "serial/dma"


@pytest.mark.heavy
def test_the_committed_datasets_show_the_copy_arrangement_and_expert_gemm_shifts(tmp_path):
    """The two executor changes of label version 3 on the committed 2-GPU datasets: eager serial/dma about
    1.5x serial/sm at small GEMM work in datasets/h200x2 and about 1.02x in the coverage sweep; the MoE
    ratios of the 128-expert scenarios, expert GEMMs timed one by one against grouped."""
    out = tmp_path / "dense.json"
    done = CliRunner().invoke(
        app,
        [
            "dataset",
            "compare",
            str(DATASETS / "h200x2"),
            str(DATASETS / "h200x2-coverage"),
            "--out",
            str(out),
        ],
    )
    assert done.exit_code == 0, done.output
    assert "copy_streams 'per_peer' vs '1'" in done.output and "label version 3: " in done.output
    dense = json.loads(out.read_text())
    dma = _row(
        dense["classes"]["shifts"], group="dense", mode="eager", family="serial/dma", size="< 10 GFLOP"
    )
    assert 1.4 < dma["value_a"] < 1.6 and 0.98 < dma["value_b"] < 1.08 and dma["beyond"] is True

    moe_out = tmp_path / "moe.json"
    args = ["dataset", "compare", str(DATASETS / "h200x2-moe"), str(DATASETS / "h200x2-coverage")]
    done = CliRunner().invoke(app, [*args, "--json", "--out", str(moe_out)])
    assert done.exit_code == 0, done.output
    moe = json.loads(done.output)
    assert moe == json.loads(moe_out.read_text())
    assert "expert_gemms 'loop' vs 'grouped from 8'" in moe["differences"]
    shard = _row(moe["classes"]["shifts"], group="moe, 128 experts", mode="graph", family="shard/dma",
                 size="< 10 GFLOP")  # fmt: skip
    assert shard["value_a"] > 1.7 and shard["value_b"] < 1.65 and shard["beyond"] is True
