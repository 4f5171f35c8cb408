"""uvicorn's HTTP/1.1 protocol (httptools' C parser when installed, else h11) with a request-header
timeout: a connection that does not complete a request's headers within ``header_timeout_s`` of opening
(or of its previous response) is closed.

uvicorn times out idle keep-alive connections only once a first request was answered, and cancels that
timer as soon as any byte arrives: a client that opens a connection and sends nothing, or half a request
line, holds it (and its file descriptor) forever. A stalled body after complete headers is not covered.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

log = logging.getLogger(__name__)


class HeaderTimeoutMixin:
    """Closes connections that start no request within ``header_timeout_s`` seconds; mixed into uvicorn's
    ``H11Protocol`` or ``HttpToolsProtocol`` (both keep ``cycle``, ``loop`` and ``transport``)."""

    cycle: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    client: Any

    header_timeout_s: float = 10.0
    """Set per server by ``with_header_timeout``."""

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._header_timer.cancel()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm_header_timer(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
        waiting_after = getattr(self, "cycle", None)  # a new request replaces the cycle
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._drop_if_idle, waiting_after)

    def _drop_if_idle(self, waiting_after: Any) -> None:
        if getattr(self, "cycle", None) is waiting_after and not self.transport.is_closing():
            log.info("closing %s: no request headers within %g s", self.client, self.header_timeout_s)
            self.transport.close()


def with_header_timeout(seconds: float) -> type[asyncio.Protocol]:
    """uvicorn's own HTTP protocol (``AutoHTTPProtocol``: httptools when installed, the C parser costs
    less per request than h11) timing out after ``seconds``, for ``uvicorn.run(http=...)``."""
    bases = (HeaderTimeoutMixin, AutoHTTPProtocol)
    return type("HeaderTimeoutProtocol", bases, {"header_timeout_s": seconds})
