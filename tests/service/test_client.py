"""service.client against the ASGI app: typed answers, the per-shape cache, retries and errors."""

from __future__ import annotations

import httpx
import pytest

from ficco.service.client import ServiceClient, ServiceError
from ficco.service.schemas import RecommendationPublic, ScorePublic

GOOD = {"op": "ag_gemm", "m": 8192, "n": 14336, "k": 4096}


class AppTransport(httpx.BaseTransport):
    """Forwards every request to the started app of a TestClient, counting them; fails the first few."""

    def __init__(self, app_client, *, connect_errors: int = 0, statuses: tuple[int, ...] = ()) -> None:
        self.app_client = app_client
        self.connect_errors = connect_errors
        self.statuses = list(statuses)
        self.calls = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        if self.connect_errors:
            self.connect_errors -= 1
            raise httpx.ConnectError("connection refused", request=request)
        if self.statuses:
            return httpx.Response(self.statuses.pop(0), json={"detail": "busy"}, headers={"retry-after": "1"})
        response = self.app_client.request(
            request.method, request.url.path, content=request.read(), headers=dict(request.headers)
        )
        return httpx.Response(response.status_code, content=response.content, headers=response.headers)


@pytest.fixture
def waits() -> list[float]:
    return []


def _client(transport, waits, **kwargs) -> ServiceClient:
    return ServiceClient("http://service", transport=transport, sleep=waits.append, **kwargs)


def test_client_recommend_returns_typed_answer_equal_to_api(client, waits):
    with _client(AppTransport(client), waits) as service:
        rec = service.recommend(**GOOD)
    assert isinstance(rec, RecommendationPublic)
    assert rec.model_dump() == client.post("/v1/recommend", json=GOOD).json()


def test_client_asks_once_per_shape(client, waits):
    transport = AppTransport(client)
    with _client(transport, waits) as service:
        first = service.recommend(**GOOD)
        assert service.recommend(**GOOD) is first
        service.recommend(**{**GOOD, "m": 4096})
        service.recommend(**GOOD, hardware="h100x2")  # another hardware is another shape
    assert transport.calls == 3


def test_client_recommend_scenario_uses_its_hardware(client, waits):
    from ficco.features import Scenario, get_hardware

    with _client(AppTransport(client), waits) as service:
        rec = service.recommend_scenario(Scenario(**GOOD, hardware=get_hardware("h100x2")))
    assert rec.requested_hardware == "h100x2"
    assert rec.model_dump() == client.post("/v1/recommend", json={**GOOD, "hardware": "h100x2"}).json()


def test_client_recommend_many_sends_only_new_shapes(client, waits):
    transport = AppTransport(client)
    shapes = [{**GOOD, "m": 2 * i} for i in range(1, 6)]
    with _client(transport, waits) as service:
        service.recommend(**shapes[0])
        answers = service.recommend_many(shapes + shapes, batch_size=3)
        assert [a.model_dump() for a in answers[:5]] == [service.recommend(**s).model_dump() for s in shapes]
    assert transport.calls == 1 + 2  # one single request, then 4 new shapes in batches of 3


def test_client_retries_connect_errors_with_backoff(client, waits):
    transport = AppTransport(client, connect_errors=2)
    with _client(transport, waits, backoff_s=0.1) as service:
        assert service.recommend(**GOOD).schedule
    assert transport.calls == 3
    assert waits == [0.1, 0.2]


def test_client_retries_503_and_429_honouring_retry_after(client, waits):
    transport = AppTransport(client, statuses=(503, 429))
    with _client(transport, waits, max_backoff_s=0.5) as service:
        assert service.recommend(**GOOD).schedule
    assert transport.calls == 3
    assert waits == [0.5, 0.5]  # Retry-After: 1, capped at max_backoff_s


def test_client_gives_up_after_bounded_retries(client, waits):
    transport = AppTransport(client, connect_errors=10)
    with (
        _client(transport, waits, retries=2) as service,
        pytest.raises(ServiceError, match="after 3 attempts"),
    ):
        service.recommend(**GOOD)
    assert transport.calls == 3


def test_client_does_not_retry_client_errors(client, waits):
    transport = AppTransport(client)
    with _client(transport, waits) as service, pytest.raises(ServiceError) as err:
        service.recommend(**{**GOOD, "hardware": "a100x8"})
    assert (err.value.status_code, transport.calls, waits) == (404, 1, [])
    assert "unknown hardware id 'a100x8'" in str(err.value)


def test_client_validates_before_sending(client, waits):
    """A request the server would refuse raises the client's own ServiceError with the server's status and
    error items, before anything is sent."""
    transport = AppTransport(client)
    with (
        _client(transport, waits) as service,
        pytest.raises(ServiceError, match="op: Input should be") as err,
    ):
        service.recommend(**{**GOOD, "op": "nope"})
    assert transport.calls == 0 and err.value.status_code == 422
    server = client.post("/v1/recommend", json={**GOOD, "op": "nope"}).json()["detail"]
    assert err.value.errors == server


def test_client_score_models_ready(client, waits, wait_for):
    config = {
        "model_type": "llama",
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_attention_heads": 8,
        "num_hidden_layers": 4,
    }
    with _client(AppTransport(client), waits) as service:
        score = service.score(config, tp=2, tokens=[2048])
        assert isinstance(score, ScorePublic) and score.layers == 4
        assert service.models().count == 1
        assert wait_for(lambda: client.get("/readyz").status_code == 200)  # once the batch worker is warm
        assert service.ready().ready


def test_client_times_out_and_retries_against_a_silent_server(waits):
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()  # accepts connections, never answers
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        with (
            ServiceClient(url, timeout_s=0.05, retries=1, sleep=waits.append) as service,
            pytest.raises(ServiceError, match="ReadTimeout"),
        ):
            service.recommend(**GOOD)
    assert len(waits) == 1
