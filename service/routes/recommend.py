"""POST /v1/recommend and /v1/recommend/batch: the schedule for one scenario or many.

A batch is parsed, validated and answered in one worker thread behind the app's ``BatchGate`` (see
``service.core.admission``), so batches cannot stall single requests; the body is read on the loop.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError

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


CHUNK = 500
"""Scenarios validated, and answers serialised, per native call: each call holds the GIL throughout, so
a batch in one call (~70 ms for 10,000) would stall the event loop that long; 500 take ~4 ms."""

_SCENARIOS = TypeAdapter(list[ScenarioIn])
_ANSWERS = TypeAdapter(list[RecommendationPublic])


def _body_errors(err: ValidationError, *prefix: str | int) -> RequestValidationError:
    """``err``'s errors located in the request body (under ``prefix``)."""
    return RequestValidationError([{**e, "loc": ("body", *prefix, *e["loc"])} for e in err.errors()])


def _parse(body: bytes) -> list[ScenarioIn]:
    """The batch body's scenarios, validated ``CHUNK`` at a time; ``RequestValidationError`` if bad."""
    try:
        data = json.loads(body)
    except ValueError as err:  # JSONDecodeError, or bytes that are not UTF-8
        position, reason = getattr(err, "pos", None), getattr(err, "msg", str(err))
        error = {"loc": ("body", position), "input": None, "msg": reason, "type": "json_invalid"}
        raise RequestValidationError([{**error, "ctx": {"error": reason}}]) from None
    if not (isinstance(data, dict) and data.keys() == {"scenarios"} and data["scenarios"]):
        try:  # a wrong shape or an empty list: the schema's own error
            RecommendBatchRequest.model_validate(data)
        except ValidationError as err:
            raise _body_errors(err) from None
    items, errors = data["scenarios"], []
    scenarios: list[ScenarioIn] = []
    for start in range(0, len(items), CHUNK):
        try:
            scenarios += _SCENARIOS.validate_python(items[start : start + CHUNK])
        except ValidationError as err:
            errors += [
                {**e, "loc": ("body", "scenarios", e["loc"][0] + start, *e["loc"][1:])} for e in err.errors()
            ]
    if errors:
        raise RequestValidationError(errors)
    return scenarios


def _dump(answers: list[RecommendationPublic]) -> bytes:
    """``RecommendationsPublic(data=answers, count=...)`` as JSON bytes, ``CHUNK`` answers per call."""
    parts = [_ANSWERS.dump_json(answers[i : i + CHUNK])[1:-1] for i in range(0, len(answers), CHUNK)]
    return b'{"data":[' + b",".join(parts) + b'],"count":' + str(len(answers)).encode() + b"}"


def answer_batch(body: bytes, served: Mapping[str, ServedModel], settings: Settings) -> bytes:
    """The JSON answer (``RecommendationsPublic``) to a batch request's raw ``body``; blocking, CPU-bound.

    Raises ``RequestValidationError`` (bad JSON or fields), ``InvalidFieldsError`` (too many scenarios,
    rules across fields) and the engine's errors.
    """
    scenarios = _parse(body)
    count = len(scenarios)
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
    return _dump(
        recommend_scenarios(served, scenarios, default_hardware=settings.DEFAULT_HARDWARE, locs=locs)
    )


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
