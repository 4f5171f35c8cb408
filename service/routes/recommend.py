"""POST /v1/recommend and /v1/recommend/batch: the schedule for one scenario or many."""

from __future__ import annotations

from fastapi import APIRouter
from ficco.service.deps import ServedDep, SettingsDep
from ficco.service.engine import recommend_scenario, recommend_scenarios
from ficco.service.errors import InvalidFieldsError, field_error
from ficco.service.routes.responses import BODY_ERRORS, MODEL_ERRORS
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


@router.post("/batch", response_model=RecommendationsPublic)
def recommend_batch(
    body: RecommendBatchRequest, served: ServedDep, settings: SettingsDep
) -> RecommendationsPublic:
    """Recommend schedules for up to MAX_BATCH scenarios: the same answers as one request each."""
    count = len(body.scenarios)
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
    data = recommend_scenarios(served, body.scenarios, default_hardware=settings.DEFAULT_HARDWARE, locs=locs)
    return RecommendationsPublic(data=data, count=count)
