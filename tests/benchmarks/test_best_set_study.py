"""The best-set study on a small simulated dataset and its re-measure: every level scored per mode, and
a lower bootstrap level never narrows the sets or loses coverage."""

from __future__ import annotations

import json

import pytest

from benchmarks.studies import best_set_study


def test_lower_levels_give_wider_sets_and_never_less_coverage(sim_moe_dataset, tmp_path):
    out = tmp_path / "study.json"
    results = best_set_study.main([str(sim_moe_dataset), "--alphas", "0.01,0.2,0.5", "--out", str(out)])
    (name,) = results
    assert name == f"{sim_moe_dataset} vs its re-measure"
    for mode in ("eager", "graph"):
        levels = results[name][mode]
        assert [r["alpha"] for r in levels] == [0.01, 0.2, 0.5]
        assert all(r["scenarios"] == 4 for r in levels)
        sizes = [r["best_set_median"] for r in levels]
        coverage = [r["coverage"] for r in levels]
        assert sizes == sorted(sizes, reverse=True) and coverage == sorted(coverage, reverse=True), mode
    assert json.loads(out.read_text())["runs"] == results
    assert "| runs | mode | alpha |" in out.with_suffix(".md").read_text()


def test_a_dataset_without_a_re_measure_needs_a_second_run(sim_dataset):
    with pytest.raises(SystemExit, match=r"has no noise\.parquet"):
        best_set_study.main([str(sim_dataset)])
