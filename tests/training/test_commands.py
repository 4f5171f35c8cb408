"""`ficco evaluate`, `ficco train` and `ficco report` on a small simulated dataset."""

from __future__ import annotations

import json

import pytest
from ficco.training.registry import current_version, load_predictor
from typer.testing import CliRunner

from ficco.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def evaluate_json(sim_dataset):
    result = runner.invoke(app, ["evaluate", "--dataset", str(sim_dataset), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_evaluate_json_prints_one_object_with_the_metrics(evaluate_json):
    for key in ("top1", "within_2pct", "geomean_regret", "p95_regret", "max_regret", "captured_speedup",
                "n_scenarios", "baselines", "never_worse_than_serial", "families_worse_than_serial",
                "fallback", "per_family", "region_holdout"):  # fmt: skip
        assert key in evaluate_json
    assert evaluate_json["dataset"]["hardware_id"] == "h200x2"
    assert {"Llama-3.1-8B", "Qwen2.5-7B", "grid"} <= set(evaluate_json["per_family"])


def test_train_promote_registers_the_evaluated_model(sim_dataset, evaluate_json, tmp_path):
    result = runner.invoke(
        app, ["train", "--dataset", str(sim_dataset), "--registry", str(tmp_path), "--promote"]
    )
    assert result.exit_code == 0, result.output
    version = current_version(tmp_path, "h200x2")
    assert version is not None and f"promoted h200x2/{version}" in result.output
    card = load_predictor(tmp_path, "h200x2").card
    assert card["metrics"]["top1"] == evaluate_json["top1"]  # same dataset + seed: same held-out metrics
    assert card["dataset"]["hash"] == evaluate_json["dataset"]["hash"]
    assert version.endswith(evaluate_json["dataset"]["hash"][:8])


def test_report_writes_markdown_and_plots(sim_dataset, tmp_path):
    out = tmp_path / "report"
    result = runner.invoke(app, ["report", "--dataset", str(sim_dataset), "--out", str(out)])
    assert result.exit_code == 0, result.output
    names = {p.name for p in out.iterdir()}
    assert {"report.md", "confusion.png", "regret_cdf.png", "map-ag_gemm.png", "map-gemm_rs.png"} <= names
    text = (out / "report.md").read_text()
    assert "![confusion](confusion.png)" in text and "## Safe fallback" in text
    assert all((out / n).stat().st_size > 1000 for n in names if n.endswith(".png"))


def test_evaluate_without_a_dataset_fails_clearly(tmp_path):
    result = runner.invoke(app, ["evaluate", "--dataset", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "is not a ficco dataset" in result.output


def test_report_with_a_missing_model_fails_clearly(sim_dataset, tmp_path):
    args = ["report", "--dataset", str(sim_dataset), "--out", str(tmp_path), "--model", "current"]
    result = runner.invoke(app, [*args, "--registry", str(tmp_path / "empty")])
    assert result.exit_code == 2
    assert "no model for hardware 'h200x2'" in result.output
