"""Answering scenarios: pick the model per hardware, build the ``Scenario``, ask the model (or its cache).

The routes, ``ficco recommend`` and ``ficco score`` all answer through :func:`recommend_scenarios` (or,
for a single request on the server, :func:`recommend_scenario`, which shares prediction calls between
concurrent requests), so a batch gives the same answers as one request per scenario, and the commands
the same as the server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from ficco.features import Scenario
from ficco.features.provenance import range_note
from ficco.service.core.store import Resolution, ServedModel, known_ids, resolve_hardware
from ficco.service.errors import (
    InvalidFieldsError,
    NotServedError,
    UnknownHardwareError,
    field_error,
    scenario_error,
)
from ficco.service.schemas import RecommendationPublic, ScenarioIn, substitution_public

_SCENARIO_FIELDS = tuple(f for f in ScenarioIn.model_fields if f not in ("hardware", "mode", "host_factor"))
"""The request fields a ``features.Scenario`` holds under the same name."""


def build_scenario(
    item: ScenarioIn, model: ServedModel, world_size: int, loc: Sequence[str | int]
) -> Scenario:
    """``item`` at ``world_size`` (the resolved one) as a ``features.Scenario`` on the answering model's
    profile; InvalidFieldsError if invalid."""
    values = {name: getattr(item, name) for name in _SCENARIO_FIELDS}
    values["world_size"] = world_size
    try:
        return Scenario(hardware=model.profile, **values)
    except ValueError as err:
        raise InvalidFieldsError([scenario_error(err, loc, values)]) from None


_ADDED = ("world_size", "requested_hardware", "hardware_substitution", "substitution", "range_note")
"""The response fields the service adds; a ``training.predict.predictor.Recommendation`` holds every other
field of ``RecommendationPublic`` under the same name."""
_COPIED = tuple(name for name in RecommendationPublic.model_fields if name not in _ADDED)


_PUBLIC = TypeAdapter(list[RecommendationPublic])
"""Response items validated from their fields in one call (about half the time per item of building each)."""


def _public_fields(rec: Any, resolution: Resolution, scenario: Scenario) -> dict[str, Any]:
    """The fields of the response item for a ``training.predict.predictor.Recommendation`` of ``scenario``
    answered under ``resolution``, with a note when the scenario lies far past the model's training data."""
    fields = {name: getattr(rec, name) for name in _COPIED}
    sub = resolution.substitution
    fields.update(
        world_size=resolution.world_size,
        requested_hardware=resolution.requested,
        hardware_substitution=None if sub is None else sub.reason,
        substitution=substitution_public(resolution.requested, resolution.world_size, sub),
        range_note=range_note(resolution.model.predictor.card, scenario.op, scenario.m),
    )
    return fields


@dataclass(frozen=True, kw_only=True, slots=True)
class _Miss:
    """An item no cache could answer: where it goes in the answer list, and what to ask which model."""

    index: int
    key: tuple
    resolution: Resolution
    scenario: Scenario


ItemErrors = dict[int, list[dict[str, Any]]]
"""Index of a refused item -> its error items (``errors.field_error``)."""


def _resolve(
    served: Mapping[str, ServedModel], item: ScenarioIn, hardware: str, loc: Sequence[str | int]
) -> Resolution | list[dict[str, Any]]:
    """``resolve_hardware`` for ``item``, or its refusal as error items located in the request: a known
    hardware no model answers at the world size is a 422 at ``world_size``; an unknown id one of type
    ``unknown_hardware`` at ``hardware`` (which a single request answers 404: :func:`_raise`)."""
    try:
        return resolve_hardware(served, hardware, item.world_size)
    except NotServedError as err:
        return [err.at([*loc, "world_size"], item.world_size)]
    except UnknownHardwareError as err:
        allowed = f"one of {err.known_ids}"
        return [field_error([*loc, "hardware"], hardware, str(err), "unknown_hardware", allowed)]


def _plan(
    served: Mapping[str, ServedModel],
    items: Sequence[ScenarioIn],
    default_hardware: str,
    locs: Sequence[Sequence[str | int]] | None,
) -> tuple[list[RecommendationPublic | None], dict[tuple[str, str, float | None], list[_Miss]], ItemErrors]:
    """Resolve each item's model and look it up in that model's cache: (answers so far, misses by
    (model, mode, host factor), the refused items' errors). Raises ``NoModelError`` when no model is
    loaded."""
    locs = locs if locs is not None else [["body"]] * len(items)
    resolved: dict[tuple[str, int | None], Resolution | list[dict[str, Any]]] = {}
    answers: list[RecommendationPublic | None] = [None] * len(items)
    misses: dict[tuple[str, str, float | None], list[_Miss]] = {}
    errors: ItemErrors = {}
    for i, item in enumerate(items):
        hardware = item.hardware or default_hardware
        resolution = resolved.get((hardware, item.world_size))
        if resolution is None:
            resolution = resolved[hardware, item.world_size] = _resolve(served, item, hardware, locs[i])
        if isinstance(resolution, list):  # refused: the first item's location is replaced by this one's
            errors[i] = [_moved(e, locs[i]) for e in resolution]
            continue
        model = resolution.model
        key = (hardware, *item.cache_key())
        answers[i] = model.cache.get(key)
        if answers[i] is not None:
            continue
        try:
            scenario = build_scenario(item, model, resolution.world_size, locs[i])
        except InvalidFieldsError as err:
            errors[i] = err.errors
            continue
        unmeasured = model.unmeasured(item.op)
        if unmeasured is not None:
            allowed = f"one of {list(model.ops)} on {model.profile.id}"
            errors[i] = [field_error([*locs[i], "op"], item.op, unmeasured, "not_measured", allowed)]
            continue
        misses.setdefault((model.profile.id, item.mode, item.host_factor), []).append(
            _Miss(index=i, key=key, resolution=resolution, scenario=scenario)
        )
    return answers, misses, errors


