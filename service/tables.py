"""Schedule tables in the service: built in a worker process of their own, kept compressed in a bounded
cache, the shape grid's loaded (or built) as soon as a model loads.

The server only checks a table request (world size, shapes, the model) and computes its ETag; the table
itself (``training.export.build_schedule_table``) is built by a worker process (``service.core.worker_pool``,
the ``table`` job of ``service.worker_jobs.JOBS``) behind a gate of its own, and kept gzip-compressed by
ETag (:class:`TableCache`). A grid table written into the model's registry folder
(``training.export.write_grid_tables``) is read from there instead of built. Why, and the costs:
docs/tables.md#tables-over-http.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ficco.features.schedule_table import hardware_fingerprint
from ficco.service.core.store import known_ids
from ficco.service.errors import InvalidFieldsError, UnknownHardwareError, field_error

log = logging.getLogger(__name__)

PREFETCH_POLL_S = 1.0
"""How often :func:`prefetch` looks for a newly loaded model version, seconds."""


def table_etag(version: str, fingerprint: str, tp: int, mode: str, dtype: str, shapes: Sequence,
               allow_simulated: bool) -> str:  # fmt: skip
    """A strong ETag of one table: model version, hardware fingerprint, the request and the rules that build
    it (``training.export.BUILD_VERSION``)."""
    from ficco.training.export import BUILD_VERSION

    text = json.dumps(
        [version, fingerprint, tp, mode, dtype, [list(s) for s in shapes], allow_simulated, BUILD_VERSION]
    )
    return '"' + hashlib.sha256(text.encode()).hexdigest()[:32] + '"'


def model_fingerprint(predictor: Any) -> str:
    """The hardware fingerprint of a model's training machine (``training.export.training_fingerprint``)."""
    from ficco.training.export import training_fingerprint

    return hardware_fingerprint(training_fingerprint(predictor.card))


def check_table(predictor: Any, *, tp: int, dtype: str, shapes: Sequence, allow_simulated: bool,
                shape_locs: Sequence[Sequence[str | int]], tp_loc: Sequence[str],
                errors: Sequence[dict[str, Any]] = ()) -> bool:  # fmt: skip
    """The checks a table request passes before any build: the model backs the world size (and, unless
    ``allow_simulated``, was measured), and every shape is one a table can hold; whether the table is
    simulated. ``InvalidFieldsError`` (422) locating every refusal, after ``errors`` (found before): the
    world size at ``tp_loc``, shape ``i`` at ``shape_locs[i]``."""
    from ficco.training.export import DENSE_OPS, ExportRefused, InvalidShapes, check_measured, check_shapes

    found = list(errors)
    simulated = False
    try:
        simulated = check_measured(predictor.card, tp, allow_simulated=allow_simulated)
    except ExportRefused as err:
        allowed = "a world size the model was trained at; allow_simulated for a simulated model"
        found.append(field_error(list(tp_loc), tp, str(err), "not_measured", allowed))
    try:
        check_shapes(shapes, world_size=tp, dtype=dtype, hardware=predictor.profile,
                     ops=predictor.card.get("ops") or DENSE_OPS)  # fmt: skip
    except InvalidShapes as err:
        allowed = "a shape of an op the model measured that a scenario of this world size can have"
        found += [field_error(list(shape_locs[i]), ":".join(map(str, s)), why, "value_error", allowed)
                  for i, s, why in err.errors]  # fmt: skip
    if found:
        raise InvalidFieldsError(sorted(found, key=_position))
    return simulated


def _position(error: dict[str, Any]) -> tuple:
    """An error item's location as a sort key: fields by name, list items by index (shape 2 before 10)."""
    return tuple((0, part) if isinstance(part, int) else (1, str(part)) for part in error["loc"])


def job_body(hardware_id: str, *, tp: int, mode: str, dtype: str, shapes: Sequence,
             allow_simulated: bool) -> bytes:  # fmt: skip
    """The ``table`` job a worker runs (:func:`build_job`), as JSON bytes."""
    request = {"hardware_id": hardware_id, "tp": tp, "mode": mode, "dtype": dtype,
               "shapes": [list(s) for s in shapes], "allow_simulated": allow_simulated}  # fmt: skip
    return json.dumps(request).encode()


