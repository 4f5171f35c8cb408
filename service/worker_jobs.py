"""The jobs of the worker processes: a request body's raw JSON bytes in, the JSON answer's bytes out.

:func:`answer_batch` (``POST /v1/recommend/batch``), :func:`answer_score_batch` (``POST
/v1/score/batch``) and :func:`answer_score` (``POST /v1/score``) parse and validate the body, answer through
``engine.recommend_scenarios`` / ``scoring`` (so a batch gives the same answers as one request per item) and
serialise the answer; ``table`` builds a schedule table (``service.tables.build_job``). Any body is refused
with a 422 naming what is wrong, whatever its shape or depth.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, TypeAdapter, ValidationError

from ficco.service.core.store import ServedModel
from ficco.service.engine import ItemErrors, answer_scenarios
from ficco.service.errors import InvalidFieldsError, field_error, from_pydantic
from ficco.service.schemas import (
    RecommendationItemPublic,
    RecommendationPublic,
    RecommendBatchRequest,
    ScenarioIn,
    ScoreBatchRequest,
    ScoreRequest,
    ScoresPublic,
)
from ficco.service.scoring import score_model, score_models
from ficco.service.tables import build_job

CHUNK = 500
"""Scenarios validated per native call, so that error locations are offset per chunk and no single call
holds the interpreter for the whole batch."""

_SCENARIOS = TypeAdapter(list[ScenarioIn])
_ITEM = TypeAdapter(RecommendationItemPublic)
_RESULT = TypeAdapter(RecommendationPublic)
_SCORES = TypeAdapter(ScoresPublic)
M = TypeVar("M", bound=BaseModel)


def read_json(body: bytes) -> Any:
    """The parsed ``body``; ``RequestValidationError`` (``json_invalid``) for bytes that are not UTF-8,
    not JSON, or nested deeper than the parser's recursion limit allows."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, not UTF-8; too deep
        position = getattr(err, "pos", None)
        reason = "nested too deeply" if isinstance(err, RecursionError) else getattr(err, "msg", str(err))
        error = {"loc": ("body", position), "input": None, "msg": reason, "type": "json_invalid"}
        raise RequestValidationError([{**error, "ctx": {"error": reason}}]) from None


