"""GET /healthz (the process is alive) and /readyz (a model is loaded and the batch workers are warm; the
last reload error, if any)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status

from ficco.service.deps import SettingsDep, StoreDep
from ficco.service.schemas import HealthPublic, ReadyPublic

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthPublic)
async def read_health() -> HealthPublic:
    """Liveness: answers while the process runs."""
    return HealthPublic()


@router.get("/readyz", response_model=ReadyPublic, responses={503: {"model": ReadyPublic}})
async def read_ready(
    request: Request, store: StoreDep, settings: SettingsDep, response: Response
) -> ReadyPublic:
    """Readiness: 200 once a model is loaded and every batch worker has loaded and warmed up, else 503;
    shows the last failed reload either way."""
    serving = {hw: model.version for hw, model in store.served.items()}
    workers = getattr(request.app.state, "batch_workers", None)  # None: the lifespan has not run
    workers_ready = workers is not None and workers.ready
    if not (serving and workers_ready):
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return ReadyPublic(
        ready=bool(serving) and workers_ready,
        serving=serving,
        batch_workers_ready=workers_ready,
        default_hardware=settings.DEFAULT_HARDWARE,
        last_reload_error=store.last_reload_error,
    )
