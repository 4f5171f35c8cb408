"""Answering a ``POST /v1/recommend/batch`` body: raw JSON bytes in, the JSON answer's bytes out.

:func:`answer_batch` is the whole job, blocking and CPU-bound (~0.3-0.6 s for 10,000 scenarios on one
core): it parses and validates the body, answers through ``engine.recommend_scenarios`` (so a batch
gives the same answers as one request per scenario) and serialises the answer. The server runs it in
its batch worker process (``service.core.batch_worker``), never in the process that serves single
requests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError

from ficco.service.core.store import ServedModel
from ficco.service.engine import recommend_scenarios
from ficco.service.errors import InvalidFieldsError, field_error
from ficco.service.schemas import RecommendationPublic, RecommendBatchRequest, ScenarioIn

CHUNK = 500
"""Scenarios validated, and answers serialised, per native call, so that error locations are offset
per chunk and no single call holds the interpreter for the whole batch."""

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


def answer_batch(
    body: bytes, served: Mapping[str, ServedModel], *, max_batch: int, default_hardware: str
) -> bytes:
    """The JSON answer (``RecommendationsPublic``) to a batch request's raw ``body``; blocking, CPU-bound.

    ``max_batch`` is the most scenarios allowed (``FICCO_MAX_BATCH``); items without ``hardware`` are
    answered for ``default_hardware``. Raises ``RequestValidationError`` (bad JSON or fields),
    ``InvalidFieldsError`` (too many scenarios, rules across fields) and the engine's errors.
    """
    scenarios = _parse(body)
    count = len(scenarios)
    if count > max_batch:
        raise InvalidFieldsError(
            [
                field_error(
                    ["body", "scenarios"],
                    count,
                    f"a batch holds at most {max_batch} scenarios (FICCO_MAX_BATCH); got {count}. Split it.",
                    allowed=f"at most {max_batch} items",
                )
            ]
        )
    locs = [["body", "scenarios", i] for i in range(count)]
    return _dump(recommend_scenarios(served, scenarios, default_hardware=default_hardware, locs=locs))
