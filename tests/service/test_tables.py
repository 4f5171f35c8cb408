"""GET/POST /v1/tables: ETags and 304s, a new ETag after a promotion, refusals; the client's disk cache and
the planner that fetches one table and asks no shape."""

from __future__ import annotations

import json

import httpx
import pytest

from ficco.features import Scenario
from ficco.runtime import Planner, ServiceSource
from ficco.runtime.planner import OpRequest
from ficco.service.client import ServiceClient, ServiceError
from ficco.training.predict.registry import current_version, promote

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
        decoded = {
            k: v for k, v in response.headers.items() if k not in ("content-encoding", "content-length")
        }
        return httpx.Response(response.status_code, content=response.content, headers=decoded)


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


@pytest.mark.heavy
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


def test_table_for_hardware_without_its_own_model_names_the_table_that_answers(client):
    """Tables never come from another hardware's model: a known id whose answers would be substituted is a
    422 at the path naming the substitute's table; an unknown id a 404 with every known id."""
    response = client.get("/v1/tables/h100x8", params={"tp": 2})
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["path", "hardware_id"] and f"GET /v1/tables/{HARDWARE}?tp=2" in error["msg"]
    assert error["allowed"] == f"a hardware id whose own model answers world_size=2: one of ['{HARDWARE}']"
    unknown = client.get("/v1/tables/a100x8")
    assert unknown.status_code == 404 and HARDWARE in unknown.json()["known_ids"]
    assert "h100x8" in unknown.json()["known_ids"] and "(did you mean 'h100x8'?)" in unknown.json()["detail"]


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


@pytest.mark.heavy
def test_planner_against_the_service_makes_one_table_request_and_no_per_shape_request(client, tmp_path):
    transport = CountingTransport(client)
    original = transport.handle_request

    def allow_simulated(request: httpx.Request) -> httpx.Response:  # the test model is simulated
        url = request.url.copy_merge_params({"allow_simulated": "true"})
        return original(httpx.Request(request.method, url, headers=request.headers, content=request.read()))

    transport.handle_request = allow_simulated
    with ServiceClient("http://service", transport=transport) as service:
        source = ServiceSource(service, tables=True, cache_dir=tmp_path, machine=None)
        planner = Planner(source, mode="graph", off_map="model")  # every table answer runs
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
        planner.schedule(OpRequest(op="ag_gemm", m=2048, n=4096, k=4096, dtype="bf16", world_size=2,
                                   layer="late", direction="fwd"))  # fmt: skip
    assert transport.requests == [("GET", f"/v1/tables/{HARDWARE}")]
    assert all(d.origin.startswith("table ") for d in planner.decisions.values())
    table = source._tables[(HARDWARE, 2, "graph", "bf16")]
    expected = table.answer(Scenario(op="ag_gemm", m=512, n=4096, k=4096), "graph").schedule
    assert str(planner.decisions[planner.key(requests[0])].schedule) == expected


def test_a_post_over_the_shape_limit_is_a_422_naming_the_limit(client):
    shapes = [f"ag_gemm:{128 * (i + 1)}:4096" for i in range(1024)]  # a 23 KB body
    response = client.post(f"/v1/tables/{HARDWARE}", json={**SHAPES, "shapes": shapes})
    assert response.status_code == 422 and "at most 64" in response.text
    config = {
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256, "rms_norm_eps": 1e-5,
    }  # fmt: skip
    both = client.post(f"/v1/tables/{HARDWARE}", json={**SHAPES, "config": config, "shapes": shapes[:62]})
    assert both.status_code == 422 and "at most 64 shapes" in both.json()["detail"][0]["msg"]
    assert "got 65" in both.json()["detail"][0]["msg"]  # the config's 4 and 62 listed, one of them the same


def test_unknown_and_out_of_range_shapes_are_refused_each_located(client):
    shapes = [
        "ag_gemm:4096:4096",
        "foo:1:1",
        "a2a_gemm:4096:4096:7:2",
        "ag_gemm:4096:2097152",
        "gemm_rs:0:64",
    ]
    response = client.post(f"/v1/tables/{HARDWARE}", json={**SHAPES, "shapes": shapes})
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert [d["loc"] for d in detail] == [["body", "shapes", i] for i in (1, 2, 3, 4)]
    assert "op must be one of" in detail[0]["msg"] and "multiple of world_size" in detail[1]["msg"]


def test_world_sizes_the_model_was_not_trained_at_are_refused_whatever_the_flag(client):
    for allow in ("false", "true"):
        response = client.get(f"/v1/tables/{HARDWARE}", params={"tp": 4, "allow_simulated": allow})
        assert response.status_code == 422, response.text
        (error,) = response.json()["detail"]
        assert error["loc"] == ["query", "tp"] and error["type"] == "not_served"
        assert (
            "no model answers hardware 'h200x2' at world_size=4: the h200x2 model was trained at "
            "world_size [2] only" in error["msg"]
        )


