"""POST /v1/recommend and /v1/recommend/batch: answers, 422s, unknown hardware, body and batch limits."""

from __future__ import annotations

import json

import pytest

from ficco.features import KNOWN_HARDWARE, Scenario, candidates, get_hardware
from ficco.service.routes import recommend as recommend_routes
from ficco.service.schemas import ALLOWED, RecommendationsPublic

GOOD = {"op": "ag_gemm", "m": 8192, "n": 14336, "k": 4096}


def _one_error(response, field: str) -> dict:
    assert response.status_code == 422, response.text
    errors = {e["field"]: e for e in response.json()["detail"]}
    assert field in errors, errors
    return errors[field]


def test_recommend_returns_valid_schedule(client):
    response = client.post("/v1/recommend", json=GOOD)
    assert response.status_code == 200
    body = response.json()
    valid = {str(s) for s in candidates(Scenario(**GOOD, hardware=get_hardware("h200x2")))}
    assert body["schedule"] in valid
    assert set(body["predicted_speedups"]) <= valid
    assert body["predicted_speedups"]["serial/sm"] == pytest.approx(1.0)
    assert body["mode"] == "eager"
    assert body["model_version"] == client.get("/readyz").json()["serving"]["h200x2"]
    assert body["hardware_id"] == body["requested_hardware"] == "h200x2"
    assert body["hardware_substitution"] is None
    assert body["fallback"] is (body["fallback_reason"] is not None)


def test_recommend_same_answer_twice(client):
    first = client.post("/v1/recommend", json=GOOD).json()
    assert client.post("/v1/recommend", json=GOOD).json() == first


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("op", "all_gather", "one of ['ag_gemm', 'gemm_rs', 'a2a_gemm', 'gemm_a2a']"),
        ("m", 0, "an int in [1, 1048576]"),
        ("n", 2**21, "an int in [1, 1048576]"),
        ("k", 4096.0, "an int in [1, 1048576]"),
        ("k", "4096", "an int in [1, 1048576]"),
        ("dtype", "fp8", "one of ['bf16', 'fp16', 'fp32']"),
        ("world_size", 9, "an int in [2, 8] or null"),
        ("world_size", True, "an int in [2, 8] or null"),
        ("imbalance", 0.5, "a number in [1, 8]"),
        ("hardware", "h200 x2", "a string matching ^[A-Za-z0-9_-]{1,64}$ or null"),
    ],
)
def test_recommend_bad_field_names_field_value_allowed(client, field, value, allowed):
    error = _one_error(client.post("/v1/recommend", json={**GOOD, field: value}), field)
    assert error["input"] == value
    assert error["allowed"] == allowed
    assert error["loc"] == ["body", field]
    assert error["msg"]


def test_recommend_missing_field_is_422(client):
    body = dict(GOOD)
    del body["k"]
    error = _one_error(client.post("/v1/recommend", json=body), "k")
    assert error["type"] == "missing"
    assert error["allowed"] == ALLOWED["k"]


def test_recommend_unknown_field_lists_allowed_fields(client):
    response = client.post("/v1/recommend", json={**GOOD, "tokens": 3})
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert (
        "'tokens'" in error["msg"] and "allowed fields are" in error["msg"] and "'world_size'" in error["msg"]
    )


def test_recommend_indivisible_m_is_422_at_m(client):
    error = _one_error(client.post("/v1/recommend", json={**GOOD, "m": 8191}), "m")
    assert error["input"] == 8191
    assert "divisible by world_size=2" in error["msg"]


def test_recommend_world_size_the_model_lacks_is_422_with_the_served_pairs(client):
    """A world size the hardware's model was not trained at: one line with the measured (hardware, world
    size) pairs served and both ways forward; ``allowed`` is the hardware's, not the schema's [2, 8]."""
    error = _one_error(
        client.post("/v1/recommend", json={**GOOD, "world_size": 4, "hardware": "h200x2"}), "world_size"
    )
    assert error["allowed"] == "one of [2] on h200x2"
    assert "\n" not in error["msg"] and "pairs served: (h200x2, 2)." in error["msg"]
    assert "world_size=4 needs more GPUs than h200x2's gpu_count=2" in error["msg"]
    assert "`ficco retrain --hardware h200x4 --tp 4`" in error["msg"]  # runnable: a profile of 4 such GPUs
    sim = "`ficco retrain --backend sim --hardware h200x4 --tp 4`, then ask hardware 'h200x4-sim'"
    assert sim in error["msg"]


