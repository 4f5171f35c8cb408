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
from typing import Any

import httpx

from ficco.features import Scenario
from ficco.features.schedule_table import ScheduleTableFile
from ficco.service.cache import RecommendationCache
from ficco.service.schemas import (
    ModelsPublic,
    ReadyPublic,
    RecommendationPublic,
    RecommendationsPublic,
    ScenarioIn,
    ScorePublic,
)

log = logging.getLogger(__name__)

TABLE_TIMEOUT_S = 120.0
"""Longest one attempt of :meth:`ServiceClient.fetch_table` waits, seconds (start-up, not a step)."""
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
"""Answers worth asking again: overload, or the server (or a proxy in front of it) failing."""


class ServiceError(RuntimeError):
    """The service refused a request (``status_code`` and its ``detail``) or could not be reached."""

    def __init__(self, message: str, *, status_code: int | None = None, detail: Any = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.detail = detail


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
        item = ScenarioIn(**scenario)
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
        self, scenarios: Sequence[dict[str, Any]], *, batch_size: int = 10_000
    ) -> list[RecommendationPublic]:
        """Schedules for many scenarios: cached ones locally, each new shape once, in batches."""
        items = [ScenarioIn(**s) for s in scenarios]
        keys = [(item.hardware, *item.cache_key()) for item in items]
        answers: dict[tuple, RecommendationPublic] = {}
        new: dict[tuple, ScenarioIn] = {}
        for key, item in zip(keys, items, strict=True):
            if key not in answers and key not in new:
                hit = self.cache.get(key)
                if hit is not None:
                    answers[key] = hit
                else:
                    new[key] = item
        pending = list(new.items())
        for start in range(0, len(pending), batch_size):
            chunk = pending[start : start + batch_size]
            body = {"scenarios": [_body(item) for _, item in chunk]}
            result = RecommendationsPublic.model_validate(self._request("POST", "/v1/recommend/batch", body))
            for (key, _), answer in zip(chunk, result.data, strict=True):
                self.cache.put(key, answer)
                answers[key] = answer
        return [answers[key] for key in keys]

    def score(
        self,
        config: dict[str, Any],
        *,
        tp: int,
        tokens: Sequence[int],
        dtype: str = "bf16",
        hardware: str | None = None,
        name: str | None = None,
    ) -> ScorePublic:
        """Score a Hugging Face model config (as ``ficco score``)."""
        body = dict(config=config, tp=tp, tokens=list(tokens), dtype=dtype, hardware=hardware, name=name)
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
    ) -> ScheduleTableFile:
        """The served model's schedule table for one (tp, mode, dtype): ``GET /v1/tables/{hardware_id}``
        (the shape grid), or ``POST`` with a Hugging Face ``config`` or ``shapes`` (``op:n:k``).

        With ``cache_dir`` the table is kept on disk under its hardware fingerprint
        (``<cache_dir>/<hardware_id>/<fingerprint>/<table file>``) with its ETag; a later fetch sends
        ``If-None-Match`` and a 304 reads the file back. When the service cannot be reached, a cached
        table is used (with a warning); otherwise ``ServiceError``. ``timeout_s`` bounds each attempt
        (the server builds a table it has not built for this model version before, which takes seconds).
        """
        request = {"tp": tp, "mode": mode, "dtype": dtype}
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
                last = f"HTTP {response.status_code}: {response.text[:200]}"
                retry_after = response.headers.get("retry-after")
                continue
            if response.is_error:
                detail = _detail(response)
                raise ServiceError(
                    f"{method} {path} answered {response.status_code}: {detail}",
                    status_code=response.status_code,
                    detail=detail,
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


def _detail(response: httpx.Response) -> Any:
    try:
        return response.json().get("detail")
    except (ValueError, AttributeError):
        return response.text[:500]
