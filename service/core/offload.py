"""Handing a batch request to the batch worker processes (``service.core.worker_pool``): its content
type checked, its body passed on as received, behind the app's ``BatchGate`` (``service.core.admission``:
429 with Retry-After when full).

The worker parses, validates, answers and serialises the body, so a batch costs the serving process
only the bytes it reads and writes.
"""

from __future__ import annotations

import asyncio
import email.message
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.types import Receive, Scope, Send

from ficco.service.core.admission import BatchGate
from ficco.service.core.worker_pool import JobKind, WorkerPool

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=256)  # clients send a handful of content types; parsing one costs ~20 us
def is_json(content_type: str | None) -> bool:
    """True for ``application/json`` and ``application/<anything>+json`` (parameters aside), the media
    types FastAPI reads as JSON; False for any other, e.g. ``text/plain; charset=json``, which a browser
    sends cross-origin without asking first."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


BATCH_BODIES: list[type[Any]] = []
"""The pydantic models given to ``batch_body``: their ``$defs`` go into the OpenAPI document's components
(``add_batch_components``)."""


def _json_schema(schema: type[Any]) -> dict[str, Any]:
    return schema.model_json_schema(ref_template="#/components/schemas/{model}")


def batch_body(schema: type[Any]) -> dict[str, Any]:
    """The OpenAPI ``requestBody`` of a batch route whose body is ``schema`` (a pydantic model), read by
    the worker rather than by FastAPI; its ``$defs`` refer to the document's components."""
    BATCH_BODIES.append(schema)
    document = _json_schema(schema)
    return {
        "required": True,
        "content": {"application/json": {"schema": {k: v for k, v in document.items() if k != "$defs"}}},
    }


def add_batch_components(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` (an OpenAPI document) with the batch bodies' ``$defs`` that it lacks added to its
    components (e.g. ``NamedConfig``, which only ``/v1/score/batch``'s body holds)."""
    components = document.setdefault("components", {}).setdefault("schemas", {})
    for schema in BATCH_BODIES:
        for name, definition in _json_schema(schema).get("$defs", {}).items():
            components.setdefault(name, definition)
    return document


SEND_CHUNK = 1 << 16
"""Bytes of a worker's answer handed to the connection at a time: the connection's own buffer bounds what
waits for a client that reads slowly, and the send waits for it to drain."""


class AdmittedResponse(Response):
    """A worker's answer sent ``SEND_CHUNK`` bytes at a time, holding its batch's admission until the last
    byte is handed to the connection; a client that has not read it all ``timeout_s`` seconds after it was
    ready loses the connection (the answer's memory and the admission are freed)."""

    def __init__(self, content: bytes, *, release: Callable[[], None], timeout_s: float) -> None:
        super().__init__(content, media_type="application/json")
        self._release, self._timeout_s = release, timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                await send(
                    {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
                )
                body = memoryview(self.body)
                for start in range(0, len(body), SEND_CHUNK):
                    chunk = bytes(body[start : start + SEND_CHUNK])
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except TimeoutError:
            log.warning(
                "closing a connection: its %d-byte answer was not read within %g s (FICCO_SEND_TIMEOUT_S)",
                len(self.body),
                self._timeout_s,
            )
            raise
        finally:
            self.body = b""
            self._release()


async def answer_in_worker(request: Request, kind: JobKind, served: Mapping[str, Any]) -> Response:
    """The batch worker's answer to ``request``'s body, a job of ``kind``, with the models ``served``
    (the versions single requests are answered with); 422 for a body that is not sent as JSON. The job
    counts against the app's ``BatchGate`` (single scores: its ``score_gate``, counted apart) until its
    answer is sent (``AdmittedResponse``)."""
    body = await request.body()
    if not is_json(request.headers.get("content-type")):
        raise RequestValidationError([{"loc": ("body",), "input": body, "msg": "", "type": "content_type"}])
    gate: BatchGate = request.app.state.score_gate if kind == "score_one" else request.app.state.batch_gate
    workers: WorkerPool = request.app.state.batch_workers
    versions = {hw: model.version for hw, model in served.items()}
    release = gate.admit()
    try:
        answer = await gate.run_admitted(workers.answer, kind, body, versions)
    except BaseException:
        release()
        raise
    timeout_s = request.app.state.settings.SEND_TIMEOUT_S
    return AdmittedResponse(answer, release=release, timeout_s=timeout_s)
