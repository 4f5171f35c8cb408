"""Large batches cannot starve single requests: their parsing, validation and prediction run in a
bounded worker (one at a time by default), and a full queue answers 429 with Retry-After (issue 15 item 5)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from ficco.service.core.admission import BatchGate, BusyError

GOOD = {"op": "ag_gemm", "m": 64, "n": 64, "k": 64}


def test_gate_refuses_past_running_plus_queued():
    release = threading.Event()

    async def scenario():
        gate = BatchGate(concurrency=1, queue=1, retry_after_s=2)
        first = asyncio.create_task(gate.run(release.wait))
        second = asyncio.create_task(gate.run(lambda: "second"))
        await asyncio.sleep(0.01)
        with pytest.raises(BusyError) as busy:
            await gate.run(lambda: "third")
        assert busy.value.retry_after_s == 2
        release.set()
        assert (await first, await second) == (True, "second")
        return await gate.run(lambda: "after")

    assert asyncio.run(scenario()) == "after"


def test_full_batch_queue_is_429_with_retry_after(registry_root, start):
    with start(registry_root, BATCH_CONCURRENCY=1, BATCH_QUEUE=0) as client:
        gate: BatchGate = client.app.state.batch_gate
        gate.admitted = gate.limit  # as if a batch were running
        response = client.post("/v1/recommend/batch", json={"scenarios": [GOOD]})
        assert response.status_code == 429
        assert response.headers["retry-after"] == str(gate.retry_after_s)
        assert "busy" in response.json()["detail"]
        gate.admitted = 0
        assert client.post("/v1/recommend/batch", json={"scenarios": [GOOD]}).status_code == 200


def test_batch_is_parsed_and_answered_off_the_event_loop(client, monkeypatch):
    import ficco.service.routes.recommend as route

    on_loop: list[bool] = []
    original = route.recommend_scenarios

    def recording(*args, **kwargs):
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return original(*args, **kwargs)

    monkeypatch.setattr(route, "recommend_scenarios", recording)
    assert client.post("/v1/recommend/batch", json={"scenarios": [GOOD, GOOD]}).json()["count"] == 2
    assert on_loop == [False]


def test_batch_errors_keep_their_shape(client):
    response = client.post("/v1/recommend/batch", json={"scenarios": [GOOD, {**GOOD, "op": "x"}]})
    assert response.status_code == 422
    assert response.json()["detail"][0]["field"] == "scenarios.1.op"
    bad_json = client.post(
        "/v1/recommend/batch", content=b'{"scenarios": [', headers={"content-type": "application/json"}
    )
    assert bad_json.status_code == 422 and bad_json.json()["detail"][0]["field"] == "body"


def test_openapi_still_documents_the_batch_body(client):
    spec = client.get("/openapi.json").json()
    body = spec["paths"]["/v1/recommend/batch"]["post"]["requestBody"]
    assert body["required"] is True
    assert "RecommendBatchRequest" in str(body)
