"""GET and POST /v1/tables/{hardware_id}: the served model's schedule tables (features.schedule_table).

GET serves the dense shape grid (``training.export.grid_shapes``), POST the layers of a posted Hugging Face
config or listed shapes; every answer carries an ``ETag`` (model version, hardware fingerprint, request) and
is gzip-encoded for clients that accept it. The tables are built and cached by ``service.tables``; what
clients see: docs/tables.md#tables-over-http.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response, status

from ficco.service.core.admission import BatchGate
from ficco.service.core.worker_pool import WorkerPool
from ficco.service.deps import ServedDep
from ficco.service.errors import InvalidFieldsError, UnknownHardwareError, field_error
from ficco.service.routes.responses import BODY_ERRORS, BUSY_ERRORS, MODEL_ERRORS
from ficco.service.schemas import MAX_TABLE_SHAPES, TableQuery, TableRequest
from ficco.service.tables import TableCache, check_table, job_body, model_fingerprint, table_etag

TABLE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The table (format features.schedule_table), with its ETag."},
    304: {"description": "Not modified: If-None-Match names the current ETag."},
    **BODY_ERRORS,
    **MODEL_ERRORS,
    **BUSY_ERRORS,
}

router = APIRouter(prefix="/v1/tables", tags=["tables"], responses=TABLE_RESPONSES)


def _matches(if_none_match: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header names ``etag`` (or is ``*``)."""
    if not if_none_match:
        return False
    tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
    return "*" in tags or etag in tags


def _posted_shapes(body: TableRequest, profile: Any) -> tuple[list[tuple], list[list[str | int]]]:
    """The shapes a POST body asks for (its config's layers, then its listed shapes, each once) and where
    each comes from in the body; ``InvalidFieldsError`` naming a bad field or too many shapes."""
    from ficco.features.model_config import ModelConfig, layer_pairs

    out: dict[tuple, list[str | int]] = {}
    if body.config is not None:
        try:
            config = ModelConfig.from_hf_dict(str(body.config.get("_name_or_path", "posted")), body.config)
            pairs = layer_pairs(config, tp=body.tp, tokens=body.tp * 64, dtype=body.dtype, hardware=profile)
        except (ValueError, KeyError, TypeError) as err:
            raise InvalidFieldsError(
                [field_error(["body", "config"], "<config>", str(err), allowed="a config ficco reads")]
            ) from None
        for p in pairs:
            s = p.scenario
            out.setdefault((s.op, s.n, s.k, s.experts, s.top_k), ["body", "config"])
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
        out.setdefault((parts[0], *numbers, *[0, 0][: 5 - len(parts)]), ["body", "shapes", i])
    if not out:
        msg = "give a Hugging Face config or a list of shapes (GET serves the shape grid)"
        raise InvalidFieldsError([field_error(["body"], None, msg, allowed="config or shapes")])
    if len(out) > MAX_TABLE_SHAPES:
        msg = (
            f"a table request holds at most {MAX_TABLE_SHAPES} shapes (MAX_TABLE_SHAPES, a config's and the "
            f"listed ones together); got {len(out)}. Split it into several requests"
        )
        raise InvalidFieldsError(
            [field_error(["body"], len(out), msg, allowed=f"at most {MAX_TABLE_SHAPES}")]
        )
    return list(out), list(out.values())


async def answer_table(
    state: Any, served: Mapping[str, Any], hardware_id: str, *, tp: int, mode: str, dtype: str,
    shapes: list[tuple], allow_simulated: bool, etag: str, shipped: Callable[[], bytes | None] | None = None,
) -> bytes:  # fmt: skip
    """The table's gzip-compressed JSON: from the cache, else ``shipped()`` (a grid table written into the
    model's folder; None: not there), else built by the table worker behind its gate (``service.tables``;
    the app's ``state`` holds them). ``served`` is the request's snapshot (the versions the worker answers
    with); ``etag``: the table's (:func:`_checked`)."""
    cache: TableCache = state.tables
    gate: BatchGate = state.table_gate
    workers: WorkerPool = state.table_workers
    job = job_body(hardware_id, tp=tp, mode=mode, dtype=dtype, shapes=shapes, allow_simulated=allow_simulated)
    versions = {hw: m.version for hw, m in served.items()}

    async def build() -> bytes:
        found = None if shipped is None else await asyncio.to_thread(shipped)
        return found if found is not None else await gate.run(workers.answer, "table", job, versions)

    return await cache.get(etag, build)


def _checked(
    predictor: Any, query: TableQuery, shapes: list[tuple], locs: list[list[str | int]], tp_loc: list[str]
) -> tuple[bool, str]:
    """A table request's checks (``check_table``: 422 locating each refusal) and its ETag: (simulated,
    etag)."""
    q = query
    simulated = check_table(
        predictor, tp=q.tp, dtype=q.dtype, shapes=shapes, allow_simulated=q.allow_simulated, shape_locs=locs,
        tp_loc=tp_loc,
    )  # fmt: skip
    fingerprint = model_fingerprint(predictor)
    return simulated, table_etag(predictor.version, fingerprint, q.tp, q.mode, q.dtype, shapes, simulated)


