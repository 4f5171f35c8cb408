"""Python client of the recommendation service, for runtimes and launchers.

    from ficco.service.client import ServiceClient

    with ServiceClient("http://127.0.0.1:8000") as client:
        rec = client.recommend(op="ag_gemm", m=8192, n=14336, k=4096)      # asks the server
        rec = client.recommend(op="ag_gemm", m=8192, n=14336, k=4096)      # answered from the cache
        print(rec.schedule, rec.predicted_speedup)

Every call has a timeout; transport errors (refused connection, timeouts, dropped connections) and
answers 429, 500, 502, 503, 504 are retried a bounded number of times with exponential backoff (every
endpoint the client calls is idempotent). Other errors raise :class:`ServiceError` with the server's
detail at once. Answers are the service's own schemas, so they are typed and validated.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from ficco.features import Scenario
from ficco.features.schedule_table import ScheduleTableFile
from ficco.service.cache import RecommendationCache
from ficco.service.errors import error_line, from_pydantic
from ficco.service.schemas import (
    ModelsPublic,
    ReadyPublic,
    RecommendationPublic,
    RecommendationsPublic,
    ScenarioIn,
    ScorePublic,
    ScoreRequest,
)

log = logging.getLogger(__name__)

TABLE_TIMEOUT_S = 120.0
"""Longest one attempt of :meth:`ServiceClient.fetch_table` waits, seconds (start-up, not a step)."""
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
"""Answers worth asking again: overload, or the server (or a proxy in front of it) failing."""


class ServiceError(RuntimeError):
    """The service refused a request, or could not be reached (``status_code`` None).

    The message is one line, the same a ``ficco`` command prints after ``error:`` for the same mistake:
    ``field: msg; ...`` for a 422 (``errors.error_line``), the server's sentence otherwise. ``detail`` is
    the answer's ``detail`` as sent; ``errors`` its error items (422: where, the value, what is allowed;
    empty otherwise); ``known_ids`` the hardware ids a request may name (404 for an unknown one). A request
    the client can tell is invalid before sending it (a mistyped op) is refused the same way, with the
    status the server would give (422), without asking it.
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        detail: Any = None,
        known_ids: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.detail = detail
        self.errors: list[dict[str, Any]] = detail if isinstance(detail, list) else []
        self.known_ids = list(known_ids)


