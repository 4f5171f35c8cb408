"""The base of the service's pure ASGI middlewares (``limits``, ``metrics``): each acts on HTTP requests
and passes every other scope (lifespan, websocket) through unchanged."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class HttpMiddleware:
    """A pure ASGI middleware around ``app``: :meth:`handle` gets each HTTP request, ``app`` the rest."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.handle(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer an HTTP request, or pass it on to ``self.app``."""
        raise NotImplementedError
