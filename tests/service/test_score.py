"""POST /v1/score: pairs per layer, schedules, projected savings; bad configs and splits are 422."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ficco.features import roofline_comm_us, roofline_gemm_us
from ficco.features.model_config import load_model_config

CONFIGS = Path(__file__).resolve().parents[2] / "datasets" / "model_configs"


def _config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def test_score_dense_model_gives_four_pairs_per_token_count(client):
    response = client.post(
        "/v1/score", json={"config": _config("Llama-3.1-8B"), "tp": 2, "tokens": [4096, 16384]}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["layers"] == load_model_config(CONFIGS / "Llama-3.1-8B.json").num_hidden_layers
    assert body["serial_time_estimate"] == "roofline"
    assert [entry["tokens"] for entry in body["data"]] == [4096, 16384]
    for entry in body["data"]:
        assert [p["name"] for p in entry["pairs"]] == ["qkv", "attn_out", "mlp_up", "mlp_down"]
        assert all(p["scenario"]["m"] == entry["tokens"] for p in entry["pairs"])
        saved = sum(p["saved_us_per_layer"] or 0.0 for p in entry["pairs"])
        assert entry["saved_us_per_layer"] == pytest.approx(saved)
        assert entry["saved_us_per_step"] == pytest.approx(saved * body["layers"])


def test_score_pair_savings_follow_speedup_and_roofline(client):
    from ficco.features import Scenario, get_hardware

    body = client.post(
        "/v1/score", json={"config": _config("Llama-3.1-8B"), "tp": 2, "tokens": [8192]}
    ).json()
    for pair in body["data"][0]["pairs"]:
        scenario = Scenario(**pair["scenario"], hardware=get_hardware("h200x2"))
        serial = roofline_gemm_us(scenario) + roofline_comm_us(scenario)
        assert pair["serial_us"] == pytest.approx(serial)
        assert pair["predicted_us"] == pytest.approx(serial / pair["predicted_speedup"])
        assert pair["saved_us_per_layer"] == pytest.approx(
            (serial - pair["predicted_us"]) * pair["per_layer"]
        )
        one = client.post("/v1/recommend", json=pair["scenario"]).json()
        assert pair["schedule"] == one["schedule"]


def test_score_moe_model_has_all_to_all_pairs(client):
    body = client.post(
        "/v1/score", json={"config": _config("Mixtral-8x7B-v0.1"), "tp": 2, "tokens": [4096]}
    ).json()
    pairs = {p["name"]: p["scenario"] for p in body["data"][0]["pairs"]}
    assert set(pairs) == {"qkv", "attn_out", "moe_dispatch", "moe_combine"}
    assert pairs["moe_dispatch"]["op"] == "a2a_gemm" and pairs["moe_dispatch"]["experts"] == 8


def test_score_bad_config_is_422_at_config(client):
    config = _config("Llama-3.1-8B")
    del config["hidden_size"]
    response = client.post("/v1/score", json={"config": config, "tp": 2, "tokens": [4096]})
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["field"] == "config"
    assert "hidden_size" in error["msg"]


def test_score_too_many_layers_is_422(client):
    config = {**_config("Llama-3.1-8B"), "num_hidden_layers": 10**400}
    response = client.post("/v1/score", json={"config": config, "tp": 2, "tokens": [4096]})
    assert response.status_code == 422
    assert response.json()["detail"][0]["field"] == "config.num_hidden_layers"


def test_score_tokens_not_divisible_by_tp_is_422_at_the_token_count(client):
    response = client.post(
        "/v1/score", json={"config": _config("Llama-3.1-8B"), "tp": 2, "tokens": [4096, 4097]}
    )
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert (error["field"], error["input"]) == ("tokens.1", 4097)


def test_score_tp_over_gpu_count_is_422_at_tp(client):
    response = client.post(
        "/v1/score", json={"config": _config("Llama-3.1-8B"), "tp": 4, "tokens": [4096], "hardware": "h200x2"}
    )
    assert response.status_code == 422
    assert {e["field"] for e in response.json()["detail"]} == {"tp"}
    (error,) = response.json()["detail"]
    assert error["allowed"] == "one of [2] on h200x2"  # the hardware's, not the schema's [2, 8]
    assert "pairs served: (h200x2, 2)." in error["msg"] and "`ficco retrain --backend sim" in error["msg"]


def test_score_schema_errors_name_fields(client):
    response = client.post("/v1/score", json={"config": [], "tp": 1, "tokens": []})
    assert response.status_code == 422
    fields = {e["field"]: e for e in response.json()["detail"]}
    assert set(fields) == {"config", "tp", "tokens"}
    assert fields["tokens"]["allowed"] == "a list of 1 to 32 items, each an int in [1, 1048576]"
