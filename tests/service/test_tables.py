"""GET/POST /v1/tables: ETags and 304s, a new ETag after a promotion, refusals; the client's disk cache and
the planner that fetches one table and asks no shape."""

from __future__ import annotations

import httpx
import pytest

from ficco.features import Scenario
from ficco.runtime import Planner, ServiceSource
from ficco.runtime.planner import OpRequest
from ficco.service.client import ServiceClient, ServiceError
from ficco.training.registry import current_version, promote

HARDWARE = "h200x2"
TOKEN = "test-reload-token-0123456789"
SHAPES = {
    "tp": 2,
    "mode": "graph",
    "shapes": ["ag_gemm:4096:4096", "gemm_rs:4096:14336"],
    "allow_simulated": True,
}


class CountingTransport(httpx.BaseTransport):
    """Forwards every request (path and query) to a started app's TestClient and records (method, path)."""

    def __init__(self, app_client) -> None:
        self.app_client = app_client
        self.requests: list[tuple[str, str]] = []
        self.codes: list[int] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((request.method, request.url.path))
        response = self.app_client.request(
            request.method,
            request.url.raw_path.decode(),
            content=request.read(),
            headers=dict(request.headers),
        )
        self.codes.append(response.status_code)
        return httpx.Response(response.status_code, content=response.content, headers=response.headers)


def test_table_answers_304_to_a_matching_if_none_match(client):
    first = client.post(f"/v1/tables/{HARDWARE}", json=SHAPES)
    assert first.status_code == 200
    etag = first.headers["etag"]
    assert first.json()["model"]["version"] and len(first.json()["entries"]) == 2
    again = client.post(f"/v1/tables/{HARDWARE}", json=SHAPES, headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag
    other = client.post(
        f"/v1/tables/{HARDWARE}", json={**SHAPES, "mode": "eager"}, headers={"If-None-Match": etag}
    )
    assert other.status_code == 200 and other.headers["etag"] != etag


def test_table_gets_a_new_etag_after_a_model_promotion(model_root, start, train):
    with start(model_root, RELOAD_TOKEN=TOKEN) as client:
        first = client.post(f"/v1/tables/{HARDWARE}", json=SHAPES)
        old_version = current_version(model_root, HARDWARE)
        new = train(model_root, HARDWARE, seed=7, promote=False)
        promote(model_root, HARDWARE, new)
        assert (
            client.post("/v1/models/reload", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        )
        after = client.post(
            f"/v1/tables/{HARDWARE}", json=SHAPES, headers={"If-None-Match": first.headers["etag"]}
        )
        assert after.status_code == 200 and after.headers["etag"] != first.headers["etag"]
        assert first.json()["model"]["version"] == old_version and after.json()["model"]["version"] == new


def test_table_of_a_model_without_measurements_is_refused_unless_asked(client):
    response = client.post(f"/v1/tables/{HARDWARE}", json={**SHAPES, "allow_simulated": False})
    assert response.status_code == 422 and "not GPU measurements" in str(response.json())
    marked = client.post(f"/v1/tables/{HARDWARE}", json=SHAPES).json()
    assert marked["simulated"] is True


def test_table_for_hardware_without_a_served_model_is_404(client):
    response = client.get("/v1/tables/h100x8", params={"tp": 2})
    assert response.status_code == 404 and response.json()["known_ids"] == [HARDWARE]


def test_table_of_a_posted_config_holds_its_layers(client):
    config = {
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256, "rms_norm_eps": 1e-5,
    }  # fmt: skip
    body = {"tp": 2, "mode": "graph", "config": config, "allow_simulated": True}
    entries = client.post(f"/v1/tables/{HARDWARE}", json=body).json()["entries"]
    assert {(e["op"], e["n"], e["k"]) for e in entries} == {
        ("ag_gemm", 3072, 4096), ("gemm_rs", 4096, 2048), ("ag_gemm", 14336, 4096), ("gemm_rs", 4096, 7168),
    }  # fmt: skip


def test_client_caches_the_table_on_disk_and_revalidates_it(client, tmp_path, monkeypatch):
    transport = CountingTransport(client)
    shapes = SHAPES["shapes"]
    with (
        ServiceClient("http://service", transport=transport) as service,
        pytest.raises(ServiceError, match="422"),
    ):
        service.fetch_table(HARDWARE, tp=2, mode="graph", shapes=shapes, cache_dir=tmp_path)
    # the test model is simulated: serve its table with the flag, through a POST body the client builds
    body_client = CountingTransport(client)
    original = body_client.handle_request

    def allow_simulated(request: httpx.Request) -> httpx.Response:
        import json

        body = json.loads(request.read() or b"{}")
        rebuilt = httpx.Request(request.method, request.url, headers=request.headers,
                                json={**body, "allow_simulated": True})  # fmt: skip
        return original(rebuilt)

    body_client.handle_request = allow_simulated
    monkeypatch.setenv("HOME", str(tmp_path))  # "~" in the cache directory is the user's home
    with ServiceClient("http://service", transport=body_client) as service:
        first = service.fetch_table(HARDWARE, tp=2, mode="graph", shapes=shapes, cache_dir="~/tables")
        again = service.fetch_table(HARDWARE, tp=2, mode="graph", shapes=shapes, cache_dir="~/tables")
    assert again.to_dict() == first.to_dict()
    assert body_client.codes == [200, 304]
    cached = list((tmp_path / "tables").glob(f"{HARDWARE}/sha256-*/op=tp_overlap,*.json"))
    assert len(cached) == 1 and first.fingerprint.replace(":", "-") in str(cached[0])


def test_planner_against_the_service_makes_one_table_request_and_no_per_shape_request(client, tmp_path):
    transport = CountingTransport(client)
    original = transport.handle_request

    def allow_simulated(request: httpx.Request) -> httpx.Response:  # the test model is simulated
        url = request.url.copy_merge_params({"allow_simulated": "true"})
        return original(httpx.Request(request.method, url, headers=request.headers, content=request.read()))

    transport.handle_request = allow_simulated
    with ServiceClient("http://service", transport=transport) as service:
        source = ServiceSource(service, tables=True, cache_dir=tmp_path, machine=None)
        planner = Planner(source, mode="graph", timeout_s=60.0)
        requests = [
            OpRequest(
                op=op, m=m, n=4096, k=k, dtype="bf16", world_size=2, layer=f"layers.{i}", direction="fwd"
            )
            for i, (op, m, k) in enumerate(
                [("ag_gemm", 512, 4096), ("gemm_rs", 8192, 4096), ("ag_gemm", 64, 8192)]
            )
        ]
        planner.prepare(requests)
        for r in requests:
            planner.schedule(r)
        with planner.step():
            planner.schedule(OpRequest(op="ag_gemm", m=2048, n=4096, k=4096, dtype="bf16", world_size=2,
                                       layer="late", direction="fwd"))  # fmt: skip
        planner.close()
    assert transport.requests == [("GET", f"/v1/tables/{HARDWARE}")]
    assert all(d.origin.startswith("table ") for d in planner.decisions.values())
    table = source._tables[(HARDWARE, 2, "graph", "bf16")]
    expected = table.answer(Scenario(op="ag_gemm", m=512, n=4096, k=4096), "graph").schedule
    assert str(planner.decisions[planner.key(requests[0])].schedule) == expected
