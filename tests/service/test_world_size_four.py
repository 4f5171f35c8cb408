"""TP=4 from measurement: the shipped h200x4 model (``ficco train --dataset datasets/h200x4 --promote``)
answers world size 4 in every interface a TP=2 answer comes from (ficco recommend, score and export,
/v1/recommend, /v1/score, /v1/score/batch, /v1/tables), says where it has no measured neighbour, and
world size 8 keeps its refusal naming what is served. The registry is the checkout's (the shipped one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ficco.cli import app
from ficco.features import Scenario, candidates, get_hardware
from ficco.training.predict.registry import current_version

CHECKOUT = Path(__file__).resolve().parents[2]
SHIPPED = CHECKOUT / "models"
CONFIGS = CHECKOUT / "datasets" / "model_configs"
MIXTRAL = CONFIGS / "Mixtral-8x7B-v0.1.json"
FOUR = "h200x4"
ON_MAP = {"op": "ag_gemm", "m": 8192, "n": 4096, "k": 8192}
OFF_MAP = {"op": "ag_gemm", "m": 32768, "n": 1024, "k": 16384}
"""A shape of the log-uniform grid the 4-GPU sweep did not measure: no training row within 2x."""


@pytest.fixture(scope="module")
def version() -> str:
    return current_version(SHIPPED, FOUR)


@pytest.fixture(scope="module")
def four_client(start):
    with start(SHIPPED) as client:
        yield client


def _cli(*args: str):
    done = CliRunner().invoke(app, [*args, "--model-root", str(SHIPPED)])
    assert done.exit_code == 0, done.output
    return done.stdout


def test_recommend_at_world_size_four_answers_from_the_measured_model(four_client, version):
    answer = four_client.post("/v1/recommend", json={**ON_MAP, "hardware": FOUR}).json()  # its 4 GPUs
    assert (answer["hardware_id"], answer["model_version"], answer["world_size"]) == (FOUR, version, 4)
    assert (
        answer["model_backend"] == "measured" and answer["substitution"] is None and answer["neighbours"] > 0
    )
    valid = {str(s) for s in candidates(Scenario(**ON_MAP, world_size=4, hardware=get_hardware(FOUR)))}
    assert answer["schedule"] in valid
    cli = json.loads(_cli("recommend", "--op", "ag_gemm", "--m", "8192", "--n", "4096", "--k", "8192",
                          "--hardware", FOUR, "--format", "json"))  # fmt: skip
    assert cli == answer
    two = four_client.post("/v1/recommend", json=ON_MAP).json()  # the default hardware: 2 GPUs, its model
    assert (two["hardware_id"], two["world_size"]) == ("h200x2", 2)


def test_an_answer_off_the_four_gpu_measured_map_says_so(four_client):
    answer = four_client.post("/v1/recommend", json={**OFF_MAP, "hardware": FOUR, "mode": "graph"}).json()
    assert answer["neighbours"] == 0 and answer["world_size"] == 4
    table = four_client.post(
        f"/v1/tables/{FOUR}", json={"tp": 4, "mode": "graph", "shapes": ["ag_gemm:1024:16384"]}
    ).json()
    (entry,) = table["entries"]
    at = [r for t in entry["tracks"] for r in t["ranges"]]
    assert min(r["neighbours"] for r in at) == 0  # the table marks the same ranges off the map


def test_world_size_eight_is_refused_naming_what_is_served(four_client):
    response = four_client.post("/v1/recommend", json={**ON_MAP, "hardware": "h200x8"})
    (error,) = response.json()["detail"]
    assert response.status_code == 422 and error["field"] == "world_size"
    assert "pairs served: (h200x2, 2), (h200x4, 4)." in error["msg"]
    assert (
        "`ficco retrain --hardware h200x8 --tp 8`" in error["msg"]
        and error["allowed"] == "one of [2, 4] on h200x8"
    )


def test_score_scores_every_op_of_an_moe_config_at_tp_four(four_client, version):
    config = json.loads(MIXTRAL.read_text())
    answer = four_client.post("/v1/score", json={"config": config, "tp": 4, "tokens": [4096, 16384],
                                                "hardware": FOUR}).json()  # fmt: skip
    assert (answer["hardware_id"], answer["model_version"], answer["tp"]) == (FOUR, version, 4)
    pairs = [p for entry in answer["data"] for p in entry["pairs"]]
    assert {p["scenario"]["op"] for p in pairs} == {"ag_gemm", "gemm_rs", "a2a_gemm", "gemm_a2a"}
    assert all(p["measured"] and p["scenario"]["world_size"] == 4 for p in pairs)
    cli = json.loads(_cli("score", str(MIXTRAL), "--tp", "4", "--hardware", FOUR, "--tokens", "4096,16384",
                          "--format", "json"))  # fmt: skip
    assert cli["data"] == answer["data"]


def test_score_batch_of_every_shipped_config_at_tp_four(four_client):
    """Every family's config at TP=4: scored, or refused alone with its reason (a KV head count that does
    not split 4 ways under the Megatron layout)."""
    configs = [{"config": json.loads(p.read_text()), "name": p.stem} for p in sorted(CONFIGS.glob("*.json"))]
    body = {"configs": configs, "tp": 4, "tokens": [4096], "hardware": FOUR}
    answer = four_client.post("/v1/score/batch", json=body).json()
    refused = {item["name"]: item["errors"][0]["msg"] for item in answer["data"] if item["status"] == "error"}
    assert set(refused) == {"Phi-3-medium-4k"} and "num_key_value_heads=10" in refused["Phi-3-medium-4k"]
    scored = [item["result"] for item in answer["data"] if item["status"] == "ok"]
    assert len(scored) == len(configs) - 1 and {r["hardware_id"] for r in scored} == {FOUR}


def test_tables_at_tp_four_come_from_the_four_gpu_model_with_an_etag(four_client, version):
    body = {"mode": "graph", "config": json.loads(MIXTRAL.read_text())}  # tp: h200x4's 4 GPUs
    response = four_client.post(f"/v1/tables/{FOUR}", json=body)
    assert response.status_code == 200, response.text
    table = response.json()
    assert (table["world_size"], table["hardware_id"], table["simulated"]) == (4, FOUR, False)
    assert table["model"]["version"] == version
    assert {e["op"] for e in table["entries"]} == {"ag_gemm", "gemm_rs", "a2a_gemm", "gemm_a2a"}
    again = four_client.post(
        f"/v1/tables/{FOUR}", json=body, headers={"If-None-Match": response.headers["etag"]}
    )
    assert again.status_code == 304


def test_export_at_tp_four(tmp_path, version):
    out = _cli("export", "--hardware", FOUR, "--tp", "4", "--config", str(MIXTRAL), "--mode", "graph",
               "--out", str(tmp_path))  # fmt: skip
    (written,) = tmp_path.glob("op=tp_overlap,*tp=4,mode=graph,dtype=bf16.json")
    assert str(written) in out
    data = json.loads(written.read_text())
    assert data["world_size"] == 4 and data["model"]["version"] == version and not data["simulated"]