@pytest.mark.heavy
def test_a_simulated_models_table_is_served_when_asked_and_marked(model_root, start, train):
    train(model_root, "h200x4-sim", world_size=4)
    with start(model_root) as client:
        path = "/v1/tables/h200x4-sim"
        refused = client.get(path, params={"tp": 4})
        assert refused.status_code == 422 and "not GPU measurements" in refused.text
        table = client.get(path, params={"tp": 4, "allow_simulated": "true"})
        assert table.status_code == 200, table.text
        data = table.json()
        assert data["simulated"] is True and data["world_size"] == 4 and data["hardware_id"] == "h200x4-sim"
        assert len(data["entries"]) == 242  # the shape grid
        assert client.get(path, params={"allow_simulated": "true"}).headers["etag"] == table.headers["etag"]
        wrong_size = client.get(path, params={"tp": 2, "allow_simulated": "true"})
        assert wrong_size.status_code == 422 and "was trained at world_size [4] only" in wrong_size.text
        missing = client.get("/v1/tables/h100x8-sim", params={"tp": 8, "allow_simulated": "true"})
        assert missing.status_code == 422 and "no simulated model of h100x8 is registered" in missing.text
        unknown = client.get("/v1/tables/zz9-sim", params={"tp": 8, "allow_simulated": "true"})
        assert unknown.status_code == 404 and "h200x4-sim" in unknown.json()["known_ids"]


def test_tables_are_gzip_encoded_for_clients_that_accept_it(client):
    body = {**SHAPES, "shapes": ["gemm_rs:2048:2048"]}
    packed = client.post(f"/v1/tables/{HARDWARE}", json=body, headers={"Accept-Encoding": "gzip"})
    plain = client.post(f"/v1/tables/{HARDWARE}", json=body, headers={"Accept-Encoding": "identity"})
    assert packed.headers["content-encoding"] == "gzip" and "content-encoding" not in plain.headers
    assert packed.json() == plain.json() and packed.headers["etag"] == plain.headers["etag"]
    assert packed.headers["vary"] == "Accept-Encoding"


def test_table_builds_run_in_the_table_worker_and_are_kept(client):
    body = {**SHAPES, "shapes": ["ag_gemm:3072:5120"]}
    first = client.post(f"/v1/tables/{HARDWARE}", json=body)
    state = client.app.state
    assert state.table_workers.pids, "the table was built in the serving process"
    assert first.headers["etag"] in state.tables and state.tables.bytes > 0


def test_table_cache_builds_each_table_once_and_keeps_at_most_its_bytes():
    import asyncio

    from ficco.service.tables import TableCache

    builds: list[str] = []

    def builder(name: str, size: int):
        async def build() -> bytes:
            builds.append(name)
            await asyncio.sleep(0.01)
            return b"x" * size

        return build

    async def scenario() -> None:
        cache = TableCache(max_bytes=10)
        same = await asyncio.gather(*(cache.get('"a"', builder("a", 4)) for _ in range(5)))
        assert same == [b"xxxx"] * 5 and builds == ["a"]  # five requests, one build
        await cache.get('"b"', builder("b", 4))
        await cache.get('"a"', builder("a", 4))  # a hit: a is now the most recent
        await cache.get('"c"', builder("c", 4))  # 12 bytes > 10: b (least recent) goes
        assert '"b"' not in cache and '"a"' in cache and '"c"' in cache and cache.bytes == 8
        await cache.get('"big"', builder("big", 11))  # larger than the cache: served, not kept
        assert '"big"' not in cache and builds == ["a", "b", "c", "big"]

    asyncio.run(scenario())


@pytest.mark.heavy
def test_grid_tables_are_built_when_a_model_loads_and_ready_waits_for_them(registry_root, start, wait_for):
    """A model without grid tables in its folder: they are built at start-up, and /readyz says 503 with
    the tables pending until they are there."""
    with start(registry_root, TABLE_PREFETCH=True) as client:
        cache = client.app.state.tables
        first = client.get("/readyz")
        body = first.json()
        building = first.status_code == 503 and not body["grid_tables_ready"] and body["grid_tables_pending"]
        assert building or len(cache._tables) == 2, body
        assert wait_for(lambda: len(cache._tables) == 2, timeout_s=240), "graph and eager grid tables"
        assert wait_for(lambda: client.get("/readyz").status_code == 200, timeout_s=30)
        assert client.get("/readyz").json()["grid_tables_pending"] == []
        held = cache.bytes
        response = client.get(f"/v1/tables/{HARDWARE}", params={"tp": 2, "allow_simulated": "true"})
        assert response.status_code == 200 and response.headers["etag"] in cache and cache.bytes == held


