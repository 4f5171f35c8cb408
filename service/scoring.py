"""Scoring a model config: its layers' communication + GEMM pairs, their schedules and projected savings.

``POST /v1/score`` and ``ficco score`` both call :func:`score_model`. The model predicts a speedup over
serial per pair; the time it saves needs a serial time, estimated here by the roofline of
``features.vector`` (GEMM: max(FLOPs / peak, bytes / HBM bandwidth); communication: bytes / link
bandwidth), so savings are projections, not measurements; the answer says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from ficco.features import roofline_comm_us, roofline_gemm_us
from ficco.features.model_config import LayerPair, ModelConfig, layer_pairs, quantization_note
from ficco.features.provenance import range_note
from ficco.service.core.store import Resolution, ServedModel, resolve_hardware
from ficco.service.engine import recommend_scenarios
from ficco.service.errors import InvalidFieldsError, NotServedError, encodable, field_error, rule_error
from ficco.service.schemas import (
    NamedConfig,
    PairScore,
    RecommendationPublic,
    ScenarioIn,
    ScenarioPublic,
    ScoreBatchRequest,
    ScoreItemPublic,
    ScorePublic,
    ScoreRequest,
    ScoreSettings,
    ScoresPublic,
    TokenScore,
    substitution_public,
)

ESTIMATE_NOTE = (
    "serial_us is the roofline serial time of one call (features.roofline_gemm_us + roofline_comm_us), "
    "not a measurement; predicted_us = serial_us / predicted_speedup; saved_us_per_step counts one "
    "forward pass, each pair counted in the layers it runs in (layers)."
)


MAX_LAYERS = 10_000
"""Most ``num_hidden_layers`` accepted (the largest models have ~130)."""


def model_name(named: NamedConfig) -> str:
    """The name a config is answered under: the request's, else its ``_name_or_path``, else ``model``;
    lone surrogates (valid JSON escapes that UTF-8 cannot encode) escaped (``errors.encodable``)."""
    name = named.name or named.config.get("_name_or_path") or "model"
    return encodable(str(name))


def parse_config(request: ScoreRequest) -> ModelConfig:
    """The request's Hugging Face config as a ``ModelConfig``; InvalidFieldsError at ``config`` if bad."""
    try:
        config = ModelConfig.from_hf_dict(model_name(request), request.config)
    except (ValueError, KeyError, TypeError) as err:
        raise InvalidFieldsError([field_error(["body", "config"], request.config, str(err))]) from None
    layers = config.num_hidden_layers
    if layers > MAX_LAYERS:
        msg = f"num_hidden_layers must be at most {MAX_LAYERS}; got {layers}"
        error = field_error(
            ["body", "config", "num_hidden_layers"], layers, msg, allowed=f"an int in [1, {MAX_LAYERS}]"
        )
        raise InvalidFieldsError([error])
    return config


def _error_loc(message: str, request: ScoreRequest, i: int, tp: int) -> tuple[list[str | int], object]:
    """Which request field a ``layer_pairs`` error is about: the token count, tp, or the config."""
    if message.startswith("tokens") or "Scenario.m " in message:
        return ["body", "tokens", i], request.tokens[i]
    if "Scenario.world_size" in message or "by tp=" in message or "of tp=" in message:
        return ["body", "tp"], tp
    return ["body", "config"], request.config


def _pairs(config: ModelConfig, request: ScoreRequest, model: ServedModel, tp: int) -> list[list[LayerPair]]:
    """Each token count's layer pairs at ``tp`` ranks on the answering model's profile, or
    InvalidFieldsError."""
    out, errors = [], []
    for i, tokens in enumerate(request.tokens):
        try:
            out.append(
                layer_pairs(
                    config,
                    tp=tp,
                    tokens=tokens,
                    dtype=request.dtype,
                    hardware=model.profile,
                    kv_layout=request.kv_layout,
                )
            )
        except ValueError as err:
            errors.append(rule_error(*_error_loc(str(err), request, i, tp), str(err)))
    if errors:
        raise InvalidFieldsError(errors)
    return out