class ServiceClient:
    """A synchronous client with timeouts, bounded retries with backoff, and a per-shape answer cache.

    Parameters
    ----------
    base_url : str, default="http://127.0.0.1:8000"
        Where the service listens.
    timeout_s : float, default=2.0
        Connect, read and write timeout of one attempt, seconds.
    retries : int, default=3
        Extra attempts after the first for transport errors and ``RETRY_STATUS`` answers.
    backoff_s : float, default=0.05
        Wait before the first retry, seconds; doubles per retry up to ``max_backoff_s``. A numeric
        ``Retry-After`` header (429/503) is honoured up to ``max_backoff_s``.
    max_backoff_s : float, default=2.0
        Longest wait between attempts, seconds.
    cache_size : int, default=65536
        Recommendations remembered (LRU, keyed by the scenario and hardware); 0 turns the cache off.
    transport : httpx.BaseTransport, optional
        Replaces the network transport (tests, custom proxies).
    sleep : callable, default=time.sleep
        How to wait between attempts (tests pass a recorder).
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        timeout_s: float = 2.0,
        retries: int = 3,
        backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
        cache_size: int = 65536,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not (isinstance(retries, int) and 0 <= retries <= 10):
            raise ValueError(f"ServiceClient.retries must be an int in [0, 10]; got {retries!r}")
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.cache = RecommendationCache(cache_size)
        self._sleep = sleep
        self._http = httpx.Client(base_url=base_url, timeout=httpx.Timeout(timeout_s), transport=transport)

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # Endpoints ---------------------------------------------------------------------------------------

    def recommend(self, **scenario: Any) -> RecommendationPublic:
        """The schedule for one scenario (``ScenarioIn`` fields: op, m, n, k, dtype, world_size, ...).

        Asks the server once per distinct scenario; later calls come from the cache.
        """
        item = _checked(ScenarioIn, scenario, "POST /v1/recommend")
        key = (item.hardware, *item.cache_key())
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        answer = RecommendationPublic.model_validate(self._request("POST", "/v1/recommend", _body(item)))
        self.cache.put(key, answer)
        return answer

    def recommend_scenario(self, scenario: Scenario) -> RecommendationPublic:
        """The schedule for a ``features.Scenario`` (on its hardware's id), cached like :meth:`recommend`."""
        fields = scenario.to_dict()
        fields["hardware"] = fields["hardware"]["id"]
        return self.recommend(**fields)

    def recommend_many(
        self, scenarios: Sequence[dict[str, Any]], *, batch_size: int = 10_000, errors: str = "raise"
    ) -> list[RecommendationPublic] | list[RecommendationPublic | ServiceError]:
        """Schedules for many scenarios: cached ones locally, each new shape once, in batches.

        The service answers each scenario on its own (``POST /v1/recommend/batch``). ``errors="raise"``:
        a refused scenario raises ``ServiceError`` (422; ``errors`` names every refused one's fields);
        ``errors="return"``: its place in the list holds that ``ServiceError`` (the status a single request
        gets: 422, or 404 for a hardware id nobody knows) and the others are answers. Error locations are
        the positions in ``scenarios``.
        """
        if errors not in ("raise", "return"):
            raise ValueError(f"errors must be 'raise' or 'return'; got {errors!r}")
        where = "POST /v1/recommend/batch"
        items: list[ScenarioIn | ServiceError] = []
        for i, s in enumerate(scenarios):
            try:
                items.append(_checked(ScenarioIn, s, where, loc=("body", "scenarios", i)))
            except ServiceError as err:
                items.append(err)
        keys = [
            (item.hardware, *item.cache_key()) if isinstance(item, ScenarioIn) else None for item in items
        ]
        answers: dict[tuple, RecommendationPublic | list[dict[str, Any]]] = {}
        new: dict[tuple, ScenarioIn] = {}
        for key, item in zip(keys, items, strict=True):
            if key is not None and key not in answers and key not in new:
                hit = self.cache.get(key)
                if hit is not None:
                    answers[key] = hit
                else:
                    new[key] = item  # type: ignore[assignment]  # a ScenarioIn where key is not None
        pending = list(new.items())
        for start in range(0, len(pending), batch_size):
            chunk = pending[start : start + batch_size]
            body = {"scenarios": [_body(item) for _, item in chunk]}
            result = RecommendationsPublic.model_validate(self._request("POST", "/v1/recommend/batch", body))
            for (key, _), item in zip(chunk, result.data, strict=True):
                if item.result is not None:
                    self.cache.put(key, item.result)
                    answers[key] = item.result
                else:
                    answers[key] = [e.model_dump() for e in item.errors or []]
        out: list[RecommendationPublic | ServiceError] = []
        for i, (key, item) in enumerate(zip(keys, items, strict=True)):
            answer = item if key is None else answers[key]
            out.append(_item_error(answer, i, where) if isinstance(answer, list) else answer)
        refused = [answer for answer in out if isinstance(answer, ServiceError)]
        if refused and errors == "raise":
            every = [e for err in refused for e in err.errors]
            message = f"{where}: {len(refused)} of {len(out)} scenarios refused: {error_line(every)}"
            raise ServiceError(message, status_code=422, detail=every)
        return out  # type: ignore[return-value]  # answers only, unless errors="return"

    def score(
        self,
        config: dict[str, Any],
        *,
        tp: int | None = None,
        tokens: Sequence[int],
        dtype: str = "bf16",
        hardware: str | None = None,
        name: str | None = None,
        mode: str = "eager",
    ) -> ScorePublic:
        """Score a Hugging Face model config (as ``ficco score``) at ``tp`` ranks (None: the hardware's GPU
        count)."""
        fields = dict(config=config, tp=tp, tokens=list(tokens), dtype=dtype, hardware=hardware, name=name)
        body = _checked(ScoreRequest, {**fields, "mode": mode}, "POST /v1/score").model_dump(
            exclude_none=True
        )
        return ScorePublic.model_validate(self._request("POST", "/v1/score", body))

    def fetch_table(
        self,
        hardware_id: str,
        *,
        tp: int,
        mode: str,
        dtype: str = "bf16",
        config: dict[str, Any] | None = None,
        shapes: Sequence[str] | None = None,
        cache_dir: str | Path | None = None,
        timeout_s: float = TABLE_TIMEOUT_S,
        allow_simulated: bool = False,
    ) -> ScheduleTableFile:
        """The served model's schedule table for one (tp, mode, dtype): ``GET /v1/tables/{hardware_id}``
        (the shape grid), or ``POST`` with a Hugging Face ``config`` or ``shapes`` (``op:n:k``).

        With ``cache_dir`` the table is kept on disk under its hardware fingerprint
        (``<cache_dir>/<hardware_id>/<fingerprint>/<table file>``) with its ETag; a later fetch sends
        ``If-None-Match`` and a 304 reads the file back. When the service cannot be reached, a cached
        table is used (with a warning); otherwise ``ServiceError``. ``timeout_s`` bounds each attempt
        (the server builds a table it has not built for this model version before, which takes seconds).
        ``allow_simulated``: a simulated model's table (marked simulated), as the service's query says.
        """
        request = {
            "tp": tp,
            "mode": mode,
            "dtype": dtype,
            **({"allow_simulated": True} if allow_simulated else {}),
        }
        posted = config is not None or shapes is not None
        if posted:
            request |= {"config": config, "shapes": list(shapes) if shapes is not None else None}
        index = None
        if cache_dir is not None:
            digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()[:16]
            index = Path(cache_dir).expanduser() / hardware_id / f"request-{digest}.json"
        cached = json.loads(index.read_text()) if index is not None and index.exists() else None
        headers = {"If-None-Match": cached["etag"]} if cached else None
        path = f"/v1/tables/{hardware_id}"
        try:
            if posted:
                response = self._send("POST", path, request, headers=headers, timeout_s=timeout_s)
            else:
                response = self._send("GET", path, headers=headers, params=request, timeout_s=timeout_s)
        except ServiceError as err:
            if cached is None or err.status_code is not None:
                raise
            log.warning("table service unreachable (%s); using the cached table %s", err, cached["path"])
            return ScheduleTableFile.read(index.parent / cached["path"])
        if response.status_code == 304 and cached is not None:
            return ScheduleTableFile.read(index.parent / cached["path"])
        table = ScheduleTableFile.from_dict(response.json(), f"{path} ({request})")
        if index is not None:
            written = table.write(index.parent / table.fingerprint.replace(":", "-"))
            relative = str(written.relative_to(index.parent))
            index.write_text(json.dumps({"etag": response.headers.get("etag"), "path": relative}))
        return table

    def models(self) -> ModelsPublic:
        """Registered models and the versions being served."""
        return ModelsPublic.model_validate(self._request("GET", "/v1/models"))

    def ready(self) -> ReadyPublic:
        """Readiness (raises ``ServiceError`` with status 503 while no model is loaded, after the retries)."""
        return ReadyPublic.model_validate(self._request("GET", "/readyz"))

    # Transport ---------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        """Send with retries; return the decoded JSON of a 2xx answer or raise ``ServiceError``."""
        return self._send(method, path, body).json()

    def _send(
        self, method: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None,
        params: dict[str, Any] | None = None, timeout_s: float | None = None,
    ) -> httpx.Response:  # fmt: skip
        """Send with retries; return a 2xx or 3xx answer or raise ``ServiceError``."""
        last, retry_after = "", None
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(self._wait_s(attempt, retry_after))
            retry_after = None
            try:
                timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else httpx.Timeout(timeout_s)
                response = self._http.request(
                    method, path, json=body, headers=headers, params=params, timeout=timeout
                )
            except httpx.TransportError as err:
                last = f"{type(err).__name__}: {err}"
                continue
            if response.status_code in RETRY_STATUS:
                last = f"HTTP {response.status_code}: {_message(_detail(response))}"
                retry_after = response.headers.get("retry-after")
                continue
            if response.is_error:
                detail = _detail(response)
                known = _answer_json(response).get("known_ids") or ()
                raise ServiceError(
                    f"{method} {path} answered {response.status_code}: {_message(detail)}",
                    status_code=response.status_code,
                    detail=detail,
                    known_ids=known,
                )
            return response
        raise ServiceError(f"{method} {path} failed after {self.retries + 1} attempts; last: {last}")

    def _wait_s(self, attempt: int, retry_after: str | None) -> float:
        """Seconds before retry ``attempt`` (1-based): the server's Retry-After, else exponential backoff."""
        if retry_after is not None and retry_after.isdigit():
            return min(float(retry_after), self.max_backoff_s)
        return min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)


