"""The FastAPI app: routers, error handlers, the body limit and metrics middleware, and the lifespan.

The lifespan loads every registered hardware's current model once, from a private snapshot of the
registry's files (``ModelStore.snapshot``), starts the batch worker processes and their supervisor, the
registry watcher and the table prefetch (each where its setting is on; the table worker starts with its
first job), and stops them (and removes the snapshot) at shutdown.
``uvicorn ficco.service.main:app`` serves the app built from the environment; ``ficco serve`` builds one
from its options (``create_app``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from ficco import __version__
from ficco.service.core.admission import BatchGate, BusyError, ClientRate
from ficco.service.core.config import Settings, load_settings
from ficco.service.core.limits import BodyLimitMiddleware
from ficco.service.core.metrics import Metrics, MetricsMiddleware
from ficco.service.core.offload import add_batch_components
from ficco.service.core.store import ModelStore
from ficco.service.core.worker_pool import WorkerLostError, WorkerOptions, WorkerPool, worker_cpus
from ficco.service.errors import InvalidFieldsError, NoModelError, UnknownHardwareError, from_pydantic
from ficco.service.routes import health, metrics, models, recommend, score, tables
from ficco.service.tables import GridTables, TableCache, prefetch

log = logging.getLogger(__name__)


def _install_error_handlers(app: FastAPI) -> None:
    """Map the service's errors to status codes: 422 (one item shape), 404 with the known ids, 429, 503
    (no model; a batch worker lost during a job, with Retry-After)."""

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [from_pydantic(e) for e in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)

    @app.exception_handler(InvalidFieldsError)
    async def _invalid_fields(request: Request, exc: InvalidFieldsError) -> JSONResponse:
        return JSONResponse({"detail": exc.errors}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)

    @app.exception_handler(UnknownHardwareError)
    async def _unknown_hardware(request: Request, exc: UnknownHardwareError) -> JSONResponse:
        body = {"detail": str(exc), "known_ids": exc.known_ids}
        return JSONResponse(body, status_code=status.HTTP_404_NOT_FOUND)

    @app.exception_handler(BusyError)
    async def _busy(request: Request, exc: BusyError) -> JSONResponse:
        headers = {"Retry-After": str(exc.retry_after_s)}
        return JSONResponse(
            {"detail": str(exc)}, status_code=status.HTTP_429_TOO_MANY_REQUESTS, headers=headers
        )

    @app.exception_handler(NoModelError)
    async def _no_model(request: Request, exc: NoModelError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_503_SERVICE_UNAVAILABLE)

    @app.exception_handler(WorkerLostError)
    async def _worker_lost(request: Request, exc: WorkerLostError) -> JSONResponse:
        return JSONResponse(
            {"detail": str(exc)},
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": "1"},
        )


DOCS_ASSETS = "/docs/assets"
"""Where /docs loads Swagger UI from: this server (the ``swagger-ui-bundle`` package), not a CDN, so the
page works offline and in a closed network."""


def _install_docs(app: FastAPI) -> None:
    """Serve ``/docs`` with Swagger UI's files from this server."""
    from swagger_ui_bundle import swagger_ui_path

    app.mount(DOCS_ASSETS, StaticFiles(directory=swagger_ui_path), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} - docs",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png",
        )