@pytest.mark.heavy
def test_grid_tables_shipped_with_the_model_are_served_without_a_build(start, wait_for):
    """The shipped model's folder holds its grid tables (``ficco export --into-model``): ready means the
    first GET answers from them at once, and the table worker never starts."""
    import gzip

    from ficco.files import SHIPPED_MODELS
    from ficco.training.export import grid_table_path

    with start(SHIPPED_MODELS, TABLE_PREFETCH=True) as client:
        assert wait_for(lambda: client.get("/readyz").status_code == 200, timeout_s=60)
        ready = client.get("/readyz").json()
        assert ready["grid_tables_ready"] and ready["grid_tables_pending"] == []
        for mode in ("graph", "eager"):
            got = client.get(
                f"/v1/tables/{HARDWARE}", params={"tp": 2, "mode": mode}, headers={"Accept-Encoding": "gzip"}
            )
            assert got.status_code == 200
            predictor = client.app.state.store.served[HARDWARE].predictor
            path = grid_table_path(SHIPPED_MODELS / HARDWARE / predictor.version, predictor, tp=2, mode=mode,
                                   dtype="bf16")  # fmt: skip
            assert got.json() == json.loads(gzip.decompress(path.read_bytes()))
        assert client.app.state.table_workers.pids == []  # nothing was built


BLOCKER = """
import sys

# An install with the [service] extra alone: the training stack and torch are not there (importing them
# raises ModuleNotFoundError, importlib.util.find_spec answers None).
for name in ("sklearn", "pandas", "torch", "pyarrow", "matplotlib"):
    sys.modules[name] = None
"""
SERVICE_ONLY = """
import sys, warnings
warnings.filterwarnings("ignore")
from fastapi.testclient import TestClient
from ficco.service.core.config import Settings
from ficco.service.main import create_app
settings = Settings(MODEL_ROOT=sys.argv[1], RELOAD_POLL_S=0, TABLE_PREFETCH=False)
with TestClient(create_app(settings)) as client:
    got = client.get("/v1/tables/h200x2", params={"tp": 2, "mode": "eager", "allow_simulated": "true"})
    posted = client.post("/v1/tables/h200x2", json={"tp": 2, "shapes": ["ag_gemm:4096:4096"],
                                                    "allow_simulated": True})
    answer = client.post("/v1/recommend", json={"op": "ag_gemm", "m": 4096, "n": 4096, "k": 4096})
    print(got.status_code, len(got.json()["entries"]), posted.status_code, len(posted.json()["entries"]),
          answer.status_code, answer.json()["neighbours"] is not None,
          sorted(m for m in ("sklearn", "pandas", "torch") if sys.modules.get(m) is not None))
"""


@pytest.mark.heavy
def test_tables_work_where_only_the_service_extra_is_installed(registry_root, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "sitecustomize.py").write_text(BLOCKER)  # also read by the worker processes it starts
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(repo)])}
    done = subprocess.run([sys.executable, "-c", SERVICE_ONLY, str(registry_root)], capture_output=True,
                          text=True, env=env, timeout=280, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["200", "242", "200", "1", "200", "True", "[]"], done.stdout


def test_a_client_past_its_table_requests_a_second_gets_429_with_retry_after(registry_root, start):
    # 0.01 a second: a burst of 1 (the floor), and no token comes back within the test
    with start(registry_root, TABLE_REQUESTS_PER_S=0.01) as client:
        codes = [client.post(f"/v1/tables/{HARDWARE}", json=SHAPES).status_code for _ in range(3)]
        assert codes == [200, 429, 429], codes
        refused = client.get(f"/v1/tables/{HARDWARE}")  # GET and POST share the client's bucket
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 60
        assert "0.01 requests a second for schedule tables" in refused.text
        # other endpoints are not limited by it
        answer = client.post("/v1/recommend", json={"op": "ag_gemm", "m": 4096, "n": 4096, "k": 4096})
        assert answer.status_code == 200


def test_client_rate_refills_and_keeps_its_bookkeeping_bounded(monkeypatch):
    from ficco.service.core import admission
    from ficco.service.core.admission import BusyError, ClientRate

    now = [100.0]
    monkeypatch.setattr(admission.time, "monotonic", lambda: now[0])
    rate = ClientRate(1.0, what="tables", max_clients=4)
    rate.take("a")
    rate.take("a")
    with pytest.raises(BusyError) as refused:
        rate.take("a")
    assert refused.value.retry_after_s == 1
    rate.take("b")  # another address has its own bucket
    now[0] += 1.0
    rate.take("a")  # one token back after a second
    for client in "cdefgh":
        rate.take(client)
    assert len(rate._buckets) <= 4
    assert ClientRate(0, what="tables").take("a") is None  # 0: no limit