@functools.lru_cache(maxsize=32)
def _grid_checked(
    predictor: Any, tp: int, mode: str, dtype: str, allow_simulated: bool
) -> tuple[list[tuple], bool, str]:
    """The shape grid's table request (GET) checked once per served model and query: (shapes, simulated,
    etag); a GET answered from the table cache then costs no Python over the grid's shapes."""
    from ficco.training.export import grid_shapes

    shapes = grid_shapes()
    query = TableQuery(tp=tp, mode=mode, dtype=dtype, allow_simulated=allow_simulated)
    return shapes, *_checked(predictor, query, shapes, [["query"]] * len(shapes), ["query", "tp"])


async def answer_grid_table(
    state: Any, served: Mapping[str, Any], hardware_id: str, *, tp: int, mode: str, dtype: str,
    allow_simulated: bool,
) -> bytes:  # fmt: skip
    """:func:`answer_table` of the shape grid (what ``GET`` serves and ``service.tables.prefetch`` loads),
    checked once per served model and query (:func:`_grid_checked`): the table written into the model's
    folder when it is current (``training.export.read_grid_table``), else built."""
    from ficco.training.export import read_grid_table

    predictor = served[hardware_id].predictor
    shapes, simulated, etag = _grid_checked(predictor, tp, mode, dtype, allow_simulated)
    folder = state.store.loads_from / hardware_id / predictor.version
    shipped = functools.partial(read_grid_table, folder, predictor, tp=tp, mode=mode, dtype=dtype)
    return await answer_table(state, served, hardware_id, tp=tp, mode=mode, dtype=dtype, shapes=shapes,
                              allow_simulated=simulated, etag=etag, shipped=shipped)  # fmt: skip


async def _respond(
    request: Request, served: ServedDep, hardware_id: str, query: TableQuery, body: TableRequest | None,
    if_none_match: str | None, accept_encoding: str | None,
) -> Response:  # fmt: skip
    """The table (200 with its ETag) of the POST ``body``'s shapes (None: the GET's shape grid), 304 when
    ``If-None-Match`` names it, 404 for hardware without a served model, 422 for a table the model cannot
    back or a shape it cannot hold, 429 past the client's table requests a second
    (``FICCO_TABLE_REQUESTS_PER_S``)."""
    client = request.client.host if request.client else ""
    request.app.state.table_rate.take(client)
    model = served.get(hardware_id)
    if model is None:
        raise UnknownHardwareError(
            f"no model is served for hardware {hardware_id!r}; tables are only built from a model trained "
            f"for that hardware id (served: {sorted(served)}; a simulated model is '<hardware>-sim')",
            sorted(served),
        )
    predictor = model.predictor
    if body is None:
        shapes, simulated, etag = _grid_checked(
            predictor, query.tp, query.mode, query.dtype, query.allow_simulated
        )
    else:
        shapes, locs = _posted_shapes(body, predictor.profile)
        simulated, etag = _checked(predictor, query, shapes, locs, ["body", "tp"])
    headers = {"ETag": etag, "Cache-Control": "no-cache", "Vary": "Accept-Encoding"}
    if _matches(if_none_match, etag):
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    state, q = request.app.state, query
    if body is None:
        packed = await answer_grid_table(state, served, hardware_id, tp=q.tp, mode=q.mode, dtype=q.dtype,
                                         allow_simulated=q.allow_simulated)  # fmt: skip
    else:
        packed = await answer_table(state, served, hardware_id, tp=q.tp, mode=q.mode, dtype=q.dtype,
                                    shapes=shapes, allow_simulated=simulated, etag=etag)  # fmt: skip
    if "gzip" in (accept_encoding or "").lower():
        return Response(
            packed, media_type="application/json", headers={**headers, "Content-Encoding": "gzip"}
        )
    return Response(await asyncio.to_thread(gzip.decompress, packed), media_type="application/json",
                    headers=headers)  # fmt: skip


@router.get("/{hardware_id}")
async def read_table(
    request: Request,
    served: ServedDep,
    hardware_id: str,
    query: Annotated[TableQuery, Query()],
    if_none_match: Annotated[str | None, Header()] = None,
    accept_encoding: Annotated[str | None, Header()] = None,
) -> Response:
    """The served model's schedule table of the dense shape grid for one (tp, mode, dtype)."""
    return await _respond(request, served, hardware_id, query, None, if_none_match, accept_encoding)


@router.post("/{hardware_id}")
async def create_table(
    request: Request,
    served: ServedDep,
    hardware_id: str,
    body: TableRequest,
    if_none_match: Annotated[str | None, Header()] = None,
    accept_encoding: Annotated[str | None, Header()] = None,
) -> Response:
    """The served model's schedule table for a posted model config's layers (or listed shapes)."""
    return await _respond(request, served, hardware_id, body, body, if_none_match, accept_encoding)
