"""``ficco retrain --budget-minutes`` on the simulator, as CI runs it: the order of what the sweep teaches, a
clean stop at the budget, checkpoints, and a second run that continues."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ficco.cli import app
from ficco.features.dataset import read_manifest
from ficco.training.predict.registry import current_version, list_models
from ficco.training.retrain import CHECKPOINT_DIR, ORDER_FILE, checkpoint_marks

runner = CliRunner()


def _spent(out) -> tuple[list[str], dict[str, float], float]:
    """(the order, scenario -> estimated device seconds, estimated seconds of the finished scenarios)."""
    order = json.loads((out / ORDER_FILE).read_text())
    estimates = dict(zip(order["order"], order["estimated_seconds"], strict=True))
    finished = read_manifest(out)["finished"]
    return order["order"], estimates, sum(estimates[k] for k in finished)


def _is_prefix(out) -> list[str]:
    order, _, _ = _spent(out)
    finished = read_manifest(out)["finished"]
    assert finished == order[: len(finished)]  # measured in the order, nothing skipped
    return finished


@pytest.fixture(scope="module")
def budgeted(tmp_path_factory, sim_dataset):
    root = tmp_path_factory.mktemp("budget")
    args = ["retrain", "--backend", "sim", "--hardware", "h200x4", "--grid", "24", "--tokens", "2048,8192",
            "--registry", str(root / "models"), "--out", str(root / "ds"), "--prior", str(sim_dataset),
            "--checkpoint-minutes", "0.1"]  # fmt: skip
    first = runner.invoke(app, [*args, "--budget-minutes", "0.3"])
    return root, args, first


def test_it_stops_at_the_budget_having_measured_a_prefix_of_the_order(budgeted):
    root, _, first = budgeted
    assert first.exit_code == 0, first.output
    out = root / "ds"
    order, estimates, spent = _spent(out)
    finished = _is_prefix(out)
    assert 0 < len(finished) < len(order) and spent <= 0.3 * 60
    assert spent + estimates[order[len(finished)]] > 0.3 * 60  # the next one would not have fit
    assert "prior: measured elsewhere, simulated here, simulated here, corrected" in first.output


def test_it_checkpoints_as_it_goes_and_registers_the_last(budgeted):
    root, _, first = budgeted
    checkpoints = list_models(root / "ds" / CHECKPOINT_DIR)["h200x4-sim"]
    assert len(checkpoints) == len(checkpoint_marks(0.1, 0.3)) == 3  # 6 s, 12 s and the budget
    assert first.output.count("checkpoint ") == 3
    version = current_version(root / "models", "h200x4-sim")
    card = next(c for c in list_models(root / "models")["h200x4-sim"] if c["version"] == version)
    assert card["prior"]["prior"]["sources"][0]["backend"] == "measured"
    assert card["model_backend"] == "simulated" and card["device_minutes"] <= 0.3
    assert set(card["prior"]["choice"]) == {"eager", "graph"}
    assert "(simulated model): promoted to current" in first.output


@pytest.mark.heavy
def test_the_same_command_continues_and_a_spent_budget_measures_nothing(budgeted):
    root, args, _ = budgeted
    out = root / "ds"
    before = _is_prefix(out)
    more = runner.invoke(app, [*args, "--budget-minutes", "0.6"])
    assert more.exit_code == 0, more.output
    assert "prior: read from" in more.output
    assert "current model's" in more.output  # the registered model of merged trees loaded and answered
    after = _is_prefix(out)
    assert len(after) > len(before) and after[: len(before)] == before
    assert _spent(out)[2] <= 0.6 * 60
    again = runner.invoke(app, [*args, "--budget-minutes", "0.6"])
    assert again.exit_code == 0, again.output
    assert _is_prefix(out) == after and "checkpoint " not in again.output


@pytest.mark.heavy
def test_order_only_writes_the_order_and_measures_nothing(tmp_path, sim_dataset):
    out = tmp_path / "ds"
    args = ["retrain", "--backend", "sim", "--hardware", "h200x4", "--grid", "8", "--tokens", "2048",
            "--registry", str(tmp_path / "models"), "--out", str(out), "--prior", str(sim_dataset),
            "--budget-minutes", "1", "--order-only"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    order = json.loads((out / ORDER_FILE).read_text())
    assert len(order["order"]) == len(set(order["order"])) > 0 and order["prior"]["hardware_id"] == "h200x4"
    assert read_manifest(out) is None and not (tmp_path / "models").exists()


def test_budget_options_are_checked(tmp_path):
    both = runner.invoke(app, ["retrain", "--backend", "sim", "--budget", "4", "--budget-minutes", "1",
                               "--out", str(tmp_path / "ds"), "--registry", str(tmp_path / "m")])  # fmt: skip
    assert both.exit_code == 2 and "not both" in both.output
    assert checkpoint_marks(1.0, 5.0) == [60.0, 120.0, 240.0, 300.0]
    assert checkpoint_marks(0.0, 2.0) == [120.0]