def build_job(body: bytes, served: Mapping[str, Any], *, max_batch: int, default_hardware: str) -> bytes:
    """The worker's ``table`` job: the table a :func:`job_body` asks for, as gzip-compressed compact JSON;
    blocking, CPU-bound. A refusal (the server checks first, so only a model that changed meanwhile) is an
    ``InvalidFieldsError``."""
    from ficco.training.export import build_schedule_table, packed

    job = json.loads(body)
    model = served.get(job["hardware_id"])
    if model is None:
        raise UnknownHardwareError(
            f"no model is served for hardware {job['hardware_id']!r}", known_ids(served)
        )
    try:
        table = build_schedule_table(
            model.predictor, [tuple(s) for s in job["shapes"]], world_size=job["tp"], mode=job["mode"],
            dtype=job["dtype"], allow_simulated=job["allow_simulated"],
        )  # fmt: skip
    except ValueError as err:  # ExportRefused, InvalidShapes
        raise InvalidFieldsError([field_error(["body"], None, str(err))]) from None
    return packed(table)


class TableCache:
    """Built tables (gzip-compressed JSON) by ETag, at most ``max_bytes`` in all, least recently used out
    first, and the builds in flight: every request for a table being built waits for that one build.

    Use from one event loop only."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._tables: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._building: dict[str, asyncio.Future[bytes]] = {}
        self.bytes = 0
        """Bytes held now."""

    def __contains__(self, etag: str) -> bool:
        return etag in self._tables or etag in self._building

    async def get(self, etag: str, build: Callable[[], Awaitable[bytes]]) -> bytes:
        """The table of ``etag``: cached, being built (waited for), or built now by ``build()``. A build
        outlives a request that stops waiting (its table is kept for the next); a failed one is not kept."""
        found = self._tables.get(etag)
        if found is not None:
            self._tables.move_to_end(etag)
            return found
        future = self._building.get(etag)
        if future is None:
            future = self._building[etag] = asyncio.ensure_future(build())
            future.add_done_callback(lambda done: self._done(etag, done))
        return await asyncio.shield(future)

    def _done(self, etag: str, future: asyncio.Future[bytes]) -> None:
        self._building.pop(etag, None)
        if future.cancelled() or future.exception() is not None:
            return
        table = future.result()
        if len(table) > self.max_bytes:
            log.warning("a table of %d bytes exceeds FICCO_TABLE_CACHE_MB; served, not kept", len(table))
            return
        self._tables[etag] = table
        self.bytes += len(table)
        while self.bytes > self.max_bytes:
            _, dropped = self._tables.popitem(last=False)
            self.bytes -= len(dropped)


def default_tables(hardware_id: str, predictor: Any) -> list[dict[str, Any]]:
    """The ``GET /v1/tables/{hardware_id}`` requests a model can answer (``training.export.grid_requests``:
    per world size it was trained at, mode and training dtype, the shape grid)."""
    from ficco.training.export import grid_requests

    return [{"hardware_id": hardware_id, **request} for request in grid_requests(predictor)]


def request_name(request: Mapping[str, Any]) -> str:
    """One grid table request for a person, e.g. ``h200x2 tp=2 graph bf16``."""
    return f"{request['hardware_id']} tp={request['tp']} {request['mode']} {request['dtype']}"


@dataclass(eq=False)
class GridTables:
    """What :func:`prefetch` has done: the grid tables of served model versions not ready yet, and whether
    the versions served at start-up have all of theirs (what ``/readyz`` waits for)."""

    pending: set[str] = field(default_factory=set)
    """:func:`request_name` of each grid table being loaded or built, or waiting for its turn."""
    first_pass_done: bool = False
    """True once every grid table of the versions served when the prefetch started was tried."""


async def prefetch(
    served: Callable[[], Mapping[str, Any]], fetch: Callable[..., Awaitable[bytes]], progress: GridTables
) -> None:
    """Never returns: every :data:`PREFETCH_POLL_S`, for each model version of ``served()`` not seen before,
    ``await fetch(snapshot, **request)`` for each of its :func:`default_tables`, one at a time (a failure is
    logged; the table is built when first asked for), keeping ``progress``."""
    seen: set[tuple[str, str]] = set()
    while True:
        snapshot = served()
        fresh = [(hw, model) for hw, model in snapshot.items() if (hw, model.version) not in seen]
        requests = [(hw, r) for hw, model in fresh for r in default_tables(hw, model.predictor)]
        progress.pending |= {request_name(r) for _, r in requests}
        for hw, request in requests:
            try:
                await fetch(snapshot, **request)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # e.g. the table gate is full: built on first request instead
                log.warning("prefetch of the %s table %s failed: %s", hw, request, err)
            finally:
                progress.pending.discard(request_name(request))
        for hw, model in fresh:
            seen.add((hw, model.version))
            log.info("grid tables of %s %s ready", hw, model.version)
        progress.first_pass_done = progress.first_pass_done or bool(snapshot)
        await asyncio.sleep(PREFETCH_POLL_S)
