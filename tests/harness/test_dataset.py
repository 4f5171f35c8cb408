"""The dataset format: schema validation, loading, labels, hashing and rebuilding scenarios."""

import json
import math
import re

import pandas as pd
import pytest

from ficco.features import Scenario, candidates
from ficco.features.dataset import (
    COLUMNS,
    dataset_hardware,
    dataset_hash,
    load_dataset,
    load_datasets,
    load_noise,
    load_repeats,
    rows_frame,
    scenario_from_row,
    superseded,
    validate_frame,
)
from ficco.harness.backend import Measurement, ScenarioResult
from ficco.harness.dataset import label_table, result_rows
from ficco.harness.sim import SimBackend
from ficco.harness.sweep import run_noise, run_sweep


def _frame(h200, times: dict[str, float | None], scenario=None) -> pd.DataFrame:
    """Rows of one scenario; a time of None is a failed schedule."""
    scenario = scenario or Scenario(hardware=h200)
    measurements = [
        Measurement(schedule=s, median_ms=t, p10_ms=t, p90_ms=t, round_ms=(t,) * 5, in_best_set=True)
        if t is not None
        else Measurement(schedule=s, ok=False, error="RuntimeError: boom")
        for s, t in times.items()
    ]
    result = ScenarioResult(measurements=measurements, baselines={"eager": {"gemm_alone_ms": 1.0}})
    return rows_frame(result_rows("grid", scenario, result, "gpu"))


def test_rows_frame_has_the_schema_and_failed_rows_are_nan(h200):
    df = _frame(h200, {"serial/sm": 2.0, "shard/dma": None})
    assert list(df.columns) == list(COLUMNS)
    validate_frame(df)
    failed = df[df["schedule"] == "shard/dma"].iloc[0]
    assert not failed["ok"] and math.isnan(failed["median_ms"]) and failed["error"] == "RuntimeError: boom"
    assert math.isnan(df["nccl_comm_ms"].iloc[0]) and df["gemm_alone_ms"].iloc[0] == 1.0


def test_validate_names_missing_columns(h200):
    df = _frame(h200, {"serial/sm": 2.0}).drop(columns=["ok", "p90_ms"])
    with pytest.raises(ValueError, match=r"parts/x is missing column\(s\) \['p90_ms', 'ok'\]"):
        validate_frame(df, "parts/x")


def test_validate_names_columns_of_the_wrong_dtype(h200):
    df = _frame(h200, {"serial/sm": 2.0})
    df["m"] = df["m"].astype(str)
    df["ok"] = df["ok"].astype(int)
    with pytest.raises(ValueError, match=r"wrong dtype: m \(.*expected int\), ok \(int64, expected bool\)"):
        validate_frame(df)


def test_validate_rejects_unknown_backend(h200):
    df = _frame(h200, {"serial/sm": 2.0})
    df["backend"] = "tpu"
    with pytest.raises(ValueError, match=r"unknown backend value\(s\) \['tpu'\]"):
        validate_frame(df)


def test_result_rows_rejects_unknown_backend(h200):
    with pytest.raises(ValueError, match="backend must be one of"):
        result_rows("grid", Scenario(hardware=h200), ScenarioResult(), "tpu")


def test_label_table_never_picks_a_failed_schedule(h200):
    df = _frame(h200, {"serial/sm": 2.0, "shard/sm": 1.5, "shard/dma": None, "finer/dma/s2/chunk": 1.8})
    df.loc[df["schedule"] == "shard/dma", "median_ms"] = 0.1  # even a time on a failed row is ignored
    labels = label_table(df)
    assert len(labels) == 1
    row = labels.iloc[0]
    assert (row["best_schedule"], row["best_ms"], row["serial_ms"], row["n_ok"]) == ("shard/sm", 1.5, 2.0, 3)
    assert row["speedup"] == pytest.approx(2.0 / 1.5)


def test_label_table_breaks_ties_by_canonical_order_and_drops_all_failed(h200):
    tie = _frame(h200, {"serial/sm": 1.0, "serial/dma": 1.0})
    all_failed = _frame(h200, {"serial/sm": None}, Scenario(m=8192, hardware=h200))
    labels = label_table(pd.concat([tie, all_failed], ignore_index=True))
    assert list(labels["best_schedule"]) == ["serial/sm"]
    assert label_table(all_failed).empty


def test_load_dataset_reads_listed_parts_only_and_hashes_content(tmp_path, small_plan, h200):
    out = run_sweep(small_plan, SimBackend(h200), tmp_path / "a", progress=False, flush_seconds=0.0)
    df = load_dataset(out)
    assert len(df) == 2 * sum(len(candidates(s)) for _, s in small_plan)  # eager and graph
    orphan = _frame(h200, {"serial/sm": 9.0}, Scenario(m=2**16, hardware=h200))
    orphan.to_parquet(out / "parts" / "part-99999.parquet")
    assert len(load_dataset(out)) == len(df)
    one_part = run_sweep(small_plan, SimBackend(h200), tmp_path / "b", progress=False, flush_seconds=1e9)
    assert (
        len(list((one_part / "parts").glob("*.parquet"))) == 1 < len(list((out / "parts").glob("*.parquet")))
    )
    assert dataset_hash(out) == dataset_hash(one_part)
    assert dataset_hardware(out) == h200


