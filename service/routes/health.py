"""GET /healthz (the process is alive) and /readyz (a model is loaded, the batch workers are warm and the
grid tables of the start-up versions are ready; the last reload error, if any)."""

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
    """Readiness: 200 once a model is loaded, every batch worker has loaded and warmed up and (with
    ``FICCO_TABLE_PREFETCH``) the grid tables of the versions served at start-up are ready, else 503; shows
    the grid tables pending and the last failed reload either way."""
    serving = {hw: model.version for hw, model in store.served.items()}
    workers = getattr(request.app.state, "batch_workers", None)  # None: the lifespan has not run
    workers_ready = workers is not None and workers.ready
    grid = getattr(request.app.state, "grid_tables", None)  # None: no prefetch (tables built on request)
    tables_ready = grid is None or grid.first_pass_done
    ready = bool(serving) and workers_ready and tables_ready
    if not ready:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return ReadyPublic(
        ready=ready,
        serving=serving,
        batch_workers_ready=workers_ready,
        grid_tables_ready=tables_ready,
        grid_tables_pending=sorted(grid.pending) if grid is not None else [],
        default_hardware=settings.DEFAULT_HARDWARE,
        last_reload_error=store.last_reload_error,
    )
