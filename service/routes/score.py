"""POST /v1/score: a Hugging Face model config -> its layers' pairs, schedules and projected savings."""

from __future__ import annotations

from fastapi import APIRouter
from ficco.service.deps import ServedDep, SettingsDep
from ficco.service.routes.responses import BODY_ERRORS, MODEL_ERRORS
from ficco.service.schemas import ScorePublic, ScoreRequest
from ficco.service.scoring import score_model

router = APIRouter(prefix="/v1/score", tags=["score"], responses={**BODY_ERRORS, **MODEL_ERRORS})


@router.post("", response_model=ScorePublic)
def score(body: ScoreRequest, served: ServedDep, settings: SettingsDep) -> ScorePublic:
    """Score a model config's communication + GEMM pairs at each token count."""
    return score_model(served, body, default_hardware=settings.DEFAULT_HARDWARE)
