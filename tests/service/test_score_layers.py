"""POST /v1/score counts each pair in the layers it runs in: DeepSeek-V3's dense MLP pairs in its 3 dense
first layers, attention in all 61 (issue 15, config files as downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

HF = Path(__file__).resolve().parents[1] / "features" / "configs"


def test_score_counts_dense_first_layers_once_each(client):
    config = json.loads((HF / "DeepSeek-V3" / "config.json").read_text())
    response = client.post("/v1/score", json={"config": config, "tp": 2, "tokens": [4096]})
    assert response.status_code == 200, response.text
    entry = response.json()["data"][0]
    layers = {p["name"]: p["layers"] for p in entry["pairs"]}
    assert layers["qkv"] == 61 and layers["mlp_up"] == 3 and layers["moe_dispatch"] == 58
    step = sum((p["saved_us_per_layer"] or 0.0) * p["layers"] for p in entry["pairs"])
    assert entry["saved_us_per_step"] == pytest.approx(step)
    assert entry["saved_us_per_step"] > 0


def test_per_layer_figures_are_the_step_over_the_model_layers(client):
    """An MoE model's dense and expert layers run different pairs: no one layer holds them all, so the
    per-layer saving is the step's over the layers, and the fraction is the step's."""
    config = json.loads((HF / "DeepSeek-V3" / "config.json").read_text())
    entry = client.post("/v1/score", json={"config": config, "tp": 2, "tokens": [4096]}).json()["data"][0]
    serial = sum(p["serial_us"] * p["per_layer"] * p["layers"] for p in entry["pairs"])
    assert entry["saved_us_per_layer"] == pytest.approx(entry["saved_us_per_step"] / 61)
    assert entry["serial_us_per_layer"] == pytest.approx(serial / 61)
    assert entry["saved_fraction"] == pytest.approx(entry["saved_us_per_step"] / serial)
    naive = sum(p["saved_us_per_layer"] or 0.0 for p in entry["pairs"])  # dense + expert pairs in one layer
    assert entry["saved_us_per_layer"] != pytest.approx(naive)
