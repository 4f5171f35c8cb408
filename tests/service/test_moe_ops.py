"""Ops the served model has no measured data for get a clear 422 and are never scored (issue 15 item 3)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from typer.testing import CliRunner

from ficco.cli import app
from ficco.features import OPS
from ficco.service.core.store import trained_ops

CONFIGS = Path(__file__).resolve().parents[2] / "datasets" / "model_configs"
MOE = {"op": "a2a_gemm", "m": 4096, "n": 2048, "k": 4096, "experts": 8, "top_k": 2}


def test_trained_ops_come_from_the_card_else_the_dense_pair():
    assert trained_ops(SimpleNamespace(card={})) == ("ag_gemm", "gemm_rs")
    assert trained_ops(SimpleNamespace(card={"ops": ["ag_gemm", "a2a_gemm"]})) == ("ag_gemm", "a2a_gemm")


def test_recommend_unmeasured_op_is_422_naming_the_measured_ops(client):
    response = client.post("/v1/recommend", json=MOE)
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["field"] == "op"
    assert (
        error["msg"] == "no measured data for op 'a2a_gemm' on h200x2; measured ops: ['ag_gemm', 'gemm_rs']"
    )


def test_batch_names_each_unmeasured_item(client):
    good = {"op": "ag_gemm", "m": 64, "n": 64, "k": 64}
    response = client.post("/v1/recommend/batch", json={"scenarios": [good, MOE, {**MOE, "op": "gemm_a2a"}]})
    assert response.status_code == 200
    data = response.json()["data"]
    assert [item["status"] for item in data] == ["ok", "error", "error"]
    assert [e["field"] for item in data[1:] for e in item["errors"]] == ["scenarios.1.op", "scenarios.2.op"]


def test_score_marks_moe_pairs_not_measured_with_no_savings(client):
    config = json.loads((CONFIGS / "Mixtral-8x7B-v0.1.json").read_text())
    body = client.post("/v1/score", json={"config": config, "tp": 2, "tokens": [4096]}).json()
    pairs = {p["name"]: p for p in body["data"][0]["pairs"]}
    for name in ("moe_dispatch", "moe_combine"):
        assert pairs[name]["measured"] is False
        assert pairs[name]["schedule"] == "not measured"
        assert pairs[name]["saved_us_per_layer"] is None and pairs[name]["predicted_speedup"] is None
    assert pairs["qkv"]["measured"] is True


def test_cli_recommend_unmeasured_op_fails_clearly(registry_root):
    args = ["recommend", "--op", "a2a_gemm", "--m", "4096", "--n", "2048", "--k", "4096", "--experts", "8"]
    result = CliRunner().invoke(app, [*args, "--top-k", "2", "--model-root", str(registry_root)])
    assert result.exit_code == 2
    assert "no measured data for op 'a2a_gemm'" in result.output


def test_a_model_trained_on_moe_ops_answers_them(tmp_path, train, start):
    version = train(tmp_path, "h200x2", ops=OPS)
    with start(tmp_path) as client:
        response = client.post("/v1/recommend", json=MOE)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["model_version"] == version and body["schedule"] in body["predicted_speedups"]
        assert client.post("/v1/recommend", json={**MOE, "op": "gemm_a2a"}).status_code == 200
