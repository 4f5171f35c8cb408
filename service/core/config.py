"""Service settings: pydantic-settings classes read from ``FICCO_*`` environment variables.

``ModelSettings`` is what answering needs (registry, hardware, threads): ``ficco recommend`` and
``ficco score`` read only it, so a bad server-only variable (``FICCO_PORT``) does not break them.
``Settings`` adds the server's. Nothing is read at import: ``load_settings`` reads the environment and
turns a bad value into one ``SettingsError`` line naming the variable.

Precedence: command-line options > environment > the defaults below.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ficco.features import DEFAULT_HARDWARE_ID
from ficco.files import model_root
from ficco.service.core.worker_pool import Priority, worker_cpus

MIN_TOKEN_CHARS = 16
ENV_PREFIX = "FICCO_"
REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout (or, installed, the ``ficco`` package directory): where ``datasets/`` is looked for."""


class SettingsError(ValueError):
    """A setting with a bad value; the message is one line naming the variable (and option)."""


class ModelSettings(BaseSettings):
    """What answering reads from the environment: the registry, the default hardware, threads, cache."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    MODEL_ROOT: Path = Field(default_factory=model_root)
    """Model registry root (``<root>/<hardware_id>/<version>/``, ``<root>/<hardware_id>/CURRENT``); default:
    the registry ``ficco train`` writes, ``models/`` at the repository root."""
    DEFAULT_HARDWARE: str = DEFAULT_HARDWARE_ID
    """Hardware id used when a request names none, and the model ``ficco serve`` makes sure exists."""
    DATASET_ROOT: Path = REPO_ROOT / "datasets"
    """Shipped datasets: ``ficco serve`` trains ``<root>/<DEFAULT_HARDWARE>`` when the registry is empty."""
    PREDICT_THREADS: int = Field(default=1, ge=1, le=256)
    """XGBoost threads per prediction (why 1: docs/service.md#settings)."""
    BATCH_THREADS: int = Field(default=1, ge=1, le=64)
    """Threads a large list of scenarios (>= 2,048 new ones: a batch in its worker process, ``ficco score``)
    is split over."""
    CACHE_SIZE: int = Field(default=4096, ge=0)
    """Recommendations remembered per loaded model (LRU, keyed by the request's scenario); 0 = off."""
    LOG_LEVEL: str = "info"
    """Log level of the ``service`` loggers and uvicorn."""


class Settings(ModelSettings):
    """Everything the server reads from its environment (``FICCO_MODEL_ROOT``, ``FICCO_PORT``, ...)."""

    HOST: str = "127.0.0.1"
    """Interface uvicorn binds (the container uses 0.0.0.0)."""
    PORT: int = Field(default=8000, ge=1, le=65535)
    """TCP port uvicorn listens on."""
    MAX_BODY_BYTES: int = Field(default=4 << 20, ge=1024)
    """Largest request body, bytes (4 MiB holds 10,000 scenarios); larger bodies get 413."""
    MAX_BATCH: int = Field(default=10_000, ge=1)
    """Most scenarios in one ``POST /v1/recommend/batch``; more get 422."""
    RELOAD_TOKEN: SecretStr | None = None
    """Bearer token for ``POST /v1/models/reload``; unset turns the endpoint off (404)."""
    RELOAD_POLL_S: float = Field(default=2.0, ge=0.0)
    """Seconds between checks of ``<root>/<hw>/CURRENT`` for a newly promoted model; 0 turns polling off."""
    BATCH_CONCURRENCY: int = Field(default=1, ge=1, le=64)
    """Batches answered at once: this many batch worker processes (``service.core.worker_pool``) run beside
    the server, each with the served models loaded."""
    BATCH_QUEUE: int = Field(default=4, ge=0, le=1024)
    """Batches that may wait for a slot; more get 429 with Retry-After."""
    SCORE_QUEUE: int = Field(default=32, ge=0, le=1024)
    """Single ``POST /v1/score`` requests that may wait for a batch worker, counted apart from batches; more
    get 429."""
    BATCH_RETRY_AFTER_S: int = Field(default=1, ge=1, le=3600)
    """The Retry-After (seconds) of a 429."""
    BATCH_PRIORITY: Priority = "idle"
    """CPU priority of the batch workers: ``idle`` (Linux ``SCHED_IDLE``: only CPU time that normal-priority
    work leaves idle), ``low`` (``nice 19``) or ``normal`` (docs/service.md#batches)."""
    WORKER_CPUS: str = "spare"
    """CPUs the batch and table workers run on once warm: ``spare``, ``all`` or a list such as ``1,3-5``
    (``worker_pool.worker_cpus``)."""
    BATCH_PREDICT_THREADS: int = Field(default=0, ge=0, le=256)
    """XGBoost threads per prediction in the batch and table workers; 0: one per CPU of ``WORKER_CPUS``
    (docs/service.md#settings)."""
    TABLE_QUEUE: int = Field(default=8, ge=0, le=1024)
    """Schedule tables that may wait for the table worker (one builds at a time, ``service.tables``); more
    get 429 with Retry-After."""
    TABLE_CACHE_MB: int = Field(default=64, ge=1, le=1 << 16)
    """Memory for built schedule tables (gzip-compressed), least recently used out first."""
    TABLE_REQUESTS_PER_S: float = Field(default=10.0, ge=0.0, le=1e6)
    """Schedule-table requests (GET and POST ``/v1/tables``) one client address may make a second, in
    bursts of twice that; more get 429 with Retry-After (0: no limit, e.g. behind a proxy)."""
    TABLE_PREFETCH: bool = True
    """Build the tables ``GET /v1/tables`` serves (per world size, mode and training dtype of each model) as
    soon as a model version loads, in the table worker."""
    GIL_SWITCH_INTERVAL_S: float = Field(default=0.0005, gt=0.0, le=0.1)
    """``sys.setswitchinterval`` of the server process: how long another thread of it (a model reload
    compiling its forests) may hold the GIL before the event loop gets it (why not Python's 5 ms:
    docs/service.md#settings)."""
    HEADER_TIMEOUT_S: float = Field(default=10.0, gt=0.0, le=3600.0)
    """Seconds a connection may take to send a request's headers (after opening, or after its previous
    response) before it is closed."""
    MAX_HEADER_BYTES: int = Field(default=16384, ge=1024, le=1 << 20)
    """Longest request line and headers, bytes (h11's default); longer ones get 431 and the connection
    is closed."""
    MAX_HEADERS: int = Field(default=100, ge=8, le=10_000)
    """Most header lines of a request (Apache's LimitRequestFields default); more get 431."""
    BODY_TIMEOUT_S: float = Field(default=30.0, gt=0.0, le=3600.0)
    """Seconds a request's body may take to arrive after its headers (4 MiB at 1 Mbit/s fits); a slower
    or never-ending body gets 408 and the connection is closed."""
    MAX_CONNECTIONS_PER_CLIENT: int = Field(default=256, ge=0, le=1_000_000)
    """Connections one client address may hold open at once; a further one is closed at once (0: no
    limit, for a server behind a proxy that makes every client one address)."""
    MAX_CONNECTIONS: int = Field(default=2048, ge=16, le=1_000_000)
    """Connections and requests in progress at once (uvicorn's ``limit_concurrency``); beyond, 503."""
    SEND_TIMEOUT_S: float = Field(default=30.0, gt=0.0, le=3600.0)
    """Seconds a batch answer may take to be read by its client; past it the connection is closed and the
    answer's memory freed (an unread answer holds its admission slot until then: ``FICCO_BATCH_QUEUE``)."""
    ACCESS_LOG: bool = False
    """Log one line per request (uvicorn's access log; off: /metrics counts requests, docs/service.md)."""

    @field_validator("RELOAD_TOKEN")
    @classmethod
    def _check_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value().strip()) < MIN_TOKEN_CHARS:
            raise ValueError(
                f"FICCO_RELOAD_TOKEN must be at least {MIN_TOKEN_CHARS} non-blank characters; "
                f"got {len(value.get_secret_value().strip())}. Unset it to turn the reload endpoint off."
            )
        return value

    @field_validator("WORKER_CPUS")
    @classmethod
    def _check_cpus(cls, value: str) -> str:
        worker_cpus(value)  # ValueError naming what is allowed
        return value


S = TypeVar("S", bound=ModelSettings)


def load_settings(cls: type[S], **overrides: Any) -> S:
    """``cls`` from the environment with the given ``overrides`` (command-line options; None = not given).

    Raises ``SettingsError`` naming the first bad variable, e.g. ``FICCO_PORT (--port): Input should be a
    valid integer (got 'abc')``.
    """
    given = {key: value for key, value in overrides.items() if value is not None}
    try:
        return cls(**given)
    except ValidationError as err:
        first = err.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "?"
        option = f" (--{name.lower().replace('_', '-')})" if name in given else ""
        msg = str(first["msg"]).removeprefix("Value error, ")
        raise SettingsError(f"{ENV_PREFIX}{name}{option}: {msg} (got {first.get('input')!r})") from None
