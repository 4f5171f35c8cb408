"""`ficco evaluate`, `ficco train` and `ficco report` on a small simulated dataset."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ficco.cli import app
from ficco.training.registry import current_version, load_predictor

runner = CliRunner()


@pytest.fixture(scope="module")
def evaluate_json(sim_dataset):
    result = runner.invoke(app, ["evaluate", "--dataset", str(sim_dataset), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_evaluate_json_has_the_issue_layout(evaluate_json):
    pickers = {"model", "always_serial", "always_shard_dma", "best_fixed", "size_heuristic"}
    for mode in ("eager", "graph"):
        family = evaluate_json["modes"][mode]["family_holdout"]
        assert pickers <= set(family)
        for metrics in family.values():
            for key in ("top1", "in_best_set", "geomean_regret", "p95_regret", "max_regret",
                        "n_slower_than_serial_2pct"):  # fmt: skip
                assert key in metrics
        assert {"Llama-3.1-8B", "Qwen2.5-7B", "grid"} <= set(evaluate_json["modes"][mode]["per_family"])
        assert "model" in evaluate_json["modes"][mode]["region_holdout"]
    assert evaluate_json["dataset"]["hardware_id"] == "h200x2"


def test_train_promote_registers_the_evaluated_model(sim_dataset, evaluate_json, tmp_path):
    result = runner.invoke(
        app, ["train", "--dataset", str(sim_dataset), "--registry", str(tmp_path), "--promote"]
    )
    assert result.exit_code == 0, result.output
    version = current_version(tmp_path, "h200x2")
    assert version is not None and f"promoted h200x2/{version}" in result.output
    card = load_predictor(tmp_path, "h200x2").card
    assert card["metrics"]["modes"] == evaluate_json["modes"]  # same dataset + seed: same held-out metrics
    assert card["ops"] == ["ag_gemm", "gemm_rs"] and card["modes"] == ["eager", "graph"]
    assert card["dataset"]["hash"] == evaluate_json["dataset"]["hash"]
    assert version.endswith(evaluate_json["dataset"]["hash"][:8])


def test_report_writes_markdown_and_plots(sim_dataset, tmp_path):
    out = tmp_path / "report"
    result = runner.invoke(app, ["report", "--dataset", str(sim_dataset), "--out", str(out)])
    assert result.exit_code == 0, result.output
    names = {p.name for p in out.iterdir()}
    for mode in ("eager", "graph"):
        assert {f"confusion-{mode}.png", f"regret_cdf-{mode}.png", f"map-ag_gemm-{mode}.png"} <= names
    text = (out / "report.md").read_text()
    assert "![regret CDF eager](regret_cdf-eager.png)" in text and "## graph mode" in text
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
