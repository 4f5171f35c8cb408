"""Request-body limit: a pure ASGI middleware answering 413 for a body over ``max_bytes``.

It checks the declared ``Content-Length`` first, then counts the bytes actually streamed (a chunked
body declares none), buffering the body (at most ``max_bytes``) and replaying it to the app.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ficco.service.core.middleware import HttpMiddleware


class BodyLimitMiddleware(HttpMiddleware):
    """Answer 413 to any HTTP request whose body is over ``max_bytes``; pass the rest through unchanged."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send, int(declared))
            return
        chunks, total, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                await self._reject(send, total)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        await self.app(scope, replay(b"".join(chunks), receive), send)

    async def _reject(self, send: Send, size: int) -> None:
        body = json.dumps(
            {
                "detail": f"request body is over the limit of {self.max_bytes} bytes (FICCO_MAX_BODY_BYTES); "
                f"got {size} bytes or more. Split the batch into smaller requests."
            }
        ).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that first returns the whole buffered ``body``, then defers to the real one."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            message: dict[str, Any] = {"type": "http.request", "body": body, "more_body": False}
            return message
        return await receive()

    return replay
