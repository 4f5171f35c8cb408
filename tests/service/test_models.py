"""GET /v1/models and POST /v1/models/reload: listing, the bearer token, good and bad reloads."""

from __future__ import annotations

import json
import logging

import pytest

from ficco.training.predict.registry import current_version, list_models, promote

HARDWARE = "h200x2"
TOKEN = "test-reload-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _other_version(root) -> str:
    current = current_version(root, HARDWARE)
    return next(card["version"] for card in list_models(root)[HARDWARE] if card["version"] != current)


def test_read_models_lists_versions_current_and_serving(client, registry_root):
    body = client.get("/v1/models").json()
    assert body["count"] == 1
    (hw,) = body["data"]
    current = current_version(registry_root, HARDWARE)
    assert (hw["hardware_id"], hw["current"], hw["serving"]) == (HARDWARE, current, current)
    assert len(hw["versions"]) == 2
    flags = {v["version"]: (v["current"], v["serving"]) for v in hw["versions"]}
    assert flags[current] == (True, True)
    assert all("metrics" in v["card"] for v in hw["versions"])


def test_reload_without_configured_token_is_404(client):
    assert client.post("/v1/models/reload", headers=AUTH).status_code == 404


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Authorization": "Basic abc"}, 401),
        ({"Authorization": "Bearer wrong-token-000000000"}, 403),
    ],
)
def test_reload_bad_token_is_refused(model_root, start, headers, status):
    with start(model_root, RELOAD_TOKEN=TOKEN) as client:
        response = client.post("/v1/models/reload", headers=headers)
    assert response.status_code == status
    if status == 401:
        assert response.headers["www-authenticate"] == "Bearer"


def test_reload_swaps_in_promoted_version(model_root, start):
    new = _other_version(model_root)
    with start(model_root, RELOAD_TOKEN=TOKEN) as client:
        promote(model_root, HARDWARE, new)
        response = client.post("/v1/models/reload", headers=AUTH)
        assert response.status_code == 200
        assert response.json()["outcomes"] == {HARDWARE: f"loaded {new}"}
        assert (
            client.post("/v1/recommend", json={"op": "ag_gemm", "m": 4096, "n": 4096, "k": 4096}).json()[
                "model_version"
            ]
            == new
        )


@pytest.mark.parametrize("how", ["corrupt", "schema"])
def test_reload_bad_model_keeps_previous_and_shows_error(model_root, start, caplog, damage, how, wait_for):
    old, new = current_version(model_root, HARDWARE), _other_version(model_root)
    damage(model_root / HARDWARE / new, how)
    with start(model_root, RELOAD_TOKEN=TOKEN) as client, caplog.at_level(logging.ERROR):
        promote(model_root, HARDWARE, new)
        response = client.post("/v1/models/reload", headers=AUTH)
        assert response.status_code == 200
        assert response.json()["outcomes"][HARDWARE].startswith(f"failed {new}")
        assert wait_for(lambda: client.get("/readyz").status_code == 200)  # the batch worker warmed up
        ready = client.get("/readyz")
        assert ready.json()["ready"] is True
        assert ready.json()["serving"] == {HARDWARE: old}
        assert f"{HARDWARE} version {new} failed to load" in ready.json()["last_reload_error"]
        assert f"still serving {old}" in ready.json()["last_reload_error"]
        rec = client.post("/v1/recommend", json={"op": "ag_gemm", "m": 4096, "n": 4096, "k": 4096})
        assert rec.status_code == 200 and rec.json()["model_version"] == old
        assert "ficco_model_last_reload_failed 1.0" in client.get("/metrics").text
    assert any(f"version {new} failed to load" in r.getMessage() for r in caplog.records)


def test_reload_after_fix_clears_error(model_root, start, damage, wait_for):
    new = _other_version(model_root)
    card = (model_root / HARDWARE / new / "card.json").read_text()
    damage(model_root / HARDWARE / new, "schema")
    with start(model_root, RELOAD_TOKEN=TOKEN) as client:
        promote(model_root, HARDWARE, new)
        client.post("/v1/models/reload", headers=AUTH)
        assert client.get("/readyz").json()["last_reload_error"]
        (model_root / HARDWARE / new / "card.json").write_text(card)
        assert json.loads(card)["version"] == new
        client.post("/v1/models/reload", headers=AUTH)
        assert wait_for(lambda: client.get("/readyz").status_code == 200)
        assert client.get("/readyz").json() | {"default_hardware": None} == {
            "ready": True,
            "serving": {HARDWARE: new},
            "batch_workers_ready": True,
            "default_hardware": None,
            "last_reload_error": None,
            "grid_tables_ready": True,
            "grid_tables_pending": [],
        }
