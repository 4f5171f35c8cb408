"""uvicorn's HTTP/1.1 protocol (httptools' C parser when installed, else h11) with two limits on a
request's headers: a connection that does not complete them within ``header_timeout_s`` of opening (or of
its previous response) is closed, and one whose request line and headers run past ``max_header_bytes``
is answered 431 and closed.

uvicorn times out idle keep-alive connections only once a first request was answered, and cancels that
timer as soon as any byte arrives: a client that opens a connection and sends nothing, or half a request
line, holds it (and its file descriptor) forever. A stalled body after complete headers is not covered.
httptools sets no size limit: the headers of a request are kept in memory as they arrive, so one 50 MiB
header costs the server 100 MB (measured); the body has its own limit (``core.limits``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

log = logging.getLogger(__name__)


def _too_large(limit: int) -> bytes:
    """The 431 answer (JSON ``detail``, as every error of the service) for headers over ``limit`` bytes."""
    body = json.dumps(
        {"detail": f"request line and headers are over the limit of {limit} bytes (FICCO_MAX_HEADER_BYTES)"}
    ).encode()
    head = (
        "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class HeaderLimitsMixin:
    """Closes connections that start no request within ``header_timeout_s`` seconds, and answers 431 to a
    request line and headers over ``max_header_bytes``; mixed into uvicorn's ``H11Protocol`` or
    ``HttpToolsProtocol`` (both keep ``cycle``, the request being answered, which a request's complete
    headers replace, and ``loop`` and ``transport``)."""

    cycle: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    client: Any

    header_timeout_s: float = 10.0
    """Set per server by ``with_header_limits``."""
    max_header_bytes: int = 16384
    """Set per server by ``with_header_limits``."""

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._await_headers()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._header_timer.cancel()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        before = getattr(self, "cycle", None)
        super().data_received(data)  # type: ignore[misc]
        if not self._awaiting_headers:
            return
        if getattr(self, "cycle", None) is not before:  # this data completed the headers
            self._awaiting_headers = False
            return
        self._header_bytes += len(data)
        if self._header_bytes > self.max_header_bytes and not self.transport.is_closing():
            log.info("answering 431 to %s: headers over %d bytes", self.client, self.max_header_bytes)
            self.transport.write(_too_large(self.max_header_bytes))
            self.transport.close()

    def _await_headers(self) -> None:
        """Start counting the next request's header bytes and its header timer (unless a pipelined
        request's headers already arrived)."""
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
        waiting_after = getattr(self, "cycle", None)  # a new request replaces the cycle
        self._awaiting_headers = waiting_after is None or waiting_after.response_complete
        self._header_bytes = 0
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._drop_if_idle, waiting_after)

    def _drop_if_idle(self, waiting_after: Any) -> None:
        if getattr(self, "cycle", None) is waiting_after and not self.transport.is_closing():
            log.info("closing %s: no request headers within %g s", self.client, self.header_timeout_s)
            self.transport.close()


def with_header_limits(timeout_s: float, max_bytes: int) -> type[asyncio.Protocol]:
    """uvicorn's own HTTP protocol (``AutoHTTPProtocol``: httptools when installed, the C parser costs
    less per request than h11) with the header timeout ``timeout_s`` and size limit ``max_bytes``, for
    ``uvicorn.run(http=...)``."""
    bases = (HeaderLimitsMixin, AutoHTTPProtocol)
    return type("HeaderLimitsProtocol", bases, {"header_timeout_s": timeout_s, "max_header_bytes": max_bytes})
