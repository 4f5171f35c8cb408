"""The retraining job: measure a sweep, train, compare with the current model, register, promote if better.

The measurement is passed in (``measure(plan, out_dir)``): the harness sweep on GPUs, or the simulator. With
a budget, the sweep measures the plan's most informative scenarios. See docs/training.md.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ficco.features import MODES, feature_matrix
from ficco.features.provenance import MEASURED, ModelBackend, rows_backend
from ficco.training.dataset_table import DatasetTable, load_dataset_table
from ficco.training.metrics import mean_loss, score
from ficco.training.predict.predictor import Predictor
from ficco.training.train import register_trained, train_model

if TYPE_CHECKING:
    from ficco.harness.plan import Plan


def farthest_points(Z: np.ndarray, count: int, chosen: list[int]) -> list[int]:
    """Extend ``chosen`` (row indices of ``Z`` ``[n, d]``) with ``count`` rows, each the farthest (Euclidean)
    from all rows chosen so far; the first is row 0 when nothing is chosen. Returns the added rows."""
    added: list[int] = []
    if count <= 0:
        return added
    if not chosen:
        added.append(0)
    distance = np.min([np.linalg.norm(Z - Z[i], axis=1) for i in chosen + added], axis=0)
    while len(added) < count:
        i = int(np.argmax(distance))
        if distance[i] <= 0:  # every remaining row is a duplicate of a chosen one
            break
        added.append(i)
        distance = np.minimum(distance, np.linalg.norm(Z - Z[i], axis=1))
    return added


def decision_margin(predictor: Predictor, X: np.ndarray, mode: str) -> np.ndarray:
    """Predicted log speedup of the pick over the runner-up of each scenario in ``mode``, ``[n]``
    (small: the model is unsure which schedule wins)."""
    speedups = np.nan_to_num(predictor.decide(X, [mode] * len(X)).speedups, nan=0.0)
    top2 = np.sort(speedups, axis=1)[:, -2:]
    return np.log(top2[:, 1] / np.maximum(top2[:, 0], 1e-12))


def informative_subset(plan: Plan, budget: int, predictor: Predictor | None) -> Plan:
    """The ``budget`` most informative entries of ``plan``, in plan order (docs/training.md, "Retraining");
    deterministic for a given plan and model."""
    if budget <= 0 or budget >= len(plan):
        return plan
    X = feature_matrix([s for _, s in plan])
    chosen: list[int] = []
    if predictor is not None:
        margin = np.min([decision_margin(predictor, X, mode) for mode in MODES], axis=0)
        chosen = [int(i) for i in np.argsort(margin, kind="stable")[: budget // 2]]
    spread = X.std(axis=0)
    Z = (X - X.mean(axis=0))[:, spread > 0] / spread[spread > 0]
    chosen += farthest_points(Z, budget - len(chosen), chosen)
    entries = tuple(plan.entries[i] for i in sorted(chosen))
    settings = {**plan.settings, "budget": budget, "selection": "uncertainty + farthest-point spread"}
    return dataclasses.replace(plan, entries=entries, settings=settings)


@dataclass(frozen=True, kw_only=True, slots=True)
class RetrainOutcome:
    """What the retraining job did."""

    dataset: Path
    model_id: str
    """The registry id it registered under: the hardware id, or ``<id>-sim`` for simulated rows."""
    version: str
    promoted: bool
    """Whether the new version became current."""
    reason: str
    """Why it was (not) promoted, for a person to read."""
    new_metrics: dict[str, Any]
    """The new model's held-out metrics on the new data (the evaluation summary)."""
    current_metrics: dict[str, Any] | None
    """The current model's metrics on the new data; None when there was no usable current model."""


def compare(
    table: DatasetTable, new_loss: float, current: Predictor | None, backend: ModelBackend = MEASURED
) -> tuple[bool, str, dict[str, Any] | None]:
    """Whether the new model beats ``current`` on ``table``: (better, reason, current's metrics).

    The new model's number is its held-out loss (grouped cross-validation); the current model's is its
    loss on the same scenarios, which it has not seen unless they were in its own dataset, asked at the
    host factor of the machine that measured them (the table's). ``backend`` is the new rows' kind
    (``features.provenance``): a current model of the other kind is not compared with (never better: a
    simulated model does not replace a measured one, and simulated rows do not judge a measured model).
    """
    if current is None:
        return True, "no usable current model", None
    current_backend = getattr(current, "backend", backend)
    if current_backend != backend:
        why = f"the new data is {backend} and the current model {current_backend}: models are compared on "
        return False, why + "rows of their own kind only", None
    picks = current.decide(table.X, table.modes, host_factor=table.host_factors).final
    current_loss = mean_loss(table, picks)
    metrics = score(table, picks)
    better = new_loss < current_loss
    relation = "<" if better else ">="
    reason = f"new held-out loss {new_loss:.5f} {relation} current model's {current_loss:.5f} on the new data"
    return better, reason, metrics


def retrain(
    plan: Plan,
    out_dir: str | Path,
    measure: Callable[[Plan, Path], None],
    *,
    registry: str | Path,
    current: Predictor | None,
    seed: int = 0,
    n_jobs: int = 1,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> RetrainOutcome:
    """Measure ``plan`` into ``out_dir``, train on it, register (``training.train.register_trained``), and
    promote when better than ``current``, the current model of that registry id."""
    from ficco.features.dataset import read_manifest
    from ficco.training.predict.registry import promote

    out = Path(out_dir)
    measure(plan, out)
    log(f"fingerprint: {json.dumps((read_manifest(out) or {}).get('fingerprint'), sort_keys=True)}")
    dataset = load_dataset_table(out)
    log(f"dataset {out}: {len(dataset.table)} scenarios, hash {dataset.hash[:12]}")
    trained = train_model(dataset.table, noise=dataset.noise, seed=seed, n_jobs=n_jobs, progress=progress)
    new_loss = mean_loss(dataset.table, trained.evaluation.cv.final)
    backend = rows_backend(dataset.info["backends"])
    better, reason, current_metrics = compare(dataset.table, new_loss, current, backend)
    model_id, version = register_trained(registry, trained, dataset, seed=seed)
    if better:
        promote(registry, model_id, version)
    return RetrainOutcome(
        dataset=out,
        model_id=model_id,
        version=version,
        promoted=better,
        reason=reason,
        new_metrics=trained.evaluation.summary,
        current_metrics=current_metrics,
    )