def _validate(model: type[M], data: Any) -> M:
    """``model`` validated from ``data``; ``RequestValidationError`` located in the body if invalid."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in err.errors()]) from None


def _parse(body: bytes, max_batch: int) -> tuple[list[ScenarioIn | None], ItemErrors]:
    """The batch body's scenarios, validated ``CHUNK`` at a time, each on its own: (the scenarios, None
    where invalid; the invalid ones' errors by index). ``RequestValidationError`` for a body of the wrong
    shape, ``InvalidFieldsError`` for more than ``max_batch`` scenarios."""
    data = read_json(body)
    shaped = isinstance(data, dict) and data.keys() == {"scenarios"} and isinstance(data["scenarios"], list)
    if not (shaped and data["scenarios"]):  # a wrong shape or an empty list: the schema's own error
        _validate(RecommendBatchRequest, data)
    items = data["scenarios"]
    if len(items) > max_batch:
        msg = f"a batch holds at most {max_batch} scenarios (FICCO_MAX_BATCH); got {len(items)}. Split it."
        allowed = f"at most {max_batch} items"
        raise InvalidFieldsError([field_error(["body", "scenarios"], len(items), msg, allowed=allowed)])
    scenarios: list[ScenarioIn | None] = []
    errors: ItemErrors = {}
    for start in range(0, len(items), CHUNK):
        chunk = items[start : start + CHUNK]
        try:
            scenarios += _SCENARIOS.validate_python(chunk)
            continue
        except ValidationError as err:
            for e in err.errors():
                i = start + e["loc"][0]
                errors.setdefault(i, []).append(
                    from_pydantic({**e, "loc": ("body", "scenarios", i, *e["loc"][1:])})
                )
        scenarios += [
            None if start + j in errors else ScenarioIn.model_validate(x) for j, x in enumerate(chunk)
        ]
    return scenarios, errors


def _dump(answers: list[RecommendationPublic | None], errors: ItemErrors) -> bytes:
    """``RecommendationsPublic`` of a batch's ``answers`` (None where refused) and the refused items'
    ``errors`` as JSON bytes: an answered item's envelope written around its result's JSON, a refused item
    through its schema (``RecommendationItemPublic``, which validates its errors)."""
    parts = [
        _ITEM.dump_json(_refused(i, errors[i])) if answer is None
        else b'{"index":%d,"status":"ok","result":%b,"errors":null}' % (i, _RESULT.dump_json(answer))
        for i, answer in enumerate(answers)
    ]  # fmt: skip
    return b'{"data":[%b],"count":%d,"failed":%d}' % (b",".join(parts), len(answers), len(errors))


def answer_batch(
    body: bytes, served: Mapping[str, ServedModel], *, max_batch: int, default_hardware: str
) -> bytes:
    """The JSON answer (``RecommendationsPublic``: one item per scenario, answered or refused) to a batch
    request's raw ``body``; blocking, CPU-bound.

    ``max_batch`` is the most scenarios allowed (``FICCO_MAX_BATCH``); items without ``hardware`` are
    answered for ``default_hardware``. A scenario's own mistakes (a bad field, a rule across fields, a
    hardware or world size no model answers) refuse that item only. Raises ``RequestValidationError``
    (not JSON, or not a list of 1 or more scenarios), ``InvalidFieldsError`` (too many scenarios) and
    ``NoModelError``.
    """
    scenarios, errors = _parse(body, max_batch)
    valid = [i for i, item in enumerate(scenarios) if item is not None]
    locs = [["body", "scenarios", i] for i in valid]
    answers, refused = answer_scenarios(
        served, [scenarios[i] for i in valid], default_hardware=default_hardware, locs=locs
    )
    for j, errs in refused.items():
        errors[valid[j]] = errs
    answered = dict(zip(valid, answers, strict=True))
    return _dump([answered.get(i) for i in range(len(scenarios))], errors)


def _refused(index: int, errors: list[dict[str, Any]]) -> RecommendationItemPublic:
    """Item ``index`` of a batch answer: its refusal."""
    return RecommendationItemPublic.model_validate(
        {"index": index, "status": "error", "result": None, "errors": errors}
    )


def answer_score_batch(
    body: bytes, served: Mapping[str, ServedModel], *, max_batch: int, default_hardware: str
) -> bytes:
    """The JSON answer (``ScoresPublic``: one item per config, scored or refused) to a ``POST
    /v1/score/batch`` body; blocking, CPU-bound. ``max_batch`` is unused (the schema bounds the configs).

    Raises ``RequestValidationError`` (bad JSON or fields shared by every config) and the engine's errors
    that concern every config (unknown hardware, no model).
    """
    request = _validate(ScoreBatchRequest, read_json(body))
    return _SCORES.dump_json(score_models(served, request, default_hardware=default_hardware))


def answer_score(
    body: bytes, served: Mapping[str, ServedModel], *, max_batch: int, default_hardware: str
) -> bytes:
    """The JSON answer (``ScorePublic``) to a ``POST /v1/score`` body: one model config, tens of pairs, a
    few milliseconds of CPU that would otherwise compete with single recommendations for the server's
    interpreter. ``max_batch`` is unused. Raises ``RequestValidationError`` and the scoring's errors."""
    request = _validate(ScoreRequest, read_json(body))
    return score_model(served, request, default_hardware=default_hardware).model_dump_json().encode()


JOBS = {"recommend": answer_batch, "score": answer_score_batch, "score_one": answer_score, "table": build_job}
"""The batch worker's jobs by kind: ``fn(body, served, max_batch=..., default_hardware=...) -> bytes``
(``table``: a schedule table, ``service.tables``)."""