def _fields(pair: LayerPair) -> dict[str, object]:
    """The pair's scenario as plain fields, without the hardware profile."""
    fields = pair.scenario.to_dict()
    del fields["hardware"]
    return fields


def _item(pair: LayerPair, hardware: str, mode: str, host_factor: float | None) -> ScenarioIn:
    try:
        return ScenarioIn(**_fields(pair), hardware=hardware, mode=mode, host_factor=host_factor)
    except ValidationError as err:
        raise InvalidFieldsError([field_error(["body", "config"], pair.name, str(err))]) from None


NOT_MEASURED = "not measured"
"""The schedule shown for a pair whose op the model has no measured data for."""
_UNMEASURED = {"measured": False, "schedule": NOT_MEASURED, "predicted_speedup": None, "fallback": True}
"""The answer fields of a pair whose op the model has no measured data for."""
_ANSWERED = tuple(name for name in PairScore.model_fields if name in RecommendationPublic.model_fields)
"""The fields of a ``PairScore`` that the model's answer gives (those the two schemas share)."""


def _score(pair: LayerPair, rec: RecommendationPublic | None, reason: str | None = None) -> PairScore:
    """The pair with the model's answer ``rec`` and its roofline serial time, and with a predicted speedup
    the predicted time and the saving per layer (None without one). ``rec`` None: a pair the model cannot
    answer (``reason``): its serial time counts, no schedule and no saving are projected."""
    s = pair.scenario
    serial_us = roofline_gemm_us(s) + roofline_comm_us(s)
    if rec is None:
        answer = {**_UNMEASURED, "fallback_reason": reason}
    else:
        answer = {"measured": True, **{name: getattr(rec, name) for name in _ANSWERED}}
    speedup = answer.get("predicted_speedup")
    predicted_us = serial_us / speedup if speedup else None
    return PairScore(
        name=pair.name,
        per_layer=pair.per_layer,
        layers=pair.layers,
        scenario=ScenarioPublic(**_fields(pair)),
        **answer,
        serial_us=serial_us,
        predicted_us=predicted_us,
        saved_us_per_layer=None if predicted_us is None else (serial_us - predicted_us) * pair.per_layer,
    )


def _token_score(tokens: int, pairs: list[PairScore], layers: int, note: str | None = None) -> TokenScore:
    """One token count's totals over the model's ``layers`` layers: a step counts each pair in the layers it
    runs in (``PairScore.layers``), and the per-layer figures are the step's over ``layers`` (an MoE model's
    dense and expert layers run different pairs, so no single layer holds them all)."""
    serial = sum(p.serial_us * p.per_layer * p.layers for p in pairs)
    saved = sum((p.saved_us_per_layer or 0.0) * p.layers for p in pairs)
    return TokenScore(
        tokens=tokens,
        pairs=pairs,
        serial_us_per_layer=serial / layers,
        saved_us_per_layer=saved / layers,
        saved_us_per_step=saved,
        saved_fraction=saved / serial if serial > 0 else 0.0,
        range_note=note,
    )


def resolve_settings(
    served: Mapping[str, ServedModel], settings: ScoreSettings | ScoreRequest, *, default_hardware: str
) -> Resolution:
    """The model that answers a score request's settings (its hardware at its ``tp``, every config alike):
    raises ``UnknownHardwareError`` (404), ``InvalidFieldsError`` at ``tp`` for a known hardware no model
    answers at that world size (422) or ``NoModelError``."""
    try:
        return resolve_hardware(served, settings.hardware or default_hardware, settings.tp)
    except NotServedError as err:
        raise InvalidFieldsError([err.at(["body", "tp"], settings.tp)]) from None