def _install_openapi(app: FastAPI) -> None:
    """The OpenAPI document with the schemas that only the batch bodies refer to (``add_batch_components``:
    FastAPI does not read those bodies, so it does not list their parts)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = add_batch_components(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _worker_options(settings: Settings, store: ModelStore) -> WorkerOptions:
    """What the batch workers need: the registry the store loads from (its snapshot: the bytes it serves),
    the batch settings (XGBoost threads: ``FICCO_BATCH_PREDICT_THREADS``, else one per worker CPU)."""
    return WorkerOptions(
        model_root=str(store.loads_from),
        cache_size=store.cache_size,
        threads=settings.BATCH_PREDICT_THREADS or len(worker_cpus(settings.WORKER_CPUS)),
        bulk_threads=store.bulk_threads,
        max_batch=settings.MAX_BATCH,
        default_hardware=settings.DEFAULT_HARDWARE,
        priority=settings.BATCH_PRIORITY,
        cpus=settings.WORKER_CPUS,
        log_level=settings.LOG_LEVEL,
    )


def create_app(settings: Settings | None = None, *, store: ModelStore | None = None) -> FastAPI:
    """Build the app from ``settings`` (default: the environment); ``store`` replaces the registry's (the
    caller then owns it and closes it)."""
    settings = settings or load_settings(Settings)
    owns_store = store is None
    store = store or ModelStore(
        settings.MODEL_ROOT,
        cache_size=settings.CACHE_SIZE,
        threads=settings.PREDICT_THREADS,
        bulk_threads=settings.BATCH_THREADS,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        sys.setswitchinterval(settings.GIL_SWITCH_INTERVAL_S)  # see Settings.GIL_SWITCH_INTERVAL_S
        app.state.batch_gate = BatchGate(
            concurrency=settings.BATCH_CONCURRENCY,
            queue=settings.BATCH_QUEUE,
            retry_after_s=settings.BATCH_RETRY_AFTER_S,
        )
        app.state.score_gate = BatchGate(  # single scores: their own count, the same workers
            concurrency=settings.BATCH_CONCURRENCY,
            queue=settings.SCORE_QUEUE,
            retry_after_s=settings.BATCH_RETRY_AFTER_S,
        )
        if owns_store:  # a private copy of each version it loads, for the workers (ModelStore.snapshot)
            store.snapshot = Path(tempfile.mkdtemp(prefix="ficco-models-"))
        # The workers start first, with the versions CURRENT names (copied into the store's snapshot),
        # and load and warm up in their own processes while this one loads the same versions.
        app.state.batch_workers = workers = WorkerPool(
            _worker_options(settings, store), count=settings.BATCH_CONCURRENCY
        )
        await workers.start(await asyncio.to_thread(store.current_versions))
        # Schedule tables: one worker of their own, started by its first job (service.tables)
        app.state.tables = TableCache(settings.TABLE_CACHE_MB << 20)
        app.state.table_rate = ClientRate(settings.TABLE_REQUESTS_PER_S, what="schedule tables")
        app.state.table_gate = BatchGate(
            concurrency=1, queue=settings.TABLE_QUEUE, retry_after_s=settings.BATCH_RETRY_AFTER_S
        )
        app.state.table_workers = WorkerPool(_worker_options(settings, store), count=1)
        outcomes = await asyncio.to_thread(store.refresh)
        log.info("models under %s: %s", store.root, outcomes or "none registered")
        gc.freeze()  # the loaded models stay for life: shorter collections (docs/service.md#settings)
        tasks = [asyncio.create_task(workers.supervise(lambda: store.versions))]
        if settings.RELOAD_POLL_S > 0:
            tasks.append(asyncio.create_task(store.watch(settings.RELOAD_POLL_S)))
        if settings.TABLE_PREFETCH:  # /readyz waits for the grid tables of the versions served now
            app.state.grid_tables = GridTables()
            grid_table = functools.partial(tables.answer_grid_table, app.state)  # under GET's ETag
            progress = prefetch(lambda: store.served, grid_table, app.state.grid_tables)
            tasks.append(asyncio.create_task(progress))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await workers.close()
            await app.state.table_workers.close()
            if owns_store:
                store.close()
                if store.snapshot is not None:
                    shutil.rmtree(store.snapshot, ignore_errors=True)

    app = FastAPI(
        title="ficco recommendation service",
        version=__version__,
        description="Which communication/GEMM overlap schedule to run, per scenario, from a learned model.",
        lifespan=lifespan,
        docs_url=None,  # _install_docs serves it without a CDN
        redoc_url=None,  # ReDoc has no offline bundle here; /docs documents the same schema
    )
    app.state.settings = settings
    app.state.store = store
    app.state.metrics = Metrics()
    for module in (recommend, score, models, health, metrics, tables):
        app.include_router(module.router)
    _install_error_handlers(app)
    _install_docs(app)
    _install_openapi(app)
    app.add_middleware(recommend.RecommendFastPath)  # innermost: the body arrives limited and whole
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.MAX_BODY_BYTES)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)  # outermost: times 413s too
    return app


def __getattr__(name: str) -> FastAPI:
    """``app``: the app configured from the environment, for ``uvicorn ficco.service.main:app``; built on
    first use, so importing this module never reads (or fails on) the environment."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    global app
    app = create_app()
    return app
