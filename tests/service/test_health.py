"""GET /healthz, /readyz and /metrics."""

from __future__ import annotations

HARDWARE = "h200x2"


def test_read_health_ok(client):
    assert client.get("/healthz").json() == {"status": "ok"}


def test_read_ready_names_served_model(client, registry_root, wait_for):
    from ficco.training.predict.registry import current_version

    assert wait_for(lambda: client.get("/readyz").status_code == 200)  # once the batch worker is warm
    response = client.get("/readyz")
    assert response.json() == {
        "ready": True,
        "serving": {HARDWARE: current_version(registry_root, HARDWARE)},
        "batch_workers_ready": True,
        "grid_tables_ready": True,  # the table prefetch is off in the tests' settings
        "grid_tables_pending": [],
        "default_hardware": HARDWARE,
        "last_reload_error": None,
    }


def test_read_ready_empty_registry_is_503_and_recommend_is_503(tmp_path, start):
    with start(tmp_path / "empty") as client:
        assert client.get("/healthz").status_code == 200
        response = client.get("/readyz")
        assert response.status_code == 503
        assert response.json()["ready"] is False
        recommend = client.post("/v1/recommend", json={"op": "ag_gemm", "m": 64, "n": 64, "k": 64})
        assert recommend.status_code == 503
        assert "no model is loaded" in recommend.json()["detail"]


def test_read_metrics_counts_requests_per_endpoint(registry_root, start):
    with start(registry_root) as client:
        for _ in range(3):
            client.post("/v1/recommend", json={"op": "ag_gemm", "m": 64, "n": 64, "k": 64})
        client.post("/v1/recommend", json={"op": "bad"})
        client.post("/v1/recommend", content=b" " * (client.app.state.settings.MAX_BODY_BYTES + 1))
        text = client.get("/metrics").text
    version = client.app.state.store.served[HARDWARE].version
    assert 'ficco_http_requests_total{endpoint="/v1/recommend",method="POST",status="200"} 3.0' in text
    assert 'ficco_http_requests_total{endpoint="/v1/recommend",method="POST",status="422"} 1.0' in text
    assert 'ficco_http_requests_total{endpoint="unrouted",method="POST",status="413"} 1.0' in text
    assert 'ficco_http_request_duration_seconds_count{endpoint="/v1/recommend",method="POST"} 4.0' in text
    assert (
        'ficco_http_request_duration_seconds_bucket{endpoint="/v1/recommend",le="0.005",method="POST"}'
        in text
    )
    assert f'ficco_model_info{{hardware_id="{HARDWARE}",version="{version}"}} 1.0' in text
    assert "ficco_model_last_reload_failed 0.0" in text
