"""Prometheus metrics: request counts and latency per endpoint, and which model versions are served.

Each app owns its own ``CollectorRegistry`` (several apps in one test process do not collide).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ficco.service.core.middleware import HttpMiddleware
from ficco.service.core.store import ModelStore

CLIENT_CLOSED = 499
"""Status counted for a request whose client disconnected before any answer (nginx's convention)."""

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Histogram buckets, seconds: fine below 5 ms, where a single recommendation should land."""


class Metrics:
    """The service's metric families in one registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "ficco_http_requests",
            "HTTP requests answered.",
            ["method", "endpoint", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "ficco_http_request_duration_seconds",
            "Time from request to the last response byte sent.",
            ["method", "endpoint"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.rejected = Counter(
            "ficco_http_rejected",
            "Connections refused before the app saw the request: header_too_large (431), header_timeout, "
            "body_timeout (408), connections_per_client.",
            ["reason"],
            registry=self.registry,
        )
        self.model_info = Gauge(
            "ficco_model_info",
            "1 for each (hardware id, model version) being served.",
            ["hardware_id", "version"],
            registry=self.registry,
        )
        self.reload_failed = Gauge(
            "ficco_model_last_reload_failed",
            "1 if the latest model load failed (see /readyz).",
            registry=self.registry,
        )
        self._children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        """The request counter's and latency histogram's children by (method, endpoint, status)."""

    def reject(self, reason: str) -> None:
        """Count one connection refused before the app saw its request (``core.protocol``): headers too
        large (431) or too slow, a body too slow (408), too many connections from one client."""
        self.rejected.labels(reason).inc()

    def observe(self, method: str, endpoint: str, status: int, seconds: float) -> None:
        """Count one answered request and record its latency."""
        key = (method, endpoint, status)
        children = self._children.get(key)
        if children is None:  # labels() looks the child up under a lock: once per label set is enough
            children = self._children[key] = (
                self.requests.labels(method, endpoint, str(status)),
                self.latency.labels(method, endpoint),
            )
        children[0].inc()
        children[1].observe(seconds)

    def render(self, store: ModelStore) -> bytes:
        """The text exposition, with the model gauges set from ``store`` at scrape time."""
        self.model_info.clear()
        served: Mapping = store.served
        for hw, model in served.items():
            self.model_info.labels(hw, model.version).set(1)
        self.reload_failed.set(store.last_reload_error is not None)
        return generate_latest(self.registry)


class MetricsMiddleware(HttpMiddleware):
    """Pure ASGI middleware timing every HTTP request; the endpoint label is the route's path template."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics) -> None:
        super().__init__(app)
        self.metrics = metrics

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        start, status = time.perf_counter(), 500

        async def watch_receive() -> Message:
            nonlocal status
            message = await receive()
            if message["type"] == "http.disconnect" and status == 500:
                status = CLIENT_CLOSED  # the client left before an answer: not a server error
            return message

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, watch_receive, send_status)
        finally:
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or "unrouted"
            self.metrics.observe(scope["method"], endpoint, status, time.perf_counter() - start)
