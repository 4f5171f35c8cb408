"""A model measured at 4 GPUs beside the 2-GPU one: `/v1/recommend` with world_size 4, `/v1/tables` at tp 4,
`ficco score --tp 4` and `ficco export --tp 4` answer from it (the stand-in registry of what `ficco train
--dataset datasets/h200x4 --promote` registers once the 4-GPU sweep is measured)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ficco.cli import app
from ficco.features import Scenario, candidates, get_hardware
from ficco.training.predict.registry import current_version

FOUR = "h200x4"


@pytest.fixture(scope="module")
def four_root(tmp_path_factory, train) -> Path:
    """A registry with the 2-GPU model and a 4-GPU one trained at world size 4, both promoted."""
    root = tmp_path_factory.mktemp("models-w4")
    train(root, "h200x2", seed=0)
    train(root, FOUR, seed=2, world_size=4)
    return root


@pytest.fixture(scope="module")
def four_client(four_root, start):
    with start(four_root) as client:
        yield client


def test_recommend_at_world_size_four_answers_from_the_four_gpu_model(four_client, four_root):
    body = {"op": "ag_gemm", "m": 8192, "n": 4096, "k": 8192, "world_size": 4}
    direct = four_client.post("/v1/recommend", json={**body, "hardware": FOUR})
    assert direct.status_code == 200, direct.text
    answer = direct.json()
    assert answer["hardware_id"] == FOUR and answer["model_version"] == current_version(four_root, FOUR)
    valid = {str(s) for s in candidates(Scenario(**body, hardware=get_hardware(FOUR)))}
    assert answer["schedule"] in valid
    # asked for the 2-GPU machine at 4 ranks: the measured model of the same GPU at 4 ranks answers, saying so
    moved = four_client.post("/v1/recommend", json={**body, "hardware": "h200x2"})
    assert moved.status_code == 200, moved.text
    assert moved.json()["hardware_id"] == FOUR and moved.json()["requested_hardware"] == "h200x2"
    assert moved.json()["hardware_substitution"]
    two = four_client.post("/v1/recommend", json={**body, "world_size": 2})  # 2 ranks: still the 2-GPU model
    assert two.status_code == 200 and two.json()["hardware_id"] == "h200x2"


def test_tables_at_tp_four_come_from_the_four_gpu_model(four_client):
    body = {
        "tp": 4,
        "mode": "graph",
        "shapes": ["ag_gemm:4096:8192", "gemm_rs:8192:4096"],
        "allow_simulated": True,
    }
    response = four_client.post(f"/v1/tables/{FOUR}", json=body)
    assert response.status_code == 200, response.text
    table = response.json()
    assert table["world_size"] == 4 and table["hardware_id"] == FOUR
    assert {(e["op"], e["n"], e["k"]) for e in table["entries"]} == {
        ("ag_gemm", 4096, 8192),
        ("gemm_rs", 8192, 4096),
    }
    assert table["model"]["hardware_id"] == FOUR


def test_score_and_export_at_tp_four(four_root, tmp_path):
    config = Path(__file__).resolve().parents[2] / "datasets" / "model_configs" / "Llama-3.1-70B.json"
    runner = CliRunner()
    scored = runner.invoke(
        app,
        [
            "score",
            "--tp",
            "4",
            "--tokens",
            "4096",
            "--model-root",
            str(four_root),
            "--format",
            "json",
            str(config),
        ],
    )
    assert scored.exit_code == 0, scored.output
    answer = json.loads(scored.output)
    assert answer["hardware_id"] == FOUR and answer["tp"] == 4, answer
    exported = runner.invoke(
        app,
        ["export", "--hardware", FOUR, "--tp", "4", "--shape", "ag_gemm:4096:8192", "--mode", "graph",
         "--model-root", str(four_root), "--out", str(tmp_path), "--allow-simulated"],
    )  # fmt: skip
    assert exported.exit_code == 0, exported.output
    (written,) = tmp_path.glob("op=tp_overlap,*tp=4,mode=graph,dtype=bf16.json")
    assert json.loads(written.read_text())["world_size"] == 4
