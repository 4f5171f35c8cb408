"""Bugs found by a hard test of the service (issue 15): each test failed before its fix."""

from __future__ import annotations

import asyncio
import contextlib

from ficco.service.core.metrics import Metrics, MetricsMiddleware

HW = "h200x2"
SURROGATE_BODY = b'{"op":"\\ud800","m":4096,"n":4096,"k":4096}'


def test_lone_surrogate_in_echoed_string_is_422_not_500(client):
    response = client.post(
        "/v1/recommend", content=SURROGATE_BODY, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert response.json()["detail"][0]["field"] == "op"


def test_lone_surrogate_in_batch_item_hardware_is_an_error_item(client):
    body = b'{"scenarios":[{"op":"ag_gemm","m":64,"n":64,"k":64,"hardware":"\\udfff"}]}'
    response = client.post("/v1/recommend/batch", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200
    (item,) = response.json()["data"]
    assert item["status"] == "error" and item["errors"][0]["field"] == "scenarios.0.hardware"


@contextlib.contextmanager
def _corrupt_version_promoted(model_root, start, damage):
    """A served client after a corrupt version was promoted and the reload failed; yields the client and
    the version it still serves."""
    from ficco.training.predict.registry import current_version, list_models, promote

    with start(model_root) as client:
        served = current_version(model_root, HW)
        other = next(c["version"] for c in list_models(model_root)[HW] if c["version"] != served)
        damage(model_root / HW / other, "corrupt")
        promote(model_root, HW, other)
        client.app.state.store.refresh()
        yield client, served


def test_readyz_clears_reload_error_after_rollback_to_served_version(model_root, start, damage):
    from ficco.training.predict.registry import promote

    with _corrupt_version_promoted(model_root, start, damage) as (client, served):
        assert client.get("/readyz").json()["last_reload_error"] is not None
        promote(model_root, HW, served)  # roll back to the version still serving
        client.app.state.store.refresh()
        assert client.get("/readyz").json()["last_reload_error"] is None
        assert "ficco_model_last_reload_failed 0.0" in client.get("/metrics").text


def test_client_disconnect_mid_body_is_not_counted_as_500():
    metrics = Metrics()

    async def app(scope, receive, send):
        await receive()  # the client went away: the server sees a disconnect and never answers
        raise OSError("client disconnected")

    messages = [{"type": "http.disconnect"}]

    async def receive():
        return messages.pop(0)

    async def send(message):
        raise AssertionError("nothing should be sent")

    middleware = MetricsMiddleware(app, metrics=metrics)
    scope = {"type": "http", "method": "POST", "path": "/v1/recommend", "headers": []}
    with contextlib.suppress(OSError):
        asyncio.run(middleware(scope, receive, send))
    text = metrics.registry.get_sample_value(
        "ficco_http_requests_total", {"method": "POST", "endpoint": "unrouted", "status": "500"}
    )
    assert text is None
    assert (
        metrics.registry.get_sample_value(
            "ficco_http_requests_total", {"method": "POST", "endpoint": "unrouted", "status": "499"}
        )
        == 1
    )


def test_empty_batch_is_422(client):
    response = client.post("/v1/recommend/batch", json={"scenarios": []})
    assert response.status_code == 422
    assert response.json()["detail"][0]["field"] == "scenarios"


def test_malformed_json_names_the_body_not_an_offset(client):
    response = client.post(
        "/v1/recommend", content=b'{"op": "ag_gemm", "m": ', headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    item = response.json()["detail"][0]
    assert item["field"] == "body"
    assert "JSON" in item["msg"] and "position" in item["msg"]


def test_body_without_json_content_type_has_no_bytes_repr(client):
    response = client.post(
        "/v1/recommend", content=b'{"op": "ag_gemm"}', headers={"content-type": "text/plain"}
    )
    assert response.status_code == 422
    item = response.json()["detail"][0]
    assert not str(item["input"]).startswith("b'")
    assert "application/json" in item["msg"]


def test_nan_is_told_it_is_not_a_number(client):
    body = b'{"op":"ag_gemm","m":64,"n":64,"k":64,"experts":8,"top_k":2,"imbalance":NaN}'
    response = client.post("/v1/recommend", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422
    msg = response.json()["detail"][0]["msg"]
    assert "less than or equal" not in msg
    assert "finite" in msg


def test_openapi_declares_the_reload_bearer_token(client):
    spec = client.get("/openapi.json").json()
    schemes = spec["components"]["securitySchemes"]
    assert any(s.get("scheme") == "bearer" for s in schemes.values())
    assert spec["paths"]["/v1/models/reload"]["post"]["security"]


def test_docs_page_loads_no_assets_from_a_cdn(client):
    html = client.get("/docs").text
    assert "cdn.jsdelivr.net" not in html and "unpkg.com" not in html
    asset = client.get("/docs/assets/swagger-ui-bundle.js")
    assert asset.status_code == 200


def test_readyz_and_models_show_no_absolute_paths(model_root, start, damage):
    with _corrupt_version_promoted(model_root, start, damage) as (client, _served):
        assert str(model_root) not in client.get("/readyz").text
        assert str(model_root) not in client.get("/v1/models").text


def test_lone_surrogate_in_score_name_is_answered(client):
    config = (
        b'{"hidden_size":4096,"intermediate_size":14336,"num_attention_heads":32,"num_key_value_heads":8,'
    )
    config += b'"num_hidden_layers":32,"vocab_size":128256,"model_type":"llama"}'
    body = b'{"config":' + config + b',"name":"\\ud800x","tp":2,"tokens":[4096]}'
    response = client.post("/v1/score", content=body, headers={"content-type": "application/json"})
    assert response.status_code in (200, 422)
