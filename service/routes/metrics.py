"""GET /metrics: Prometheus text exposition."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from ficco.service.deps import MetricsDep, StoreDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def read_metrics(metrics: MetricsDep, store: StoreDep) -> Response:
    """Request counts and latency histograms per endpoint, and the served model versions."""
    return Response(metrics.render(store), media_type=CONTENT_TYPE_LATEST)
