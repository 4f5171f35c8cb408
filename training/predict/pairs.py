"""Pairs of (scenario, schedule, mode): the rows the pair models read, built with numpy alone for training
and answering alike (docs/training.md); ``training.model`` exports these names too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from ficco.features import (
    FEATURE_NAMES,
    FEATURE_SCHEMA_VERSION,
    FEATURE_SCHEMAS,
    MODES,
    SCHEDULE_INDEX,
    SCHEDULES,
    SERIAL,
    Schedule,
)
from ficco.features.label_source import LABEL_VERSION
from ficco.features.launch_cost import host_over_gpu

SERIAL_INDEX = SCHEDULE_INDEX[str(SERIAL)]

_MAX_FINER_SPLITS = FEATURE_NAMES.index("max_finer_splits")
_SPLITS = np.array([Schedule.parse(s).splits for s in SCHEDULES])
SCHEDULE_FEATURE_NAMES = ("sched_serial", "sched_shard", "sched_finer", "sched_dma", "sched_log2_splits",
                          "sched_chunk_grain", "sched_high_priority", "mode_graph")  # fmt: skip
"""The pair's columns after the scenario features: the schedule's fields, then the mode."""
HOST_FEATURE_NAME = "eager_host_over_gpu"
"""fv3's last pair column: ``features.launch_cost.host_over_gpu`` of the pair's schedule in eager mode, 0 in
graph mode (a replayed CUDA graph issues nothing from the host)."""
LABEL_VERSION_NAME = "label_version"
"""fv4's pair column before the host column: the executor label version of the row's label
(``features.label_source``; 0 for simulated rows); answers ask at the running executor's ``LABEL_VERSION``."""
PAIR_FEATURE_NAMES_OF: dict[str, tuple[str, ...]] = {
    "fv2": (*FEATURE_NAMES, *SCHEDULE_FEATURE_NAMES),
    "fv3": (*FEATURE_NAMES, *SCHEDULE_FEATURE_NAMES, HOST_FEATURE_NAME),
    "fv4": (*FEATURE_NAMES, *SCHEDULE_FEATURE_NAMES, LABEL_VERSION_NAME, HOST_FEATURE_NAME),
}
"""Column names of :func:`pair_matrix` under each feature schema of ``features.FEATURE_SCHEMAS`` (all share
the scenario vector)."""
PAIR_FEATURE_NAMES: tuple[str, ...] = PAIR_FEATURE_NAMES_OF[FEATURE_SCHEMA_VERSION]
"""Column names of :func:`pair_matrix` under the schema new models are trained on."""


def _descriptor(schedule: Schedule) -> list[float]:
    """One schedule as the first 7 of ``SCHEDULE_FEATURE_NAMES``."""
    return [
        float(schedule.granularity == "serial"),
        float(schedule.granularity == "shard"),
        float(schedule.granularity == "finer"),
        float(schedule.executor == "dma"),
        float(np.log2(schedule.splits)),
        float(schedule.grain == "chunk"),
        float(schedule.priority == "high"),
    ]


DESCRIPTORS = np.array([_descriptor(Schedule.parse(s)) for s in SCHEDULES])
"""Schedule descriptors in canonical order, float64 ``[S, 7]``."""


class FeatureSchemaError(ValueError):
    """A model was trained on a feature schema other than the one this code computes."""


def check_feature_schema(found: str, source: str, *, hardware_id: str | None = None) -> None:
    """Raise :class:`FeatureSchemaError` for a schema outside ``features.FEATURE_SCHEMAS``, naming it, the
    schemas this code computes and the command that rebuilds the model."""
    if found not in FEATURE_SCHEMAS:
        hw = hardware_id or "<hardware_id>"
        raise FeatureSchemaError(
            f"{source} was trained on feature schema {found!r}, but this code computes feature schemas "
            f"{list(FEATURE_SCHEMAS)}; its predictions would be meaningless. Rebuild it from its dataset "
            f"with `ficco train --dataset DIR --promote` (schema {FEATURE_SCHEMA_VERSION!r}), or measure "
            f"afresh with `ficco retrain --hardware {hw}`."
        )


def saved_pair_params(booster: Any, source: str) -> tuple[dict[str, Any], str]:
    """The parameters and feature schema a ``PairModel`` saved in ``booster``'s attributes (``source``: the
    file, for errors); ValueError for another model, :class:`FeatureSchemaError` for another schema."""
    kind = booster.attr("ficco_estimator")
    if kind != "PairModel":
        raise ValueError(f"{source} holds a {kind or 'foreign XGBoost'} model, not a PairModel")
    schema = booster.attr("ficco_feature_schema") or "<none>"
    check_feature_schema(schema, source)
    return json.loads(booster.attr("ficco_params")), schema


