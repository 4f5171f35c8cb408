"""POST /v1/score and /v1/score/batch: Hugging Face model configs -> their layers' pairs, schedules and
projected savings."""

from __future__ import annotations

from fastapi import APIRouter

from ficco.service.deps import ServedDep, SettingsDep
from ficco.service.routes.responses import BODY_ERRORS, MODEL_ERRORS
from ficco.service.schemas import ScoreBatchRequest, ScorePublic, ScoreRequest, ScoresPublic
from ficco.service.scoring import score_model, score_models

router = APIRouter(prefix="/v1/score", tags=["score"], responses={**BODY_ERRORS, **MODEL_ERRORS})


@router.post("", response_model=ScorePublic)
def score(body: ScoreRequest, served: ServedDep, settings: SettingsDep) -> ScorePublic:
    """Score a model config's communication + GEMM pairs at each token count."""
    return score_model(served, body, default_hardware=settings.DEFAULT_HARDWARE)


@router.post("/batch", response_model=ScoresPublic)
def score_batch(body: ScoreBatchRequest, served: ServedDep, settings: SettingsDep) -> ScoresPublic:
    """Score many model configs alike (the same tp, tokens, dtype, mode and KV layout), in one call."""
    return score_models(served, body, default_hardware=settings.DEFAULT_HARDWARE)
