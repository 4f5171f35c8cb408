"""Every malformed body gets a 4xx, whatever its shape or depth, on every POST endpoint; only JSON media
types are read; /v1/score/batch is admitted like /v1/recommend/batch (issue 35 item 7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ficco.service.core.offload import is_json

CONFIGS = Path(__file__).resolve().parents[2] / "datasets" / "model_configs"
LLAMA = json.loads((CONFIGS / "Llama-3.1-8B.json").read_text())
POSTS = ("/v1/recommend", "/v1/recommend/batch", "/v1/score", "/v1/score/batch")
JSON = {"content-type": "application/json"}


def _post(client, path: str, body: bytes, content_type: str = "application/json"):
    return client.post(path, content=body, headers={"content-type": content_type})


@pytest.mark.parametrize("path", POSTS)
@pytest.mark.parametrize(
    "body",
    [b'{"scenarios": "AAA"}', b'{"scenarios": 5}', b'{"scenarios": {}}', b'{"configs": "x"}', b"5", b"true",
     b"null", b'"x"', b"[]", b"{}", b'{"scenarios": [5]}', b'{"configs": [5], "tp": 2, "tokens": [64]}'],
)  # fmt: skip
def test_wrong_shapes_are_422(client, path, body):
    """Every wrong shape is a 422, but one scenario of a batch, which its own item refuses."""
    response = _post(client, path, body)
    if path == "/v1/recommend/batch" and body == b'{"scenarios": [5]}':
        assert response.status_code == 200, response.text
        (item,) = response.json()["data"]
        assert item["status"] == "error" and item["errors"][0]["field"] == "scenarios.0"
        return
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["field"]


@pytest.mark.parametrize("path", POSTS)
@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_json_nested_deeply_is_4xx(client, path, depth):
    response = _post(client, path, b"[" * depth + b"]" * depth)
    assert 400 <= response.status_code < 500, response.text
    nested = b'{"scenarios": [' + b'{"a":' * depth + b"1" + b"}" * depth + b"]}"
    assert 400 <= _post(client, path, nested).status_code < 500


def test_config_nested_deeply_is_refused_in_its_item(client):
    config = {**LLAMA, "num_hidden_layers": json.loads("[" * 900 + "]" * 900)}
    response = client.post("/v1/score/batch", json={"configs": [{"config": config}], "tp": 2, "tokens": [64]})
    assert response.status_code == 200, response.text
    assert response.json()["data"][0]["status"] == "error"
    single = client.post("/v1/score", json={"config": config, "tp": 2, "tokens": [64]})
    assert single.status_code == 422 and single.json()["detail"][0]["field"] == "config"


@pytest.mark.parametrize("where", ["_name_or_path", "key"])
def test_lone_surrogate_in_a_config_is_answered(client, where):
    config = json.dumps({**LLAMA, "_name_or_path": "x"}).encode()
    if where == "key":
        config = config.replace(b'"vocab_size"', b'"\\udc80"')
    else:
        config = config.replace(b'"x"', b'"\\ud800 model"')
    single = _post(client, "/v1/score", b'{"config": ' + config + b', "tp": 2, "tokens": [64]}')
    assert single.status_code in (200, 422), single.text
    batch = _post(
        client, "/v1/score/batch", b'{"configs": [{"config": ' + config + b'}], "tp": 2, "tokens": [64]}'
    )
    assert batch.status_code == 200, batch.text
    item = batch.json()["data"][0]
    assert item["status"] == ("ok" if where == "_name_or_path" else "error")
    if where == "_name_or_path":
        assert single.json()["model"] == item["name"] == "\\ud800 model"


@pytest.mark.parametrize(
    ("content_type", "json_"),
    [("application/json", True), ("application/json; charset=utf-8", True),
     ("application/vnd.api+json", True), ("text/plain; charset=json", False), ("text/json", False),
     ("application/jsonx", False), ("", False),
     ("multipart/form-data; boundary=json", False), ("application/x-www-form-urlencoded", False)],
)  # fmt: skip
def test_only_json_media_types_are_read(client, content_type, json_):
    assert is_json(content_type) is json_
    bodies = {
        "/v1/recommend/batch": {"scenarios": [{"op": "ag_gemm", "m": 64, "n": 64, "k": 64}]},
        "/v1/score/batch": {"configs": [{"config": LLAMA}], "tp": 2, "tokens": [64]},
    }
    for path, body in bodies.items():
        response = _post(client, path, json.dumps(body).encode(), content_type)
        assert response.status_code == (200 if json_ else 422), (path, response.text)
        if not json_:
            assert "application/json" in response.json()["detail"][0]["msg"]


def test_score_batch_is_answered_by_the_batch_worker_behind_the_gate(registry_root, start):
    body = {"configs": [{"config": LLAMA}], "tp": 2, "tokens": [64]}
    with start(registry_root, BATCH_CONCURRENCY=1, BATCH_QUEUE=0) as client:
        gate = client.app.state.batch_gate
        gate.admitted = gate.limit  # as if a batch were running
        busy = client.post("/v1/score/batch", json=body)
        assert busy.status_code == 429 and busy.headers["retry-after"] == str(gate.retry_after_s)
        gate.admitted = 0
        workers = client.app.state.batch_workers
        (pid,) = workers.pids
        answer = client.post("/v1/score/batch", json=body)
        assert answer.status_code == 200 and answer.json()["data"][0]["status"] == "ok"
        assert workers.pids == [pid]  # the same worker answered; the server process did not
