"""Dependency aliases for the routes: the settings, the model store, a served-model snapshot, metrics.

The dependencies are ``async`` on purpose: FastAPI runs plain ``def`` dependencies in its thread pool,
a thread hop per dependency per request for what is an attribute read.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ficco.service.core.config import Settings
from ficco.service.core.metrics import Metrics
from ficco.service.core.store import ModelStore, ServedModel


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_store(request: Request) -> ModelStore:
    return request.app.state.store


async def get_served(request: Request) -> Mapping[str, ServedModel]:
    """One snapshot of the served models: a reload during the request does not change it."""
    return request.app.state.store.served


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[ModelStore, Depends(get_store)]
ServedDep = Annotated[Mapping[str, ServedModel], Depends(get_served)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]


_bearer = HTTPBearer(auto_error=False, description="FICCO_RELOAD_TOKEN, as 'Authorization: Bearer <token>'.")
"""Declares the bearer scheme in the OpenAPI document; the checks below give the service's own errors."""


async def check_reload_token(
    settings: SettingsDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """404 when no reload token is configured (endpoint off); 401 without a bearer token; 403 if wrong."""
    if settings.RELOAD_TOKEN is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "Not Found")
    token = credentials.credentials if credentials is not None else ""
    if not token:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "reload needs an 'Authorization: Bearer <FICCO_RELOAD_TOKEN>' header",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not secrets.compare_digest(token.encode(), settings.RELOAD_TOKEN.get_secret_value().encode()):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "wrong reload token")


ReloadAuth = Depends(check_reload_token)
"""Use as ``dependencies=[ReloadAuth]`` on the reload route."""
