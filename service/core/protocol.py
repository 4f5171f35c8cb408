"""uvicorn's HTTP/1.1 protocol (httptools' C parser when installed, else h11) with limits on how a request's
bytes arrive, however they are split:

- headers: a connection that does not complete a request's line and headers within ``HEADER_TIMEOUT_S``
  of opening (or of its previous response) is closed; a request line and headers over ``MAX_HEADER_BYTES``
  or of more than ``MAX_HEADERS`` lines are answered 431 before the parser sees them (sent in one piece
  or byte by byte), and the connection is closed;
- body: a request whose body has not fully arrived ``BODY_TIMEOUT_S`` after its headers is answered 408
  and closed (a slow or never-ending body cannot hold a connection);
- clients: one client address holds at most ``MAX_CONNECTIONS_PER_CLIENT`` connections at once; a further
  one is closed at once.

uvicorn times out idle keep-alive connections only once a first request was answered, and cancels that
timer as soon as any byte arrives; httptools sets no size limit on headers. Every refusal is counted by
``on_reject(reason)`` (``/metrics``); the body's own size limit is ``core.limits``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from uvicorn.protocols.http.auto import AutoHTTPProtocol

if TYPE_CHECKING:
    from ficco.service.core.config import Settings

log = logging.getLogger(__name__)

END_OF_HEADERS = b"\r\n\r\n"


def _refusal(status: str, detail: str) -> bytes:
    """An error answer (JSON ``detail``, as every error of the service) that closes the connection."""
    body = json.dumps({"detail": detail}).encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


class LimitsMixin:
    """The limits of the module docstring, mixed into uvicorn's ``H11Protocol`` or ``HttpToolsProtocol``
    (both keep ``cycle``, the request being answered, which a request's complete headers replace, its
    ``more_body`` until the body has arrived, and ``loop``, ``transport`` and ``client``)."""

    cycle: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    client: Any

    limits: Settings
    """The server's settings, whose limits apply; set per server by ``with_limits``."""
    on_reject: Callable[[str], None]
    """Counts a refusal by reason; set per server by ``with_limits``."""
    clients: ClassVar[Counter[str]] = Counter()
    """Open connections per client address (per server, set by ``with_limits``)."""

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._timer: asyncio.TimerHandle | None = None
        self._host = str(self.client[0]) if self.client else ""
        self.clients[self._host] += 1
        cap = self.limits.MAX_CONNECTIONS_PER_CLIENT
        if cap and self.clients[self._host] > cap:
            log.info("closing %s: over %d connections from this client", self.client, cap)
            self._refuse("connections_per_client")
            return
        self._await_headers()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self.clients[self._host] -= 1
        if self.clients[self._host] <= 0:
            del self.clients[self._host]
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        if self._awaiting_headers and not self._within_header_limits(data):
            return
        before = getattr(self, "cycle", None)
        super().data_received(data)  # type: ignore[misc]
        cycle = getattr(self, "cycle", None)
        if self._awaiting_headers and cycle is not before:  # this data completed the headers
            self._awaiting_headers = False
            self._cancel_timer()
            if cycle.more_body:
                self._timer = self.loop.call_later(self.limits.BODY_TIMEOUT_S, self._drop_slow_body, cycle)

    def _within_header_limits(self, data: bytes) -> bool:
        """Count ``data`` toward the request line and headers (up to their end, if it is in ``data``);
        answer 431 and return False once they are over the byte or line limit."""
        seen = self._head_tail + data
        end = seen.find(END_OF_HEADERS)
        head = seen if end < 0 else seen[: end + len(END_OF_HEADERS)]
        size = self._header_bytes + len(head) - len(self._head_tail)
        lines = self._header_lines + head.count(b"\r\n") - self._head_tail.count(b"\r\n")
        if size > self.limits.MAX_HEADER_BYTES or lines > self.limits.MAX_HEADERS + 2:
            log.info("answering 431 to %s: headers over %d bytes or %d lines", self.client,
                     self.limits.MAX_HEADER_BYTES, self.limits.MAX_HEADERS)  # fmt: skip
            detail = (
                f"request line and headers are over the limit of {self.limits.MAX_HEADER_BYTES} bytes "
                f"(FICCO_MAX_HEADER_BYTES) or {self.limits.MAX_HEADERS} headers (FICCO_MAX_HEADERS)"
            )
            self._refuse("header_too_large", "431 Request Header Fields Too Large", detail)
            return False
        if end < 0:
            self._header_bytes, self._header_lines, self._head_tail = size, lines, seen[-3:]
        return True

    def _await_headers(self) -> None:
        """Start counting the next request's header bytes and its header timer (unless a pipelined
        request's headers already arrived)."""
        self._cancel_timer()
        waiting_after = getattr(self, "cycle", None)  # a new request replaces the cycle
        self._awaiting_headers = waiting_after is None or waiting_after.response_complete
        self._header_bytes, self._header_lines, self._head_tail = 0, 0, b""
        self._timer = self.loop.call_later(self.limits.HEADER_TIMEOUT_S, self._drop_if_idle, waiting_after)

    def _cancel_timer(self) -> None:
        if getattr(self, "_timer", None) is not None:
            self._timer.cancel()
            self._timer = None

    def _drop_if_idle(self, waiting_after: Any) -> None:
        if getattr(self, "cycle", None) is waiting_after and not self.transport.is_closing():
            log.info("closing %s: no request headers within %g s", self.client, self.limits.HEADER_TIMEOUT_S)
            self._refuse("header_timeout")

    def _drop_slow_body(self, cycle: Any) -> None:
        if cycle is getattr(self, "cycle", None) and cycle.more_body and not self.transport.is_closing():
            log.info("answering 408 to %s: body incomplete %g s after its headers", self.client,
                     self.limits.BODY_TIMEOUT_S)  # fmt: skip
            wait = self.limits.BODY_TIMEOUT_S
            detail = f"the request body did not arrive within {wait:g} s (FICCO_BODY_TIMEOUT_S)"
            self._refuse("body_timeout", "408 Request Timeout", detail, answered=not cycle.response_started)

    def _refuse(
        self, reason: str, status: str | None = None, detail: str = "", *, answered: bool = True
    ) -> None:
        """Count the refusal, answer ``status`` (when given and no response has started) and close."""
        self.on_reject(reason)
        if status is not None and answered:
            self.transport.write(_refusal(status, detail))
        self.transport.close()


def with_limits(settings: Settings, on_reject: Callable[[str], None]) -> type[asyncio.Protocol]:
    """uvicorn's own HTTP protocol (``AutoHTTPProtocol``: httptools when installed, the C parser costs less
    per request than h11) with the limits of ``settings``, each refusal counted by ``on_reject(reason)``, for
    ``uvicorn.run(http=...)``."""
    attributes = {"limits": settings, "clients": Counter(), "on_reject": staticmethod(on_reject)}
    return type("LimitsProtocol", (LimitsMixin, AutoHTTPProtocol), attributes)
