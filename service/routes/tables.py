"""GET and POST /v1/tables/{hardware_id}: the served model's schedule tables (features.schedule_table).

A runtime fetches its table once at start-up and caches it on disk (``ServiceClient.fetch_table``), never
per step. Every answer carries an ``ETag`` built from the model version, the hardware fingerprint and the
request (world size, mode, dtype, shapes); a request whose ``If-None-Match`` names it gets 304 and no body.
A promoted model (a new version) changes the ETag. GET builds the table for the dense shape grid
(``training.export.grid_shapes``); POST for the layers of a posted Hugging Face config, or listed shapes.
Tables are built once per (model version, request) and kept in memory.
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request, Response, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ficco.service.deps import ServedDep
from ficco.service.errors import InvalidFieldsError, UnknownHardwareError, field_error
from ficco.service.routes.responses import BODY_ERRORS, MODEL_ERRORS

TABLE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The table (format features.schedule_table), with its ETag."},
    304: {"description": "Not modified: If-None-Match names the current ETag."},
    **BODY_ERRORS,
    **MODEL_ERRORS,
}
MAX_SHAPES = 1024
"""Most shapes one POST may list."""

router = APIRouter(prefix="/v1/tables", tags=["tables"], responses=TABLE_RESPONSES)

_LOCK = threading.Lock()


class TableRequest(BaseModel):
    """POST /v1/tables/{hardware_id}: which table, for which shapes."""

    model_config = ConfigDict(extra="forbid")

    tp: int = Field(2, ge=2, le=8, description="World size (tensor-parallel degree).")
    mode: Literal["eager", "graph"] = Field("graph", description="Execution mode.")
    dtype: Literal["bf16", "fp16", "fp32"] = Field("bf16", description="Element type.")
    config: dict[str, Any] | None = Field(None, description="A Hugging Face config.json: its layers' shapes.")
    shapes: list[str] | None = Field(
        None, max_length=MAX_SHAPES, description="op:n:k (dense) or op:n:k:experts:top_k (MoE) shapes."
    )
    allow_simulated: bool = Field(False, description="Serve a table the model cannot back, marked simulated.")


def table_etag(version: str, fingerprint: str, tp: int, mode: str, dtype: str, shapes: list) -> str:
    """A strong ETag of one table: model version, hardware fingerprint and the request."""
    text = json.dumps([version, fingerprint, tp, mode, dtype, shapes])
    return '"' + hashlib.sha256(text.encode()).hexdigest()[:32] + '"'


def _matches(if_none_match: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header names ``etag`` (or is ``*``)."""
    if not if_none_match:
        return False
    tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
    return "*" in tags or etag in tags


def _shapes(body: TableRequest, hardware_id: str) -> list:
    """The export shapes of a POST body; InvalidFieldsError naming a bad field."""
    from ficco.features import get_hardware
    from ficco.features.model_config import ModelConfig, layer_pairs

    out: dict[tuple, None] = {}
    if body.config is not None:
        try:
            config = ModelConfig.from_hf_dict(str(body.config.get("_name_or_path", "posted")), body.config)
            pairs = layer_pairs(config, tp=body.tp, tokens=body.tp * 64, dtype=body.dtype,
                                hardware=get_hardware(hardware_id))  # fmt: skip
        except (ValueError, KeyError, TypeError) as err:
            raise InvalidFieldsError(
                [field_error(["body", "config"], "<config>", str(err), allowed="a config ficco reads")]
            ) from None
        for p in pairs:
            s = p.scenario
            out.setdefault((s.op, s.n, s.k, s.experts, s.top_k), None)
    for i, text in enumerate(body.shapes or []):
        parts = text.split(":")
        try:
            numbers = [int(x) for x in parts[1:]]
            if len(parts) not in (3, 5):
                raise ValueError
        except ValueError:
            msg = f"a shape is op:n:k or op:n:k:experts:top_k; got {text!r}"
            raise InvalidFieldsError(
                [field_error(["body", "shapes", i], text, msg, allowed="op:n:k or op:n:k:experts:top_k")]
            ) from None
        out.setdefault((parts[0], *numbers, *[0, 0][: 5 - len(parts)]), None)
    if not out:
        msg = "give a Hugging Face config or a list of shapes (GET serves the shape grid)"
        raise InvalidFieldsError([field_error(["body"], None, msg, allowed="config or shapes")])
    return list(out)


def _answer(
    request: Request, served: ServedDep, hardware_id: str, body: TableRequest, shapes: list,
    if_none_match: str | None,
) -> Response:  # fmt: skip
    """The table (200 with its ETag), 304 when ``If-None-Match`` names it, 404 for hardware without a
    served model, 422 for a table the model cannot back."""
    from ficco.features.schedule_table import hardware_fingerprint
    from ficco.training.export import ExportRefused, build_schedule_table, training_fingerprint

    model = served.get(hardware_id)
    if model is None:
        raise UnknownHardwareError(
            f"no model is served for hardware {hardware_id!r}; tables are only built from a model measured "
            f"on that hardware (served: {sorted(served)})",
            sorted(served),
        )
    predictor = model.predictor
    fingerprint = hardware_fingerprint(training_fingerprint(predictor.card))
    etag = table_etag(predictor.version, fingerprint, body.tp, body.mode, body.dtype,
                      [list(s) for s in shapes] + [body.allow_simulated])  # fmt: skip
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if _matches(if_none_match, etag):
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    cache: dict[str, dict] = request.app.state.__dict__.setdefault("tables", {})
    with _LOCK:
        table = cache.get(etag)
        if table is None:
            try:
                built = build_schedule_table(
                    predictor, shapes, world_size=body.tp, mode=body.mode, dtype=body.dtype,
                    allow_simulated=body.allow_simulated,
                )  # fmt: skip
            except ExportRefused as err:
                raise InvalidFieldsError(
                    [
                        field_error(
                            ["query", "tp"], body.tp, str(err), allowed="world sizes the model measured"
                        )
                    ]
                ) from None
            table = cache[etag] = built.to_dict()
    return JSONResponse(table, headers=headers)


@router.get("/{hardware_id}")
def read_table(
    request: Request,
    served: ServedDep,
    hardware_id: str,
    tp: Annotated[int, Query(ge=2, le=8, description="World size (tensor-parallel degree).")] = 2,
    mode: Literal["eager", "graph"] = "graph",
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16",
    allow_simulated: bool = False,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """The served model's schedule table of the dense shape grid for one (tp, mode, dtype)."""
    from ficco.training.export import grid_shapes

    body = TableRequest(tp=tp, mode=mode, dtype=dtype, allow_simulated=allow_simulated)
    return _answer(request, served, hardware_id, body, grid_shapes(), if_none_match)


@router.post("/{hardware_id}")
def create_table(
    request: Request,
    served: ServedDep,
    hardware_id: str,
    body: TableRequest,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """The served model's schedule table for a posted model config's layers (or listed shapes)."""
    return _answer(request, served, hardware_id, body, _shapes(body, hardware_id), if_none_match)
