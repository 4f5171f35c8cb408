"""GET /healthz (the process is alive) and /readyz (a model is loaded; the last reload error, if any)."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from ficco.service.deps import SettingsDep, StoreDep
from ficco.service.schemas import HealthPublic, ReadyPublic

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthPublic)
async def read_health() -> HealthPublic:
    """Liveness: answers while the process runs."""
    return HealthPublic()


@router.get("/readyz", response_model=ReadyPublic, responses={503: {"model": ReadyPublic}})
async def read_ready(store: StoreDep, settings: SettingsDep, response: Response) -> ReadyPublic:
    """Readiness: 200 once a model is loaded, else 503; shows the last failed reload either way."""
    serving = {hw: model.version for hw, model in store.served.items()}
    if not serving:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return ReadyPublic(
        ready=bool(serving),
        serving=serving,
        default_hardware=settings.DEFAULT_HARDWARE,
        last_reload_error=store.last_reload_error,
    )
