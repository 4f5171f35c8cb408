"""POST /v1/recommend and /v1/recommend/batch: the schedule for one scenario or many.

A batch is parsed, validated and answered in one worker thread behind the app's ``BatchGate`` (see
``service.core.admission``), so batches cannot stall single requests; the body is read on the loop.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from ficco.service.core.admission import BatchGate
from ficco.service.core.config import Settings
from ficco.service.core.store import ServedModel
from ficco.service.deps import ServedDep, SettingsDep
from ficco.service.engine import recommend_scenario, recommend_scenarios
from ficco.service.errors import InvalidFieldsError, field_error
from ficco.service.routes.responses import BODY_ERRORS, BUSY_ERRORS, MODEL_ERRORS
from ficco.service.schemas import (
    RecommendationPublic,
    RecommendationsPublic,
    RecommendBatchRequest,
    ScenarioIn,
)
from pydantic import ValidationError

router = APIRouter(prefix="/v1/recommend", tags=["recommend"], responses={**BODY_ERRORS, **MODEL_ERRORS})

_BATCH_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                key: value
                for key, value in RecommendBatchRequest.model_json_schema(
                    ref_template="#/components/schemas/{model}"
                ).items()
                if key != "$defs"  # ScenarioIn is already a component (POST /v1/recommend's body)
            }
        }
    },
}


@router.post("", response_model=RecommendationPublic)
async def recommend(body: ScenarioIn, served: ServedDep, settings: SettingsDep) -> RecommendationPublic:
    """Recommend a schedule for one scenario."""
    return await recommend_scenario(served, body, default_hardware=settings.DEFAULT_HARDWARE)


def answer_batch(body: bytes, served: Mapping[str, ServedModel], settings: Settings) -> bytes:
    """The JSON answer (``RecommendationsPublic``) to a batch request's raw ``body``; blocking, CPU-bound.

    Raises ``RequestValidationError`` (bad JSON or fields), ``InvalidFieldsError`` (too many scenarios,
    rules across fields) and the engine's errors.
    """
    try:
        request = RecommendBatchRequest.model_validate_json(body)
    except ValidationError as err:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in err.errors()]) from None
    count = len(request.scenarios)
    if count > settings.MAX_BATCH:
        raise InvalidFieldsError(
            [
                field_error(
                    ["body", "scenarios"],
                    count,
                    f"a batch holds at most {settings.MAX_BATCH} scenarios "
                    f"(FICCO_MAX_BATCH); got {count}. Split it.",
                    allowed=f"at most {settings.MAX_BATCH} items",
                )
            ]
        )
    locs = [["body", "scenarios", i] for i in range(count)]
    data = recommend_scenarios(
        served, request.scenarios, default_hardware=settings.DEFAULT_HARDWARE, locs=locs
    )
    return RecommendationsPublic(data=data, count=count).model_dump_json().encode()


@router.post(
    "/batch",
    response_model=RecommendationsPublic,
    responses=BUSY_ERRORS,
    openapi_extra={"requestBody": _BATCH_BODY},
)
async def recommend_batch(request: Request, served: ServedDep, settings: SettingsDep) -> Response:
    """Recommend schedules for 1 to MAX_BATCH scenarios: the same answers as one request each.

    At most FICCO_BATCH_CONCURRENCY batches are answered at once and FICCO_BATCH_QUEUE more wait; beyond
    that the answer is 429 with a Retry-After header.
    """
    body = await request.body()
    if "json" not in request.headers.get("content-type", ""):
        raise RequestValidationError([{"loc": ("body",), "input": body, "msg": "", "type": "content_type"}])
    gate: BatchGate = request.app.state.batch_gate
    return Response(await gate.run(answer_batch, body, served, settings), media_type="application/json")
