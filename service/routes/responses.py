"""Error responses the routes declare in the OpenAPI document (status -> body schema)."""

from __future__ import annotations

from typing import Any

from ficco.service.core.offload import batch_body
from ficco.service.schemas import ErrorPublic, UnknownHardwarePublic, ValidationErrorPublic

BODY_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorPublic, "description": "The body cannot be decoded at all (e.g. not UTF-8)."},
    413: {"model": ErrorPublic, "description": "Request body over FICCO_MAX_BODY_BYTES."},
    422: {
        "model": ValidationErrorPublic,
        "description": "A field is invalid: where, the value, what is allowed.",
    },
}
MODEL_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": UnknownHardwarePublic, "description": "No loaded model can answer this hardware id."},
    503: {"model": ErrorPublic, "description": "No model is loaded yet."},
}
BUSY_ERRORS: dict[int | str, dict[str, Any]] = {
    429: {
        "model": ErrorPublic,
        "description": "Too many batches running or waiting; retry after the Retry-After header's seconds.",
    },
    503: {
        "model": ErrorPublic,
        "description": "No model is loaded yet, or the batch worker process exited during this batch "
        "(Retry-After; the next batch starts a new one).",
    },
}


def batch_route(answer: type[Any], body: type[Any]) -> dict[str, Any]:
    """The ``router.post`` arguments of a batch route answering ``answer``: its body ``body`` is read by the
    batch worker (``service.core.offload``), so the OpenAPI document gets it from here, and the route may be
    busy (``BUSY_ERRORS``)."""
    extra = {"requestBody": batch_body(body)}
    return {"response_model": answer, "responses": BUSY_ERRORS, "openapi_extra": extra}