def test_load_dataset_single_file_is_validated(tmp_path, h200):
    path = tmp_path / "rows.parquet"
    _frame(h200, {"serial/sm": 2.0}).drop(columns=["backend"]).to_parquet(path)
    with pytest.raises(ValueError, match=r"rows\.parquet is missing column\(s\) \['backend'\]"):
        load_dataset(path)


def test_dataset_functions_explain_a_directory_without_manifest(tmp_path):
    with pytest.raises(ValueError, match=r"is not a ficco dataset: it has no manifest\.json"):
        dataset_hardware(tmp_path)


def test_scenario_from_row_accepts_series_dicts_and_tuples(h200):
    s = Scenario(
        op="gemm_a2a", m=512, n=1024, k=768, dtype="fp16", experts=8, top_k=2, imbalance=1.5, hardware=h200
    )
    df = rows_frame(result_rows("x", s, ScenarioResult(measurements=[Measurement()]), "sim"))
    for row in (df.iloc[0], df.iloc[0].to_dict(), next(df.itertuples())):
        assert scenario_from_row(row, h200) == s


@pytest.fixture
def two_datasets(tmp_path, small_plan, h200):
    """The small plan's first half (3 scenarios re-measured) and second half, as two dataset directories."""
    half = len(small_plan) // 2
    first = run_sweep(small_plan[:half], SimBackend(h200), tmp_path / "a", progress=False)
    run_noise(small_plan[:half], SimBackend(h200, seed=1), first, 3, progress=False)
    return first, run_sweep(small_plan[half:], SimBackend(h200), tmp_path / "b", progress=False)


def test_load_datasets_concatenates_rows_and_remeasures(two_datasets):
    a, b = two_datasets
    df, noise = load_datasets([a, b])
    assert df.equals(pd.concat([load_dataset(a), load_dataset(b)], ignore_index=True))
    assert noise.equals(load_noise(a))  # b has no re-measure
    alone, alone_noise = load_datasets([a])
    assert alone.equals(load_dataset(a)) and alone_noise.equals(load_noise(a))
    assert load_datasets([b])[1] is None


def test_load_datasets_names_the_differing_hardware_key(two_datasets):
    a, b = two_datasets
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["fingerprint"]["world_size"] = 4
    (b / "manifest.json").write_text(json.dumps(manifest))
    expected = f"fingerprint.world_size 2 in {a} vs 4 in {b}"
    with pytest.raises(ValueError, match=re.escape(expected)):
        load_datasets([a, b])


def test_load_datasets_refuses_shared_scenarios(two_datasets):
    a, _ = two_datasets
    with pytest.raises(ValueError, match=re.escape(f"{a} and {a} share 6 scenario id(s), e.g. ['")):
        load_datasets([a, a])


def _mark_superseded(directory, schedules: dict[str, str]) -> None:
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["superseded"] = schedules
    (directory / "manifest.json").write_text(json.dumps(manifest))


def test_superseded_schedules_stay_out_of_training_rows(two_datasets):
    a, b = two_datasets
    _mark_superseded(a, {"shard/sm": "trial executor"})
    assert superseded(a) == {"shard/sm": "trial executor"} and superseded(b) == {}
    df, noise = load_datasets([a, b])
    assert "shard/sm" not in set(df.loc[df["scenario_id"].isin(load_dataset(a)["scenario_id"]), "schedule"])
    assert "shard/sm" in set(df["schedule"])  # b's rows keep it
    assert "shard/sm" not in set(noise["schedule"])
    assert "shard/sm" in set(load_dataset(a)["schedule"])  # the raw rows are all still there


def test_load_repeats_reads_sweeps_of_known_scenarios_only(tmp_path, two_datasets, small_plan, h200):
    a, b = two_datasets
    half = len(small_plan) // 2
    again = run_sweep(small_plan[:half], SimBackend(h200, seed=7), tmp_path / "again", progress=False)
    _mark_superseded(again, {"shard/dma": "replaced"})
    rows = load_dataset(a)
    (repeat,) = load_repeats(rows, [again], like=a)
    assert set(repeat["scenario_id"]) == set(rows["scenario_id"])
    assert "shard/dma" not in set(repeat["schedule"])
    with pytest.raises(ValueError, match=re.escape(f"repeat {b} holds 6 scenario id(s) the datasets do not")):
        load_repeats(rows, [b], like=a)
