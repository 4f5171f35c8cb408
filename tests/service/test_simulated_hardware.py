"""The simulated models shipped for machines nobody here has measured (``h200x8-sim``, ``h100x8-sim``):
``ficco recommend``, ``ficco score`` and the service answer at 8 ranks, every answer marked simulated with the
simulator's measured fidelity and its guard; a request for the measured-only id is still refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ficco.cli import app
from ficco.harness.sim import SIM_MODEL_VERSION
from ficco.training.predict.registry import load_predictor

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "models"
CONFIG = REPO / "datasets" / "model_configs" / "Llama-3.1-70B.json"
SCENARIO = ["--op", "ag_gemm", "--m", "16384", "--n", "8192", "--k", "8192", "--world-size", "8"]
runner = CliRunner()


def _fidelity_ok(fidelity: dict) -> None:
    assert fidelity["sim_model"] == SIM_MODEL_VERSION and fidelity["measured_world_sizes"] == [2, 4]
    assert "8 ranks: extrapolated" in fidelity["world_size_note"]
    assert set(fidelity["held_out_regret"]) == {"2", "4"}
    assert all(0 <= v < 0.05 for by_mode in fidelity["held_out_regret"].values() for v in by_mode.values())
    assert set(fidelity["guard_min_gain"]) == {"eager", "graph"}


@pytest.mark.parametrize("hardware", ["h200x8-sim", "h100x8-sim"])
def test_the_cli_answers_simulated_hardware_at_eight_ranks_with_its_fidelity(hardware):
    root = ["--model-root", str(SHIPPED)]
    answer = runner.invoke(app, ["recommend", *SCENARIO, "--hardware", hardware, "--format", "json", *root])
    assert answer.exit_code == 0, answer.output
    body = json.loads(answer.stdout)
    assert (body["model_backend"], body["hardware_id"]) == ("simulated", hardware)
    _fidelity_ok(body["sim_fidelity"])
    card = load_predictor(SHIPPED, hardware).card
    assert body["sim_fidelity"] == card["sim_fidelity"] and card["world_sizes"] == [8]
    for mode, guard in card["sim_fidelity"]["guard_min_gain"].items():  # the guard is in the policy
        assert guard is None or card["policy"][mode]["min_gain"] >= guard
    table = runner.invoke(app, ["recommend", *SCENARIO, "--hardware", hardware, *root]).stdout
    assert f"({hardware}, simulated)" in table
    assert f"fidelity ({SIM_MODEL_VERSION}): the simulator's own picks" in table
    assert "8 ranks: extrapolated" in table
    command = ["score", str(CONFIG), "--tp", "8", "--hardware", hardware, "--tokens", "4096", *root]
    scored = runner.invoke(app, [*command, "--format", "json"])
    assert scored.exit_code == 0, scored.output
    score = json.loads(scored.stdout)
    assert score["model_backend"] == "simulated" and score["sim_fidelity"] == body["sim_fidelity"]
    assert f"fidelity ({SIM_MODEL_VERSION})" in runner.invoke(app, command).stdout


def test_measured_only_hardware_at_eight_ranks_is_still_refused():
    refused = runner.invoke(
        app, ["recommend", *SCENARIO, "--hardware", "h200x8", "--model-root", str(SHIPPED)]
    )
    assert refused.exit_code != 0
    assert "h200x8-sim" in refused.output or "retrain" in refused.output


def test_the_service_answers_simulated_hardware_and_refuses_the_measured_id(start):
    body = {"op": "ag_gemm", "m": 16384, "n": 8192, "k": 8192, "world_size": 8}
    config = json.loads(CONFIG.read_text())
    with start(SHIPPED) as client:
        sim = client.post("/v1/recommend", json={**body, "hardware": "h200x8-sim"})
        assert sim.status_code == 200, sim.text
        assert sim.json()["model_backend"] == "simulated"
        _fidelity_ok(sim.json()["sim_fidelity"])
        score = client.post("/v1/score", json={"config": config, "tp": 8, "tokens": [4096],
                                               "hardware": "h100x8-sim"})  # fmt: skip
        assert score.status_code == 200, score.text
        _fidelity_ok(score.json()["sim_fidelity"])
        measured = client.post("/v1/recommend", json={**body, "hardware": "h200x2"})
        assert measured.status_code == 200 or measured.status_code == 422
        refused = client.post("/v1/recommend", json={**body, "hardware": "h200x8"})
        assert refused.status_code == 422, refused.text
        two = client.post("/v1/recommend", json={**body, "world_size": 2})
        assert two.status_code == 200 and two.json()["sim_fidelity"] is None  # the measured model
