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

from ficco.features import Scenario
from ficco.features.provenance import range_note
from ficco.service.core.store import Resolution, ServedModel, resolve_hardware
from ficco.service.errors import InvalidFieldsError, UnknownHardwareError, field_error, scenario_error
from ficco.service.schemas import RecommendationPublic, ScenarioIn


def build_scenario(item: ScenarioIn, model: ServedModel, loc: Sequence[str | int]) -> Scenario:
    """``item`` as a ``features.Scenario`` on the answering model's profile; InvalidFieldsError if invalid."""
    values = item.model_dump(exclude={"hardware", "mode", "host_factor"})
    try:
        return Scenario(hardware=model.profile, **values)
    except ValueError as err:
        raise InvalidFieldsError([scenario_error(err, loc, values)]) from None


_ADDED = ("requested_hardware", "hardware_substitution", "range_note")
"""The response fields the service adds; a ``training.predict.predictor.Recommendation`` holds every other
field of ``RecommendationPublic`` under the same name."""
_COPIED = tuple(name for name in RecommendationPublic.model_fields if name not in _ADDED)


def _public(rec: Any, resolution: Resolution, scenario: Scenario) -> RecommendationPublic:
    """The response item for a ``training.predict.predictor.Recommendation`` of ``scenario`` answered under
    ``resolution``, with a note when the scenario lies far past the model's training data.

    Built without re-validation: every field comes typed from the predictor (str, float, bool).
    """
    copied = {name: getattr(rec, name) for name in _COPIED}
    note = range_note(resolution.model.predictor.card, scenario.op, scenario.m)
    return RecommendationPublic.model_construct(
        **copied,
        requested_hardware=resolution.requested,
        hardware_substitution=resolution.substitution,
        range_note=note,
    )


def _resolve(
    served: Mapping[str, ServedModel], hardware: str, world_size: int, loc: Sequence[str | int]
) -> Resolution:
    """``resolve_hardware``, with the item's location prefixed to an unknown-hardware message."""
    try:
        return resolve_hardware(served, hardware, world_size)
    except UnknownHardwareError as err:
        where = ".".join(map(str, loc[1:]))
        raise UnknownHardwareError(f"{where}: {err}" if where else str(err), err.known_ids) from None


@dataclass(frozen=True, kw_only=True, slots=True)
class _Miss:
    """An item no cache could answer: where it goes in the answer list, and what to ask which model."""

    index: int
    key: tuple
    resolution: Resolution
    scenario: Scenario


def _plan(
    served: Mapping[str, ServedModel],
    items: Sequence[ScenarioIn],
    default_hardware: str,
    locs: Sequence[Sequence[str | int]] | None,
) -> tuple[list[RecommendationPublic | None], dict[tuple[str, str, float | None], list[_Miss]]]:
    """Resolve each item's model and look it up in that model's cache: (answers so far, misses by
    (model, mode, host factor)).

    Raises ``InvalidFieldsError`` (every invalid item, and every item whose op or world size the
    answering model has no data for), ``UnknownHardwareError`` (the first item no model
    can answer) or ``NoModelError``.
    """
    locs = locs if locs is not None else [["body"]] * len(items)
    resolved: dict[tuple[str, int], Resolution] = {}
    answers: list[RecommendationPublic | None] = [None] * len(items)
    misses: dict[tuple[str, str, float | None], list[_Miss]] = {}
    errors: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        hardware = item.hardware or default_hardware
        resolution = resolved.get((hardware, item.world_size))
        if resolution is None:
            resolution = resolved[hardware, item.world_size] = _resolve(
                served, hardware, item.world_size, locs[i]
            )
        model = resolution.model
        key = (hardware, *item.cache_key())
        answers[i] = model.cache.get(key)
        if answers[i] is not None:
            continue
        unserved = model.unserved_world_size(item.world_size, served)
        if unserved is not None:
            allowed = f"one of {list(model.world_sizes)} on {model.profile.id}"
            errors.append(
                field_error([*locs[i], "world_size"], item.world_size, unserved, "not_measured", allowed)
            )
            continue
        try:
            scenario = build_scenario(item, model, locs[i])
        except InvalidFieldsError as err:
            errors.extend(err.errors)
            continue
        unmeasured = model.unmeasured(item.op)
        if unmeasured is not None:
            allowed = f"one of {list(model.ops)} on {model.profile.id}"
            errors.append(field_error([*locs[i], "op"], item.op, unmeasured, "not_measured", allowed))
            continue
        misses.setdefault((model.profile.id, item.mode, item.host_factor), []).append(
            _Miss(index=i, key=key, resolution=resolution, scenario=scenario)
        )
    if errors:
        raise InvalidFieldsError(errors)
    return answers, misses


def _fill(answers: list[RecommendationPublic | None], misses: list[_Miss], recs: Sequence[Any]) -> None:
    """Put the model's answers ``recs`` (one per miss) into ``answers`` and the model's cache."""
    for miss, rec in zip(misses, recs, strict=True):
        answers[miss.index] = answer = _public(rec, miss.resolution, miss.scenario)
        miss.resolution.model.cache.put(miss.key, answer)


def recommend_scenarios(
    served: Mapping[str, ServedModel],
    items: Sequence[ScenarioIn],
    *,
    default_hardware: str,
    locs: Sequence[Sequence[str | int]] | None = None,
) -> list[RecommendationPublic]:
    """Answer ``items`` with the models in ``served`` (one snapshot of ``ModelStore.served``).

    ``locs[i]`` is where item ``i`` sits in the request, for error locations (default ``["body"]``).
    Answers cached by the answering model are reused (keyed by the requested hardware and the scenario);
    the rest go to each model in one vectorised call (split over threads when large). Raises as ``_plan``.
    """
    answers, misses = _plan(served, items, default_hardware, locs)
    for (_, mode, host_factor), pending in misses.items():
        model = pending[0].resolution.model
        _fill(answers, pending, model.recommend_many([m.scenario for m in pending], mode, host_factor))
    return answers  # type: ignore[return-value]  # every None was filled


async def recommend_scenario(
    served: Mapping[str, ServedModel], item: ScenarioIn, *, default_hardware: str
) -> RecommendationPublic:
    """Answer one request's scenario, through the answering model's micro-batcher (same answer as
    ``recommend_scenarios``; concurrent requests share prediction calls); one that names a host factor is
    answered on its own (one decision, tens of microseconds)."""
    answers, misses = _plan(served, [item], default_hardware, None)
    for (miss,) in misses.values():
        model = miss.resolution.model
        if item.host_factor is None:
            rec = await model.batchers[item.mode].recommend(miss.scenario)
        else:
            (rec,) = model.recommend_many([miss.scenario], item.mode, item.host_factor)
        _fill(answers, [miss], [rec])
    return answers[0]  # type: ignore[return-value]  # filled above
