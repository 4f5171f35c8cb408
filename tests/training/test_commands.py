"""`ficco evaluate`, `ficco train` and `ficco report` on a small simulated dataset."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ficco.cli import app
from ficco.training.predict.registry import current_version, load_predictor

runner = CliRunner()


@pytest.fixture(scope="module")
def evaluate_json(sim_dataset, sim_moe_dataset):
    args = ["evaluate", "--dataset", str(sim_dataset), "--transfer", str(sim_moe_dataset), "--json"]
    result = runner.invoke(app, args)
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


def test_evaluate_json_says_what_the_transfer_split_scored(evaluate_json, sim_moe_dataset):
    assert evaluate_json["transfer_dataset"]["path"] == str(sim_moe_dataset)
    split = evaluate_json["transfer_split"]
    assert split["n_dropped_shared_with_training"] == 0  # the MoE dataset shares no scenario
    assert split["n_scenarios"] == evaluate_json["transfer_dataset"]["n_scenarios"]
    assert split["n_noise_scenarios"] == 4
    for mode in ("eager", "graph"):
        assert evaluate_json["modes"][mode]["transfer"]["ceiling"]["n_scenarios"] == 4


@pytest.mark.heavy
def test_train_promote_registers_the_evaluated_model(sim_dataset, evaluate_json, tmp_path):
    result = runner.invoke(
        app, ["train", "--dataset", str(sim_dataset), "--model-root", str(tmp_path), "--promote"]
    )
    assert result.exit_code == 0, result.output
    # simulated rows: registered apart as h200x2-sim, the measured id untouched
    version = current_version(tmp_path, "h200x2-sim")
    assert version is not None and f"promoted h200x2-sim/{version}" in result.output
    assert "(simulated model)" in result.output and current_version(tmp_path, "h200x2") is None
    card = load_predictor(tmp_path, "h200x2-sim").card
    assert card["model_backend"] == "simulated" and card["dataset"]["backends"] == ["sim"]
    # same dataset + seed: the same held-out metrics (training has no transfer split)
    held_out = {m: {k: v for k, v in r.items() if k != "transfer"} for m, r in evaluate_json["modes"].items()}
    assert card["metrics"]["modes"] == held_out
    assert card["ops"] == ["ag_gemm", "gemm_rs"] and card["modes"] == ["eager", "graph"]
    assert card["dataset"]["hash"] == evaluate_json["dataset"]["hash"]
    assert version.endswith(evaluate_json["dataset"]["hash"][:8])
    # what the data lacks (here only the noise re-measure): in the card and printed
    (gaps,) = card["gaps"]
    assert gaps["dataset"] == str(sim_dataset) and gaps["measured"] == gaps["planned"] > 0
    assert gaps["to_remeasure"]["scenarios"] == 64 and "no noise re-measure" in result.output


def test_evaluate_json_of_one_dataset_has_no_op_groups(evaluate_json):
    assert all("family_holdout_by_op_group" not in m for m in evaluate_json["modes"].values())


@pytest.fixture(scope="module")
def dense_and_moe(sim_dataset, sim_moe_dataset):
    return ["--dataset", str(sim_dataset), "--dataset", str(sim_moe_dataset)]


@pytest.mark.heavy
def test_evaluate_two_datasets_reports_dense_and_moe_apart(dense_and_moe, sim_dataset, sim_moe_dataset):
    result = runner.invoke(app, ["evaluate", *dense_and_moe, "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["dataset"]["path"] == f"{sim_dataset} + {sim_moe_dataset}"
    for mode in ("eager", "graph"):
        result = summary["modes"][mode]
        groups = result["family_holdout_by_op_group"]
        assert set(groups) == {"dense", "moe"}
        assert groups["moe"]["always_async_tp"] is None  # PyTorch async-TP has no all-to-all: n/a
        assert groups["moe"]["ceiling"]["n_scenarios"] > 0  # the MoE re-measure scores its own ceiling
        sizes = [groups[g]["model"]["n_scenarios"] for g in ("dense", "moe")]
        assert sum(sizes) == result["family_holdout"]["model"]["n_scenarios"] and min(sizes) > 0
        assert {"Mixtral-8x7B-v0.1", "Qwen3-30B-A3B", "Llama-3.1-8B"} <= set(result["per_family"])


@pytest.mark.heavy
def test_train_two_datasets_serves_the_moe_ops(dense_and_moe, tmp_path):
    result = runner.invoke(app, ["train", *dense_and_moe, "--model-root", str(tmp_path), "--promote"])
    assert result.exit_code == 0, result.output
    assert "family holdout, moe ops only" in result.output and " n/a " in result.output
    assert load_predictor(tmp_path, "h200x2-sim").card["ops"] == [
        "a2a_gemm",
        "ag_gemm",
        "gemm_a2a",
        "gemm_rs",
    ]
    moe = ["--op", "a2a_gemm", "--m", "4096", "--n", "2048", "--k", "4096", "--experts", "8", "--top-k", "2"]
    moe += ["--hardware", "h200x2-sim"]
    answer = runner.invoke(app, ["recommend", *moe, "--format", "json", "--model-root", str(tmp_path)])
    assert answer.exit_code == 0, answer.output
    assert json.loads(answer.stdout)["schedule"] and json.loads(answer.stdout)["model_backend"] == "simulated"


def test_evaluate_refuses_datasets_of_other_hardware(sim_dataset, tmp_path):
    other = Path(shutil.copytree(sim_dataset, tmp_path / "other"))
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["hardware"]["gpu_count"] = 4
    (other / "manifest.json").write_text(json.dumps(manifest))
    result = runner.invoke(app, ["evaluate", "--dataset", str(sim_dataset), "--dataset", str(other)])
    assert result.exit_code == 2
    assert f"hardware.gpu_count 2 in {sim_dataset} vs 4 in {other}" in result.output


@pytest.mark.heavy
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
    result = runner.invoke(app, [*args, "--model-root", str(tmp_path / "empty")])
    assert result.exit_code == 2
    assert "no model for hardware 'h200x2'" in result.output


@pytest.mark.heavy
def test_train_with_a_repeat_sweep_records_it_and_refuses_new_scenarios(
    sim_dataset, sim_moe_dataset, tmp_path
):
    root = tmp_path / "models"
    args = ["train", "--dataset", str(sim_dataset), "--model-root", str(root)]
    result = runner.invoke(app, [*args, "--repeat", str(sim_dataset)])  # the same sweep twice pools to itself
    assert result.exit_code == 0, result.output
    (card_path,) = root.rglob("card.json")
    card = json.loads(card_path.read_text())
    assert card["dataset"]["repeats"] == [str(sim_dataset)]
    bad = runner.invoke(app, [*args, "--repeat", str(sim_moe_dataset)])
    assert bad.exit_code == 2
    assert f"--repeat {sim_moe_dataset}" in bad.output and "the datasets do not" in bad.output


def test_evaluate_refuses_to_rescore_against_a_sweep_it_trains_on(sim_dataset):
    result = runner.invoke(app, ["evaluate", "--dataset", str(sim_dataset), "--rescore", str(sim_dataset)])
    assert result.exit_code != 0
    assert "--rescore" in result.output and "trained the model" in result.output