def _body(item: ScenarioIn) -> dict[str, Any]:
    return item.model_dump(exclude_none=True)


M = TypeVar("M", bound=BaseModel)


def _checked(schema: type[M], fields: Any, where: str, *, loc: Sequence[str | int] = ("body",)) -> M:
    """``fields`` as the request ``schema`` (the server's own); ``ServiceError`` (422, the server's error
    items located at ``loc``) for a request the server would refuse so, before it is sent."""
    try:
        return schema.model_validate(fields)
    except ValidationError as err:
        errors = [from_pydantic({**e, "loc": (*loc, *e["loc"])}) for e in err.errors()]
        message = (
            f"{where} refused before sending (the service answers such a request 422): {error_line(errors)}"
        )
        raise ServiceError(message, status_code=422, detail=errors) from None


def _item_error(errors: list[dict[str, Any]], index: int, where: str) -> ServiceError:
    """A refused batch item's ``errors`` (located at whichever position it was sent at) as the
    ``ServiceError`` of scenario ``index`` of the caller's list, with a single request's status."""
    moved = []
    for e in errors:
        loc = ["body", "scenarios", index, *e["loc"][3:]]
        moved.append({**e, "loc": loc, "field": ".".join(str(part) for part in loc[1:])})
    status = 404 if any(e["type"] == "unknown_hardware" for e in moved) else 422
    return ServiceError(
        f"{where} refused scenario {index}: {error_line(moved)}", status_code=status, detail=moved
    )


def _answer_json(response: httpx.Response) -> dict[str, Any]:
    """The answer's JSON object, or ``{}`` (an answer of a proxy in front of the service may be text)."""
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _detail(response: httpx.Response) -> Any:
    """The answer's ``detail`` (the service's errors), else its text (a proxy's answer) whole."""
    return _answer_json(response).get("detail", response.text)


def _message(detail: Any) -> str:
    """An answer's ``detail`` as one line: error items as ``field: msg; ...``, a sentence as it is."""
    if isinstance(detail, list) and all(isinstance(e, dict) for e in detail):
        return error_line(detail)
    return " ".join(str(detail).split())