def test_recommend_moe_rules_are_422(client):
    moe = {"op": "a2a_gemm", "m": 4096, "n": 2048, "k": 4096, "experts": 7, "top_k": 2}
    error = _one_error(client.post("/v1/recommend", json=moe), "experts")
    assert "multiple of world_size=2" in error["msg"]
    error = _one_error(client.post("/v1/recommend", json={**GOOD, "experts": 8}), "experts")
    assert "applies only to MoE ops" in error["msg"]


def test_recommend_nan_imbalance_is_422_not_500(client):
    body = json.dumps({**GOOD, "op": "a2a_gemm", "experts": 8, "top_k": 2, "imbalance": float("nan")})
    response = client.post("/v1/recommend", content=body, headers={"content-type": "application/json"})
    error = _one_error(response, "imbalance")
    assert error["input"] == "nan"


def test_recommend_malformed_json_is_422(client):
    response = client.post("/v1/recommend", content=b'{"op": ', headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["type"] == "json_invalid"


def test_recommend_unknown_hardware_is_404_with_known_ids(client):
    response = client.post("/v1/recommend", json={**GOOD, "hardware": "a100x8"})
    assert response.status_code == 404
    body = response.json()
    assert body["known_ids"] == sorted(KNOWN_HARDWARE)
    assert "a100x8" in body["detail"]


def test_recommend_other_die_without_model_is_422_at_world_size(client):
    """A known hardware id no model answers: 422 at world_size (its GPU count when the request names none),
    naming what is served and the ways forward, as every "no model at this world size" is."""
    error = _one_error(client.post("/v1/recommend", json={**GOOD, "hardware": "mi300xx8"}), "world_size")
    detail = error["msg"]
    assert "no model answers hardware 'mi300xx8' at world_size=8: no model is loaded for it" in detail
    assert "pairs served: (h200x2, 2)." in detail and "hardware 'mi300xx8-sim'" in detail
    assert error["allowed"] == "none: no model answers mi300xx8"


def test_recommend_same_die_hardware_is_substituted_and_says_why(client):
    """Asked explicitly for world size 2 on h100x8, the h200x2 model answers, with the substitution as a
    structured field; without a world size the request is for 8 GPUs, which no model answers."""
    exact = client.post("/v1/recommend", json=GOOD).json()
    body = client.post("/v1/recommend", json={**GOOD, "hardware": "h100x8", "world_size": 2}).json()
    assert body["requested_hardware"] == "h100x8" and body["world_size"] == 2
    assert body["hardware_id"] == "h200x2"
    assert "answered with the 'h200x2' model" in body["hardware_substitution"]
    assert "world_size=2 fits its 2 GPUs" in body["hardware_substitution"]
    sub = body["substitution"]
    assert (sub["requested_hardware"], sub["answered_hardware"], sub["world_size"]) == ("h100x8", "h200x2", 2)
    assert sub["differs"]["gpu_count"] == [8, 2] and sub["differs"]["gpu_name"][1] == "NVIDIA H200"
    assert sub["reason"] == body["hardware_substitution"]
    assert body["schedule"] == exact["schedule"]
    assert exact["substitution"] is None and exact["world_size"] == 2
    error = _one_error(client.post("/v1/recommend", json={**GOOD, "hardware": "h100x8"}), "world_size")
    assert "at world_size=8" in error["msg"] and error["allowed"] == "one of [2] on h100x8"


def test_recommend_substitution_needs_enough_gpus(client):
    error = _one_error(
        client.post("/v1/recommend", json={**GOOD, "hardware": "h200x8", "world_size": 8}), "world_size"
    )
    assert (
        "was trained at world_size=8; h200x8 is answered at world_size 2; measured (hardware, world size) "
        "pairs served: (h200x2, 2)." in error["msg"]
    )


def test_recommend_body_over_limit_is_413(client):
    limit = client.app.state.settings.MAX_BODY_BYTES
    response = client.post(
        "/v1/recommend", content=b" " * (limit + 1), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert f"limit of {limit} bytes" in response.json()["detail"]


def test_recommend_streamed_body_over_limit_is_413(client):
    limit = client.app.state.settings.MAX_BODY_BYTES
    chunks = (b" " * (64 * 1024) for _ in range(limit // (64 * 1024) + 2))  # no Content-Length: chunked
    response = client.post("/v1/recommend", content=chunks, headers={"content-type": "application/json"})
    assert response.status_code == 413


def test_recommend_batch_equals_one_by_one(registry_root, start):
    scenarios = [
        GOOD,
        {"op": "gemm_rs", "m": 2048, "n": 4096, "k": 1792, "dtype": "fp16"},
        {"op": "ag_gemm", "m": 512, "n": 1024, "k": 8192, "hardware": "h100x4", "world_size": 2},
        {"op": "gemm_rs", "m": 98304, "n": 8192, "k": 3584, "dtype": "fp32"},
    ]
    with start(registry_root, CACHE_SIZE=0) as client:  # no cache: every answer is computed afresh
        batch = client.post("/v1/recommend/batch", json={"scenarios": scenarios})
        one_by_one = [client.post("/v1/recommend", json=s).json() for s in scenarios]
    assert batch.status_code == 200
    assert batch.json()["count"] == len(scenarios) and batch.json()["failed"] == 0
    assert [item["index"] for item in batch.json()["data"]] == list(range(len(scenarios)))
    assert [item["result"] for item in batch.json()["data"]] == one_by_one


def test_recommend_batch_over_limit_is_422(client):
    limit = client.app.state.settings.MAX_BATCH
    response = client.post("/v1/recommend/batch", json={"scenarios": [GOOD] * (limit + 1)})
    error = _one_error(response, "scenarios")
    assert error["input"] == limit + 1
    assert f"at most {limit} scenarios" in error["msg"]


def test_recommend_batch_answers_each_item_and_names_every_bad_one(client):
    """A bad scenario is an error item with the 422 items a single request gets; the others are answered."""
    scenarios = [GOOD, {**GOOD, "m": 8191}, GOOD, {**GOOD, "op": "nope"}, {**GOOD, "world_size": 4}]
    response = client.post("/v1/recommend/batch", json={"scenarios": scenarios})
    assert response.status_code == 200
    body = response.json()
    assert (body["count"], body["failed"]) == (5, 3)
    assert RecommendationsPublic.model_validate_json(response.content).model_dump(mode="json") == body
    assert [item["status"] for item in body["data"]] == ["ok", "error", "ok", "error", "error"]
    assert body["data"][0]["result"] == client.post("/v1/recommend", json=GOOD).json()
    for index, field in ((1, "m"), (3, "op"), (4, "world_size")):
        (error,) = body["data"][index]["errors"]
        single = client.post("/v1/recommend", json=scenarios[index])
        assert single.status_code == 422
        (alone,) = single.json()["detail"]
        assert error["field"] == f"scenarios.{index}.{field}" and alone["field"] == field
        assert [error[k] for k in ("msg", "type", "allowed")] == [
            alone[k] for k in ("msg", "type", "allowed")
        ]


def test_recommend_batch_unknown_hardware_is_its_items_error(client):
    """An id nobody knows refuses its item (type unknown_hardware, the 404's line, the known ids allowed)."""
    response = client.post("/v1/recommend/batch", json={"scenarios": [GOOD, {**GOOD, "hardware": "tpu"}]})
    assert response.status_code == 200 and response.json()["data"][0]["status"] == "ok"
    (error,) = response.json()["data"][1]["errors"]
    assert (error["field"], error["type"]) == ("scenarios.1.hardware", "unknown_hardware")
    single = client.post("/v1/recommend", json={**GOOD, "hardware": "tpu"})
    assert single.status_code == 404 and error["msg"] == single.json()["detail"]
    assert error["msg"].startswith(
        "no model answers hardware 'tpu' at world_size=2: unknown hardware id 'tpu'"
    )
    assert error["allowed"] == f"one of {single.json()['known_ids']}"


def test_default_limits_fit_a_full_batch():
    from ficco.service.core.config import Settings

    settings = Settings()
    widest = {
        **GOOD,
        "op": "gemm_a2a",
        "m": 1048576,
        "dtype": "bf16",
        "world_size": 8,
        "hardware": "h200x8",
        "experts": 1024,
        "top_k": 1024,
        "imbalance": 7.123456789,
    }
    body = json.dumps({"scenarios": [widest] * settings.MAX_BATCH})
    assert len(body) <= settings.MAX_BODY_BYTES


def test_a_rule_across_fields_is_the_allowed_of_its_422(client):
    """A value inside its field's range that breaks a rule across fields: ``allowed`` states the rule the
    message gives, not the range the value lies in."""
    error = _one_error(client.post("/v1/recommend", json={**GOOD, "m": 3}), "m")
    assert "divisible by world_size=2" in error["allowed"] and "divisible by world_size=2" in error["msg"]
    experts = {"op": "a2a_gemm", "m": 4096, "n": 2048, "k": 4096, "experts": 7, "top_k": 2}
    error = _one_error(client.post("/v1/recommend", json=experts), "experts")
    assert error["allowed"] == "experts must be a multiple of world_size=2"
    config = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
              "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 2}  # fmt: skip
    score = client.post("/v1/score", json={"config": config, "tp": 2, "tokens": [3]})
    (error,) = score.json()["detail"]
    assert error["field"] == "tokens.0" and "multiple of tp=2" in error["allowed"], error


def _fresh(i: int) -> dict:
    """A dense scenario no other test asks for (each answer is then the model's, not the cache's)."""
    return {"op": "gemm_rs", "m": 2 * (7001 + i), "n": 3584, "k": 5120 + 128 * i}


@pytest.fixture
def route_only(monkeypatch):
    """Call ``route_only(True)`` to have every request answered by the route, as if the fast path
    (``routes.recommend.RecommendFastPath``) were not there; ``route_only(False)`` puts it back.
    ``route_only.fast`` counts the requests the fast path answered."""
    original = recommend_routes.RecommendFastPath._try

    async def declined(self, scope, body):
        return None

    async def counted(self, scope, body):
        answer = await original(self, scope, body)
        set_route_only.fast += answer is not None
        return answer

    def set_route_only(on: bool) -> None:
        monkeypatch.setattr(recommend_routes.RecommendFastPath, "_try", declined if on else counted)

    set_route_only.fast = 0
    return set_route_only


@pytest.mark.parametrize(
    "extra",
    [{}, {"mode": "graph"}, {"hardware": "h200x8", "world_size": 2}, {"host_factor": 2.0}, {"m": 2**20}],
)
def test_fast_path_answers_the_bytes_the_route_gives(client, route_only, extra):
    """The fast path answers with the bytes and headers the route gives: an own answer, a graph one, a
    substitution, a host factor and a range note, each answered new by either path first."""
    for i, order in enumerate([("fast", "route"), ("route", "fast")]):
        body = {**_fresh(i + 10 * len(extra)), **extra}
        answers = {}
        for path in order:
            route_only(path == "route")
            response = client.post("/v1/recommend", json=body)
            assert response.status_code == 200, response.text
            assert response.headers["content-type"] == "application/json"
            answers[path] = response.content
        assert answers["fast"] == answers["route"]
        assert json.loads(answers["fast"])["world_size"] == 2
    assert route_only.fast == 2  # the fast path answered, where asked to


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        (b'{"op": "ag_gemm", "m": 8192', {}, 422),  # not JSON
        (b"[1, 2]", {}, 422),  # JSON, not an object
        (b'{"op": "ag_gemm", "m": 8192, "n": 4096, "k": 4096}', {"content-type": "text/plain"}, 422),
        (b'{"op": "ag_gemm", "m": 8191, "n": 4096, "k": 4096}', {}, 422),  # a rule across fields
        (b'{"op": "ag_gemm", "m": 8192, "n": 4096, "k": 4096, "hardware": "b900x2"}', {}, 404),  # unknown
        (b'{"op": "ag_gemm", "m": 8192, "n": 4096, "k": 4096, "world_size": 4}', {}, 422),  # no model at 4
    ],
)
def test_fast_path_leaves_every_refusal_to_the_route(client, route_only, body, headers, status):
    """What the fast path cannot answer gets the route's own refusal, byte for byte."""
    headers = {"content-type": "application/json", **headers}
    refusals = []
    for on in (False, True):
        route_only(on)
        refusals.append(client.post("/v1/recommend", content=body, headers=headers))
    assert [r.status_code for r in refusals] == [status, status]
    assert refusals[0].content == refusals[1].content
    assert route_only.fast == 0
    assert "detail" in refusals[0].json()


def test_fast_path_requests_are_counted_under_their_route(client):
    """/metrics labels a request the fast path answered with the route's path, as any other."""

    def answered() -> float:
        prefix = 'ficco_http_requests_total{endpoint="/v1/recommend",method="POST",status="200"}'
        line = next((x for x in client.get("/metrics").text.splitlines() if x.startswith(prefix)), None)
        return float(line.rsplit(" ", 1)[1]) if line else 0.0

    before = answered()
    assert client.post("/v1/recommend", json=_fresh(99)).status_code == 200
    assert answered() == before + 1
