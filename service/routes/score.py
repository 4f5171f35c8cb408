"""POST /v1/score and /v1/score/batch: Hugging Face model configs -> their layers' pairs, schedules and
projected savings. Both are answered by a batch worker process behind the batch gate, as
``/v1/recommend/batch`` is (``service.core.offload``): one config is still tens of predictions and a
schema's worth of JSON, which in the server pushed single recommendations' p99 to 49 ms beside 4 scoring
clients. A batch gets one item per config, scored or refused with its reasons.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from ficco.service.core.offload import answer_in_worker
from ficco.service.deps import ServedDep
from ficco.service.routes.responses import BODY_ERRORS, MODEL_ERRORS, batch_route
from ficco.service.schemas import ScoreBatchRequest, ScorePublic, ScoreRequest, ScoresPublic

router = APIRouter(prefix="/v1/score", tags=["score"], responses={**BODY_ERRORS, **MODEL_ERRORS})


@router.post("", **batch_route(ScorePublic, ScoreRequest))
async def score(request: Request, served: ServedDep) -> Response:
    """Score a model config's communication + GEMM pairs at each token count.

    Answered by a batch worker process, off the loop that answers single recommendations; up to
    FICCO_SCORE_QUEUE wait for one, counted apart from batches (beyond that 429 with a Retry-After header).
    """
    return await answer_in_worker(request, "score_one", served)


@router.post("/batch", **batch_route(ScoresPublic, ScoreBatchRequest))
async def score_batch(request: Request, served: ServedDep) -> Response:
    """Score many model configs alike (the same tp, tokens, dtype, mode and KV layout), in one call: one
    item per config, ``ok`` with its answer or ``error`` with why, so one bad config stops no other.

    Batches are admitted as for POST /v1/recommend/batch (FICCO_BATCH_CONCURRENCY, FICCO_BATCH_QUEUE;
    beyond that 429 with a Retry-After header).
    """
    return await answer_in_worker(request, "score", served)