def schedule_indices(schedules: Sequence[str]) -> np.ndarray:
    """Canonical column index of each schedule string, int ``[len(schedules)]``; ValueError if unknown."""
    out = np.empty(len(schedules), dtype=np.int64)
    for i, text in enumerate(schedules):
        index = SCHEDULE_INDEX.get(text)
        if index is None:
            Schedule.parse(text)  # raises the error naming the string and the allowed forms
            raise ValueError(f"schedule {text!r} is not in the design space {list(SCHEDULES)}")
        out[i] = index
    return out


def check_modes(modes: Sequence[str]) -> np.ndarray:
    """``modes`` as a str array ``[n]``; ValueError naming the first unknown mode and the allowed ones."""
    out = np.asarray(modes, dtype=object)
    unknown = sorted(set(out.tolist()) - set(MODES))
    if unknown:
        raise ValueError(f"mode must be one of {list(MODES)}; got {unknown[0]!r}")
    return out


def check_X(X: Any) -> np.ndarray:
    """``X`` as float64 ``[n, len(FEATURE_NAMES)]``; ValueError naming the expected and found shape."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != len(FEATURE_NAMES):
        raise ValueError(
            f"X must be a 2-D array with {len(FEATURE_NAMES)} columns (features.FEATURE_NAMES, schema "
            f"{FEATURE_SCHEMA_VERSION}); got shape {X.shape}"
        )
    return X


def check_Z(Z: Any, columns: int, schema: str) -> np.ndarray:
    """Pairs ``Z`` as float32 ``[N, columns]`` (``pair_matrix`` of feature schema ``schema``); ValueError
    naming the expected and found shape."""
    Z = np.asarray(Z, dtype=np.float32)
    if Z.ndim != 2 or Z.shape[1] != columns:
        raise ValueError(
            f"Z must have {columns} columns (pair_matrix of feature schema {schema!r}); got shape {Z.shape}"
        )
    return Z


def valid_mask(X: np.ndarray) -> np.ndarray:
    """Which schedules can run each scenario, from its features: bool ``[n, S]`` (canonical order). Serial
    and shard always run; ``finer/sN`` exactly when ``N <= max_finer_splits`` (:meth:`Schedule.check`)."""
    return _SPLITS[None, :] <= check_X(X)[:, _MAX_FINER_SPLITS, None]


def pair_matrix(
    X: Any,
    modes: Sequence[str],
    valid: np.ndarray | None = None,
    *,
    schema: str = FEATURE_SCHEMA_VERSION,
    host_factor: float | np.ndarray = 1.0,
    label_version: float | np.ndarray = LABEL_VERSION,
) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of every scenario row with every valid schedule.

    ``X`` ``[n, F]`` scenario features, ``modes`` ``[n]``, ``valid`` bool ``[n, S]`` (default
    :func:`valid_mask`), ``schema`` one of :data:`PAIR_FEATURE_NAMES_OF` (a loaded model's own),
    ``host_factor`` the machine's, or each row's ``[n]`` (``features.launch_cost.host_over_gpu``; fv3's eager
    pairs), ``label_version`` the executor label version asked for, or each row's ``[n]`` (fv4; default: the
    running executor's). Returns the pair matrix float32 ``[N, len(PAIR_FEATURE_NAMES_OF[schema])]``
    (float32: what XGBoost compares its thresholds with) and ``(row, schedule column)`` of each pair, int
    ``[2, N]``.
    """
    X = check_X(X)
    eager = check_modes(modes) == "eager"
    valid = valid_mask(X) if valid is None else valid
    rows, cols = np.nonzero(valid)
    names = PAIR_FEATURE_NAMES_OF[schema]
    # each block cast to float32 as it is written: no float64 copy of the whole matrix
    Z = np.empty((len(rows), len(names)), dtype=np.float32)
    f, d = X.shape[1], DESCRIPTORS.shape[1]
    Z[:, :f] = X.astype(np.float32)[rows]
    Z[:, f : f + d] = DESCRIPTORS.astype(np.float32)[cols]
    Z[:, f + d] = ~eager[rows]
    if LABEL_VERSION_NAME in names:
        version = np.asarray(label_version, dtype=np.float64)
        Z[:, names.index(LABEL_VERSION_NAME)] = version[rows] if version.ndim else version
    if HOST_FEATURE_NAME in names:
        host = host_over_gpu(X, host_factor)[rows, cols]
        Z[:, names.index(HOST_FEATURE_NAME)] = np.where(eager[rows], host, 0.0)
    return Z, np.stack([rows, cols])
