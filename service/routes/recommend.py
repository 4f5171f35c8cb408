"""POST /v1/recommend and /v1/recommend/batch: the schedule for one scenario or many.

A batch's body is handed, behind the app's ``BatchGate``, to a batch worker process that parses,
validates, answers and serialises it with the models this request sees (``service.core.offload``), so
batches cannot stall single requests.

A single request is the service's hot path. :class:`RecommendFastPath` answers a valid one before
FastAPI's routing (its exception and exit-stack middlewares, route matching, dependency solving, the
answer's re-validation against ``response_model``), which on 2 cores took more CPU than the engine's own
work for a cached answer (docs/service.md#single-requests); every other request, and every refusal,
goes on to the route below, which answers as FastAPI always has (the one error contract).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request, Response
from starlette.types import Receive, Scope, Send

from ficco.service.core.limits import replay
from ficco.service.core.middleware import HttpMiddleware
from ficco.service.core.offload import answer_in_worker, is_json
from ficco.service.deps import ServedDep
from ficco.service.engine import recommend_scenario
from ficco.service.routes.responses import BODY_ERRORS, MODEL_ERRORS, batch_route
from ficco.service.schemas import (
    RecommendationPublic,
    RecommendationsPublic,
    RecommendBatchRequest,
    ScenarioIn,
)

PATH = "/v1/recommend"

router = APIRouter(prefix=PATH, tags=["recommend"], responses={**BODY_ERRORS, **MODEL_ERRORS})


async def _answer(state: Any, item: ScenarioIn) -> bytes:
    """The JSON bytes of ``item``'s answer with the app's served models (``state``: the app's state);
    raises the engine's refusals."""
    answer = await recommend_scenario(
        state.store.served, item, default_hardware=state.settings.DEFAULT_HARDWARE
    )
    return answer.model_dump_json().encode()


@router.post("", response_model=RecommendationPublic)
async def recommend(body: ScenarioIn, request: Request) -> Response:
    """Recommend a schedule for one scenario."""
    return Response(await _answer(request.app.state, body), media_type="application/json")


_ROUTE = router.routes[-1]
"""The route :class:`RecommendFastPath` stands in for."""


@router.post("/batch", **batch_route(RecommendationsPublic, RecommendBatchRequest))
async def recommend_batch(request: Request, served: ServedDep) -> Response:
    """Recommend schedules for 1 to MAX_BATCH scenarios: the same answers as one request each.

    At most FICCO_BATCH_CONCURRENCY batches are answered at once and FICCO_BATCH_QUEUE more wait; beyond
    that the answer is 429 with a Retry-After header.
    """
    return await answer_in_worker(request, "recommend", served)


class RecommendFastPath(HttpMiddleware):
    """``POST /v1/recommend`` with a JSON body that validates as a ``ScenarioIn`` (parsed as FastAPI parses
    it: ``json.loads``, then the model) and that the engine answers: answered here, with the same bytes as
    the route's. Anything else (another path or method, another content type, a body FastAPI would refuse,
    a hardware or world size no model answers) is passed on to the app with its body, and the route gives
    its answer or its error as it would have. Add it inside the body limit (``core.limits``)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST" or scope["path"] != PATH:
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        answer = await self._try(scope, body)
        if answer is None:
            await self.app(scope, replay(body, receive), send)
            return
        scope["route"] = _ROUTE  # the metrics' endpoint label, as the router sets it
        headers = [(b"content-length", str(len(answer)).encode()), (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    async def _try(self, scope: Scope, body: bytes) -> bytes | None:
        """The answer's bytes, or None where the route must answer (it then refuses with its own error)."""
        content_type = next((v for k, v in scope["headers"] if k == b"content-type"), b"")
        if not is_json(content_type.decode("latin-1")):
            return None
        try:
            item = ScenarioIn.model_validate(json.loads(body))
            return await _answer(scope["app"].state, item)
        except Exception:  # not JSON, invalid, refused by the engine: the route answers with its error
            return None