def _moved(error: dict[str, Any], loc: Sequence[str | int]) -> dict[str, Any]:
    """``error`` (of an item at some location) at item location ``loc``, its field name kept."""
    if list(error["loc"][: len(loc)]) == list(loc):
        return error
    return field_error(
        [*loc, error["loc"][-1]], error["input"], error["msg"], error["type"], error["allowed"]
    )


def _fill(answers: list[RecommendationPublic | None], misses: list[_Miss], recs: Sequence[Any]) -> None:
    """Put the model's answers ``recs`` (one per miss) into ``answers`` and the model's cache."""
    fields = [_public_fields(rec, m.resolution, m.scenario) for m, rec in zip(misses, recs, strict=True)]
    for miss, answer in zip(misses, _PUBLIC.validate_python(fields), strict=True):
        answers[miss.index] = answer
        miss.resolution.model.cache.put(miss.key, answer)


def answer_scenarios(
    served: Mapping[str, ServedModel],
    items: Sequence[ScenarioIn],
    *,
    default_hardware: str,
    locs: Sequence[Sequence[str | int]] | None = None,
) -> tuple[list[RecommendationPublic | None], ItemErrors]:
    """Answer ``items`` with the models in ``served`` (one snapshot of ``ModelStore.served``), each on its
    own: (the answers, None where refused; the refused items' errors by index).

    ``locs[i]`` is where item ``i`` sits in the request, for error locations (default ``["body"]``).
    Answers cached by the answering model are reused (keyed by the requested hardware and the scenario);
    the rest go to each model in one vectorised call (split over threads when large). Raises
    ``NoModelError`` when no model is loaded.
    """
    answers, misses, errors = _plan(served, items, default_hardware, locs)
    for (_, mode, host_factor), pending in misses.items():
        model = pending[0].resolution.model
        _fill(answers, pending, model.recommend_many([m.scenario for m in pending], mode, host_factor))
    return answers, errors


def raise_refused(errors: ItemErrors, served: Mapping[str, ServedModel]) -> None:
    """Raise the refusal of a request whose items all must be answered: ``UnknownHardwareError`` (404, with
    the hardware ids ``served`` knows) for the first unknown hardware id, else ``InvalidFieldsError`` (422)
    naming every refused item's fields."""
    flat = [e for i in sorted(errors) for e in errors[i]]
    unknown = next((e for e in flat if e["type"] == "unknown_hardware"), None)
    if unknown is not None:
        raise UnknownHardwareError(unknown["msg"], known_ids(served))
    if flat:
        raise InvalidFieldsError(flat)


def recommend_scenarios(
    served: Mapping[str, ServedModel],
    items: Sequence[ScenarioIn],
    *,
    default_hardware: str,
    locs: Sequence[Sequence[str | int]] | None = None,
) -> list[RecommendationPublic]:
    """:func:`answer_scenarios` for a request that needs every item answered (one scenario, a model
    config's pairs): raises as :func:`raise_refused` when any is refused."""
    answers, errors = answer_scenarios(served, items, default_hardware=default_hardware, locs=locs)
    raise_refused(errors, served)
    return answers  # type: ignore[return-value]  # every None was refused


async def recommend_scenario(
    served: Mapping[str, ServedModel], item: ScenarioIn, *, default_hardware: str
) -> RecommendationPublic:
    """Answer one request's scenario, through the answering model's micro-batcher (same answer as
    ``recommend_scenarios``; requests that arrive in the same turn of the event loop share one prediction
    call); one that names a host factor is answered on its own, at once."""
    answers, misses, errors = _plan(served, [item], default_hardware, None)
    raise_refused(errors, served)
    for (miss,) in misses.values():
        model = miss.resolution.model
        if item.host_factor is None:
            rec = await model.batchers[item.mode].recommend(miss.scenario)
        else:
            (rec,) = model.recommend_many([miss.scenario], item.mode, item.host_factor)
        _fill(answers, [miss], [rec])
    return answers[0]  # type: ignore[return-value]  # filled above