def score_model(
    served: Mapping[str, ServedModel], request: ScoreRequest, *, default_hardware: str
) -> ScorePublic:
    """Score ``request``'s model config at each token count with the models in ``served``.

    Raises ``InvalidFieldsError`` (bad config, a world size no model answers, or tp/tokens the layers
    cannot split), ``UnknownHardwareError`` or ``NoModelError``.
    """
    hardware = request.hardware or default_hardware
    config = parse_config(request)
    resolution = resolve_settings(served, request, default_hardware=default_hardware)
    model, tp = resolution.model, resolution.world_size
    per_tokens = _pairs(config, request, model, tp)
    measured = [pair for pairs in per_tokens for pair in pairs if model.unmeasured(pair.scenario.op) is None]
    items = [_item(pair, hardware, request.mode, request.host_factor) for pair in measured]
    recs = iter(recommend_scenarios(served, items, default_hardware=default_hardware))

    def pair_score(pair: LayerPair) -> PairScore:
        reason = model.unmeasured(pair.scenario.op)
        return _score(pair, None, reason) if reason else _score(pair, next(recs))

    card = model.predictor.card
    data = [
        _token_score(
            tokens,
            [pair_score(pair) for pair in pairs],
            config.num_hidden_layers,
            next((n for p in pairs if (n := range_note(card, p.scenario.op, p.scenario.m))), None),
        )
        for tokens, pairs in zip(request.tokens, per_tokens, strict=True)
    ]
    sub = resolution.substitution
    return ScorePublic(
        model=config.name,
        layers=config.num_hidden_layers,
        tp=tp,
        dtype=request.dtype,
        mode=request.mode,
        model_version=resolution.model.version,
        hardware_id=resolution.model.profile.id,
        model_backend=resolution.model.backend,
        sim_fidelity=resolution.model.predictor.card.get("sim_fidelity"),
        requested_hardware=resolution.requested,
        hardware_substitution=None if sub is None else sub.reason,
        substitution=substitution_public(resolution.requested, tp, sub),
        config_note=quantization_note(request.config, request.dtype),
        serial_time_estimate="roofline",
        estimate_note=ESTIMATE_NOTE,
        data=data,
        count=len(data),
    )


def score_item(
    served: Mapping[str, ServedModel],
    settings: Mapping[str, Any],
    named: NamedConfig,
    index: int,
    *,
    default_hardware: str,
) -> ScoreItemPublic:
    """Config ``index`` of a batch scored with the batch's ``settings`` (``ScoreSettings`` fields): status
    ``ok`` with ``score_model``'s answer, or ``error`` with its ``InvalidFieldsError`` items, located at
    ``body.configs.<index>``. Other errors (unknown hardware, no model) concern every config and are
    raised."""
    one = ScoreRequest.model_construct(**settings, config=named.config, name=named.name)
    try:
        result = score_model(served, one, default_hardware=default_hardware)
    except InvalidFieldsError as err:
        return failed_item(index, model_name(one), [_in_batch(e, index) for e in err.errors])
    return ScoreItemPublic(index=index, name=result.model, status="ok", result=result, errors=None)


def failed_item(index: int, name: str, errors: list[dict[str, Any]]) -> ScoreItemPublic:
    """A refused config of a batch: ``errors`` are ``errors.field_error`` items."""
    return ScoreItemPublic.model_validate(
        {"index": index, "name": name, "status": "error", "result": None, "errors": errors}
    )


def scores(items: list[ScoreItemPublic]) -> ScoresPublic:
    """The batch answer of ``items``, with the count of refused ones."""
    failed = sum(item.status == "error" for item in items)
    return ScoresPublic(data=items, count=len(items), failed=failed)


def score_models(
    served: Mapping[str, ServedModel], request: ScoreBatchRequest, *, default_hardware: str
) -> ScoresPublic:
    """Score every config of ``request`` alike (``score_item`` each): one item per config, scored or
    refused with its reasons, so one bad config does not stop the others. What every config shares (the
    hardware and world size no model answers) is refused once, as ``resolve_settings`` raises."""
    resolve_settings(served, request, default_hardware=default_hardware)
    settings = request.model_dump(exclude={"configs"})
    return scores(
        [
            score_item(served, settings, named, i, default_hardware=default_hardware)
            for i, named in enumerate(request.configs)
        ]
    )


def _in_batch(error: dict[str, Any], i: int) -> dict[str, Any]:
    """A one-config error moved to config ``i`` of a batch (``body.config`` -> ``body.configs.i.config``)."""
    loc = list(error["loc"])
    if loc[:2] != ["body", "config"]:
        return error
    loc = ["body", "configs", i, *loc[1:]]
    return {**error, "loc": loc, "field": ".".join(str(part) for part in loc[1:])}
