"""POST /v1/recommend and /v1/recommend/batch: the schedule for one scenario or many.

A batch's body is handed, behind the app's ``BatchGate``, to a batch worker process that parses,
validates, answers and serialises it with the models this request sees (``service.core.offload``), so
batches cannot stall single requests.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from ficco.service.core.offload import answer_in_worker
from ficco.service.deps import ServedDep, SettingsDep
from ficco.service.engine import recommend_scenario
from ficco.service.routes.responses import BODY_ERRORS, MODEL_ERRORS, batch_route
from ficco.service.schemas import (
    RecommendationPublic,
    RecommendationsPublic,
    RecommendBatchRequest,
    ScenarioIn,
)

router = APIRouter(prefix="/v1/recommend", tags=["recommend"], responses={**BODY_ERRORS, **MODEL_ERRORS})


@router.post("", response_model=RecommendationPublic)
async def recommend(body: ScenarioIn, served: ServedDep, settings: SettingsDep) -> RecommendationPublic:
    """Recommend a schedule for one scenario."""
    return await recommend_scenario(served, body, default_hardware=settings.DEFAULT_HARDWARE)


@router.post("/batch", **batch_route(RecommendationsPublic, RecommendBatchRequest))
async def recommend_batch(request: Request, served: ServedDep) -> Response:
    """Recommend schedules for 1 to MAX_BATCH scenarios: the same answers as one request each.

    At most FICCO_BATCH_CONCURRENCY batches are answered at once and FICCO_BATCH_QUEUE more wait; beyond
    that the answer is 429 with a Retry-After header.
    """
    return await answer_in_worker(request, "recommend", served)
