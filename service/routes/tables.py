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
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response, status

from ficco.service.core.admission import BatchGate
from ficco.service.core.store import resolve_hardware
from ficco.service.core.worker_pool import WorkerPool
from ficco.service.deps import ServedDep
from ficco.service.errors import InvalidFieldsError, NotServedError, field_error
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


def _posted_shapes(
    body: TableRequest, profile: Any, tp: int
) -> tuple[list[tuple], list[list[str | int]], list[dict[str, Any]]]:
    """The shapes a POST body asks for at ``tp`` ranks (its config's layers, then its listed shapes, each
    once), where each comes from in the body, and an error item for each field that names none (a config
    ficco cannot read, each shape not of the form ``op:n:k[:experts:top_k]``); ``InvalidFieldsError`` when
    the body asks for no shape or too many."""
    from ficco.features.model_config import ModelConfig, layer_pairs

    out: dict[tuple, list[str | int]] = {}
    errors = []
    if body.config is not None:
        try:
            config = ModelConfig.from_hf_dict(str(body.config.get("_name_or_path", "posted")), body.config)
            pairs = layer_pairs(config, tp=tp, tokens=tp * 64, dtype=body.dtype, hardware=profile)
        except (ValueError, KeyError, TypeError) as err:
            errors.append(
                field_error(["body", "config"], "<config>", str(err), allowed="a config ficco reads")
            )
            pairs = []
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
            errors.append(
                field_error(["body", "shapes", i], text, msg, allowed="op:n:k or op:n:k:experts:top_k")
            )
            continue
        out.setdefault((parts[0], *numbers, *[0, 0][: 5 - len(parts)]), ["body", "shapes", i])
    if not out and not errors:
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
    return list(out), list(out.values()), errors


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
    predictor: Any, query: TableQuery, tp: int, shapes: list[tuple], locs: list[list[str | int]],
    tp_loc: list[str], errors: Sequence[dict[str, Any]] = (),
) -> tuple[bool, str]:  # fmt: skip
    """A table request's checks at ``tp`` ranks (``check_table``: 422 locating each refusal, beside the
    ``errors`` found before) and its ETag: (simulated, etag)."""
    q = query
    simulated = check_table(
        predictor, tp=tp, dtype=q.dtype, shapes=shapes, allow_simulated=q.allow_simulated, shape_locs=locs,
        tp_loc=tp_loc, errors=errors,
    )  # fmt: skip
    fingerprint = model_fingerprint(predictor)
    return simulated, table_etag(predictor.version, fingerprint, tp, q.mode, q.dtype, shapes, simulated)


@functools.lru_cache(maxsize=32)
def _grid_checked(
    predictor: Any, tp: int, mode: str, dtype: str, allow_simulated: bool
) -> tuple[list[tuple], bool, str]:
    """The shape grid's table request (GET) checked once per served model and query: (shapes, simulated,
    etag); a GET answered from the table cache then costs no Python over the grid's shapes."""
    from ficco.training.export import grid_shapes

    shapes = grid_shapes()
    query = TableQuery(tp=tp, mode=mode, dtype=dtype, allow_simulated=allow_simulated)
    return shapes, *_checked(predictor, query, tp, shapes, [["query"]] * len(shapes), ["query", "tp"])


def table_model(
    served: Mapping[str, Any], hardware_id: str, tp: int | None, tp_loc: list[str]
) -> tuple[Any, int]:
    """The served model whose tables a request for ``hardware_id`` at ``tp`` ranks (None: its GPU count)
    gets, and that world size: the hardware's own, never a substitute (a table carries its training
    machine's fingerprint). The errors every route gives: 404 for an id nobody knows; 422 at ``tp_loc``
    for a world size no model answers, at the path's ``hardware_id`` for hardware whose answers come from
    another hardware's model (naming that model's table)."""
    try:
        resolution = resolve_hardware(served, hardware_id, tp)
    except NotServedError as err:
        raise InvalidFieldsError([err.at(tp_loc, tp)]) from None
    sub, size = resolution.substitution, resolution.world_size
    if sub is not None:
        msg = (
            f"no model of {hardware_id!r} itself answers world_size={size}, and a table comes only from the "
            f"hardware's own model (it carries that machine's fingerprint): {sub.reason}. Its table is GET "
            f"/v1/tables/{sub.answered_hardware}?tp={size}; POST /v1/recommend answers {hardware_id} with "
            "the substitution stated"
        )
        own = sorted(hw for hw, m in served.items() if size in m.world_sizes)
        allowed = f"a hardware id whose own model answers world_size={size}: one of {own}"
        raise InvalidFieldsError(
            [field_error(["path", "hardware_id"], hardware_id, msg, "not_served", allowed)]
        )
    return resolution.model, size


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
    ``If-None-Match`` names it, 404 for a hardware id nobody knows, 422 for hardware without its own model
    at that world size, a table the model cannot back or each shape it cannot hold, 429 past the client's
    table requests a second (``FICCO_TABLE_REQUESTS_PER_S``)."""
    client = request.client.host if request.client else ""
    request.app.state.table_rate.take(client)
    tp_loc = ["query", "tp"] if body is None else ["body", "tp"]
    model, tp = table_model(served, hardware_id, query.tp, tp_loc)
    predictor = model.predictor
    if body is None:
        shapes, simulated, etag = _grid_checked(predictor, tp, query.mode, query.dtype, query.allow_simulated)
    else:
        shapes, locs, errors = _posted_shapes(body, predictor.profile, tp)
        simulated, etag = _checked(predictor, query, tp, shapes, locs, tp_loc, errors)
    headers = {"ETag": etag, "Cache-Control": "no-cache", "Vary": "Accept-Encoding"}
    if _matches(if_none_match, etag):
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    state, q = request.app.state, query
    if body is None:
        packed = await answer_grid_table(state, served, hardware_id, tp=tp, mode=q.mode, dtype=q.dtype,
                                         allow_simulated=q.allow_simulated)  # fmt: skip
    else:
        packed = await answer_table(state, served, hardware_id, tp=tp, mode=q.mode, dtype=q.dtype,
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
