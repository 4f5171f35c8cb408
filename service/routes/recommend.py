"""POST /v1/recommend and /v1/recommend/batch: the schedule for one scenario or many.

A batch's body is read here and handed, behind the app's ``BatchGate`` (``service.core.admission``), to a
batch worker process (``service.core.batch_worker``) that parses, validates, answers and serialises it
with the models this request sees, so batches cannot stall single requests.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError

from ficco.service.core.admission import BatchGate
from ficco.service.core.batch_worker import BatchWorkers
from ficco.service.deps import ServedDep, SettingsDep
from ficco.service.engine import recommend_scenario
from ficco.service.routes.responses import BODY_ERRORS, BUSY_ERRORS, MODEL_ERRORS
from ficco.service.schemas import (
    RecommendationPublic,
    RecommendationsPublic,
    RecommendBatchRequest,
    ScenarioIn,
)

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


@router.post(
    "/batch",
    response_model=RecommendationsPublic,
    responses=BUSY_ERRORS,
    openapi_extra={"requestBody": _BATCH_BODY},
)
async def recommend_batch(request: Request, served: ServedDep) -> Response:
    """Recommend schedules for 1 to MAX_BATCH scenarios: the same answers as one request each.

    At most FICCO_BATCH_CONCURRENCY batches are answered at once and FICCO_BATCH_QUEUE more wait; beyond
    that the answer is 429 with a Retry-After header.
    """
    body = await request.body()
    if "json" not in request.headers.get("content-type", ""):
        raise RequestValidationError([{"loc": ("body",), "input": body, "msg": "", "type": "content_type"}])
    gate: BatchGate = request.app.state.batch_gate
    workers: BatchWorkers = request.app.state.batch_workers
    versions = {hw: model.version for hw, model in served.items()}
    return Response(await gate.run(workers.answer, body, versions), media_type="application/json")
