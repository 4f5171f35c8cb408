"""Service settings: one pydantic-settings class read from ``FICCO_*`` environment variables.

Precedence: command-line options of ``ficco serve`` > environment > the defaults below.
"""

from __future__ import annotations

from pathlib import Path

from ficco.features import DEFAULT_HARDWARE_ID
from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MIN_TOKEN_CHARS = 16


class Settings(BaseSettings):
    """Everything the service reads from its environment (``FICCO_MODEL_ROOT``, ``FICCO_PORT``, ...)."""

    model_config = SettingsConfigDict(env_prefix="FICCO_", extra="ignore", frozen=True)

    MODEL_ROOT: Path = Path("models")
    """Model registry root: ``<root>/<hardware_id>/<version>/`` and ``<root>/<hardware_id>/CURRENT``."""
    DEFAULT_HARDWARE: str = DEFAULT_HARDWARE_ID
    """Hardware id used when a request names none, and the model ``ficco serve`` makes sure exists."""
    DATASET_ROOT: Path = Path("datasets")
    """Shipped datasets: ``ficco serve`` trains ``<root>/<DEFAULT_HARDWARE>`` when the registry is empty."""
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
    PREDICT_THREADS: int = Field(default=1, ge=1, le=256)
    """XGBoost threads per prediction. 1 suits single-scenario requests: a second thread gains nothing on
    one row and, on a busy 2-core machine, waits to be scheduled (10x the latency, measured)."""
    BATCH_THREADS: int = Field(default=2, ge=1, le=64)
    """Threads a large batch (>= 2,048 new scenarios) is split over; the machine's cores is a good value."""
    CACHE_SIZE: int = Field(default=4096, ge=0)
    """Recommendations remembered per loaded model (LRU, keyed by the request's scenario); 0 = off."""
    LOG_LEVEL: str = "info"
    """Log level of the ``service`` loggers and uvicorn."""
    ACCESS_LOG: bool = False
    """Log one line per request (uvicorn's access log). Off by default: /metrics counts requests per
    endpoint and status, and a line per request is a write system call on every request."""

    @field_validator("RELOAD_TOKEN")
    @classmethod
    def _check_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value().strip()) < MIN_TOKEN_CHARS:
            raise ValueError(
                f"FICCO_RELOAD_TOKEN must be at least {MIN_TOKEN_CHARS} non-blank characters; "
                f"got {len(value.get_secret_value().strip())}. Unset it to turn the reload endpoint off."
            )
        return value


settings = Settings()
"""The process-wide settings; ``service.main.create_app`` and the commands accept a replacement."""
