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
from ficco.features.provenance import MEASURED, ModelBackend, registry_id, rows_backend
from ficco.training.dataset_table import DatasetTable, LoadedDataset, load_dataset_table
from ficco.training.metrics import mean_loss, score
from ficco.training.predict.predictor import Predictor
from ficco.training.priors import Prior, PriorFit, fit_with_prior
from ficco.training.sweep_order import measurement_order, scenario_uncertainty
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

    out = Path(out_dir)
    measure(plan, out)
    log(f"fingerprint: {json.dumps((read_manifest(out) or {}).get('fingerprint'), sort_keys=True)}")
    dataset = load_dataset_table(out)
    log(f"dataset {out}: {len(dataset.table)} scenarios, hash {dataset.hash[:12]}")
    trained = train_model(dataset.table, noise=dataset.noise, seed=seed, n_jobs=n_jobs, progress=progress)
    return conclude(
        out, dataset, mean_loss(dataset.table, trained.evaluation.cv.final), current,
        register=lambda: register_trained(registry, trained, dataset, seed=seed), registry=registry,
        new_metrics=trained.evaluation.summary,
    )  # fmt: skip


def conclude(
    out: Path,
    dataset: LoadedDataset,
    new_loss: float,
    current: Predictor | None,
    *,
    register: Callable[[], tuple[str, str]],
    registry: str | Path,
    new_metrics: dict,
) -> RetrainOutcome:
    """The end of a retrain: compare the new model's held-out loss ``new_loss`` with ``current`` on the new
    rows (:func:`compare`), ``register`` it (a callable giving ``(registry id, version)``), promote it under
    ``registry`` when better, and say so as a :class:`RetrainOutcome`."""
    from ficco.training.predict.registry import promote

    backend = rows_backend(dataset.info["backends"])
    better, reason, current_metrics = compare(dataset.table, new_loss, current, backend)
    model_id, version = register()
    if better:
        promote(registry, model_id, version)
    return RetrainOutcome(
        dataset=out,
        model_id=model_id,
        version=version,
        promoted=better,
        reason=reason,
        new_metrics=new_metrics,
        current_metrics=current_metrics,
    )


CHECKPOINT_MINUTES = 1.0
"""Device-minutes measured before the first checkpoint of a budgeted sweep; the next come at twice, four
times, ... that, and at the budget."""
PRIOR_DIR = "prior"
"""Folder of a budgeted sweep's dataset that holds its prior (``training.priors.Prior.save``) and the
simulated sweeps it was built from."""
CHECKPOINT_DIR = "checkpoints"
"""Folder of a budgeted sweep's dataset that holds a model registry of its checkpoints."""
ORDER_FILE = "order.json"
"""The order a budgeted sweep measures its plan in (scenario ids, estimated seconds, uncertainty)."""


def prior_datasets(registry: str | Path, hardware_id: str) -> list[Path]:
    """The measured datasets behind the current models of other machines in ``registry`` (their cards'
    ``dataset.path``, read from the checkout when relative), those that exist: a new machine's default
    prior."""
    from ficco.files import SHIPPED
    from ficco.training.predict.registry import list_models

    out: list[Path] = []
    for model_id, cards in list_models(registry).items():
        current = [c for c in cards if c.get("current")] or []
        if model_id == hardware_id or not current or current[0].get("model_backend", "measured") != MEASURED:
            continue
        for part in str(current[0].get("dataset", {}).get("path", "")).split(" + "):
            path = Path(part) if Path(part).is_absolute() else SHIPPED / part
            if part and (path / "manifest.json").is_file() and path not in out:
                out.append(path)
    return out


def simulated_table(plan: Plan, hardware: Any, out: Path) -> DatasetTable:
    """The simulator's rows of ``plan`` on ``hardware`` (a noiseless sweep into ``out``, resumed if there)."""
    from ficco.harness.sim import SimBackend
    from ficco.harness.sweep import run_sweep

    run_sweep(plan, SimBackend(hardware, seed=0, noise=0.0), out, progress=False)
    return load_dataset_table(out).table


def load_prior(
    plan: Plan,
    out_dir: Path,
    *,
    datasets: list[Path],
    seed: int = 0,
    n_jobs: int = 1,
    log: Callable[[str], None] = print,
) -> Prior:
    """The prior of ``plan``'s machine (``training.priors.build_prior``) from the measured ``datasets`` of
    other machines and the simulator (the plan on the new machine, each dataset's scenarios on its own), saved
    in ``out_dir/prior`` and read from there when a sweep resumes."""
    from ficco.harness.plan import Plan as PlanType
    from ficco.training.priors import Prior, build_prior

    folder = out_dir / PRIOR_DIR
    if (folder / "prior.json").is_file():
        prior = Prior.load(folder)
        log(f"prior: read from {folder} ({prior.describe()})")
        return prior
    hardware = plan[0][1].hardware
    simulated = {f"{hardware.id}-sim (the plan)": simulated_table(plan, hardware, folder / "sim-plan")}
    measured = {}
    for path in datasets:
        loaded = load_dataset_table(path)
        measured[str(path)] = loaded.table
        first = np.unique(loaded.table.scenario_ids, return_index=True)[1]
        entries = tuple((loaded.table.families[i], loaded.table.scenarios[i]) for i in sorted(first))
        name = f"{loaded.hardware.id}-sim ({path.name})"
        simulated[name] = simulated_table(
            PlanType(entries=entries), loaded.hardware, folder / f"sim-{path.name}"
        )
    X = feature_matrix([s for _, s in plan])
    prior = build_prior(
        hardware.id,
        measured=measured,
        simulated=simulated,
        plan_X=np.concatenate([X] * len(MODES)),
        plan_modes=np.repeat(np.asarray(MODES, dtype=object), len(X)),
        seed=seed,
        n_jobs=n_jobs,
    )
    prior.save(folder)
    log(f"prior: {', '.join(prior.components)} from {prior.describe()} -> {folder}")
    return prior


def ordered(plan: Plan, prior: Prior | None) -> tuple[Plan, np.ndarray]:
    """``plan`` in the order its sweep measures it (``training.sweep_order``: the prior's uncertainty and
    the spread over the plan; without a prior, the spread alone), and each scenario's uncertainty ``[n]``."""
    X = feature_matrix([s for _, s in plan])
    value = np.zeros(len(X)) if prior is None else scenario_uncertainty(X, prior, prior.host_factor)
    order = measurement_order(X, value)
    settings = {
        **plan.settings,
        "order": "training.sweep_order: the prior's uncertainty x spread over the plan",
    }
    entries = tuple(plan.entries[i] for i in order)
    return dataclasses.replace(plan, entries=entries, settings=settings), value[order]


def write_order(plan: Plan, prior: Prior | None, out: Path) -> tuple[Plan, list[float]]:
    """``plan`` :func:`ordered`, written to ``out/order.json`` (scenario ids in order, the simulator's
    estimate of each one's device seconds, its uncertainty, the prior), and those estimates ``[n]``."""
    from ficco.harness.dataset import write_json_atomic
    from ficco.harness.plan import scenario_seconds

    plan, value = ordered(plan, prior)
    costs = scenario_seconds(plan, plan[0][1].hardware)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / ORDER_FILE, {
        "hardware_id": plan[0][1].hardware.id,
        "order": [s.key() for _, s in plan],
        "estimated_seconds": [round(c, 3) for c in costs],
        "uncertainty": [round(float(v), 5) for v in value],
        "prior": None if prior is None else prior.info(),
    })  # fmt: skip
    return plan, costs


def device_seconds(out: Path, estimates: dict[str, float] | None) -> float:
    """Device seconds a sweep in ``out`` has spent: its manifest's measuring seconds, or with ``estimates``
    (scenario id -> seconds: a simulated sweep, whose own seconds are the simulator's) theirs of the
    scenarios it finished."""
    from ficco.features.dataset import read_manifest

    manifest = read_manifest(out)
    if manifest is None:
        return 0.0
    if estimates is None:
        return float(manifest["seconds"])
    return float(sum(estimates.get(sid, 0.0) for sid in manifest["finished"]))


def checkpoint_marks(first_minutes: float, budget_minutes: float) -> list[float]:
    """Device seconds after which a budgeted sweep trains a checkpoint: ``first_minutes``, then doubling,
    then the budget."""
    marks, mark = [], first_minutes
    while first_minutes > 0 and mark < budget_minutes:
        marks.append(mark * 60.0)
        mark *= 2
    return [*marks, budget_minutes * 60.0]


def retrain_within(
    plan: Plan,
    out_dir: str | Path,
    measure: Callable[[Plan, Path, float | None], None],
    *,
    budget_minutes: float,
    prior: Prior | None,
    registry: str | Path,
    current: Predictor | None,
    simulated: bool,
    checkpoint_minutes: float = CHECKPOINT_MINUTES,
    seed: int = 0,
    n_jobs: int = 1,
    log: Callable[[str], None] = print,
) -> RetrainOutcome:
    """Measure ``plan`` in the order of what it teaches until ``budget_minutes`` of device time, training a
    checkpoint (``training.priors.fit_with_prior`` on top of ``prior``) into ``out_dir/checkpoints`` at
    every mark of :func:`checkpoint_marks`; then register the last and promote it when better than
    ``current``. ``measure(plan, out, deadline)`` sweeps a plan's unfinished scenarios in plan order, starting
    none after ``deadline`` (``time.time()``). A scenario that would not fit in what is left of the budget
    (by the simulator's estimate) is not started. Run again on the same ``out_dir``, it continues: the same
    order, the device time already spent counted (the manifest's; a simulated sweep's: the estimates of what
    it finished)."""
    import time

    from ficco.features.dataset import read_manifest

    out = Path(out_dir)
    plan, costs = write_order(plan, prior, out)
    keys = [s.key() for _, s in plan]
    estimates = dict(zip(keys, costs, strict=True))
    budget = budget_minutes * 60.0
    spend = (lambda: device_seconds(out, estimates)) if simulated else (lambda: device_seconds(out, None))
    spent = spend()
    fit, dataset = None, None
    for mark in checkpoint_marks(checkpoint_minutes, budget_minutes):
        if spent >= mark:
            continue
        finished = set((read_manifest(out) or {}).get("finished", []))
        todo = [i for i, k in enumerate(keys) if k not in finished]
        room = np.cumsum([estimates[keys[i]] for i in todo])
        count = int(np.searchsorted(room, mark - spent, side="right"))
        if not todo or (count == 0 and room[0] > budget - spent):
            break  # everything measured, or the next scenario does not fit in the budget
        last = todo[max(count, 1) - 1]
        measure(
            dataclasses.replace(plan, entries=plan.entries[: last + 1]), out, time.time() + budget - spent
        )
        now = spend()
        if len((read_manifest(out) or {}).get("finished", [])) == len(finished):
            log(
                f"nothing was measured in the last step (spent {now / 60:.2f} of {budget_minutes:g} min): "
                "stopping"
            )
            break
        spent = now
        dataset = load_dataset_table(out)
        fit = fit_with_prior(dataset.table, prior, seed=seed, n_jobs=n_jobs)
        _, version = _register_fit(out / CHECKPOINT_DIR, fit, dataset, seed=seed, minutes=spent / 60.0)
        log(f"checkpoint {version}: {len(set(dataset.table.scenario_ids))} scenarios, {spent / 60:.2f} of "
            f"{budget_minutes:g} device-minutes, {fit.label} -> {out / CHECKPOINT_DIR}")  # fmt: skip
    if dataset is None:
        if read_manifest(out) is None:
            raise ValueError(
                f"nothing measured: the first scenario of the order needs about {costs[0] / 60:.2f} "
                f"device-minutes and the budget is {budget_minutes:g}"
            )
        dataset = load_dataset_table(out)
        fit = fit_with_prior(dataset.table, prior, seed=seed, n_jobs=n_jobs)
    log(f"dataset {out}: {len(set(dataset.table.scenario_ids))} scenarios, {spent / 60:.2f} device-minutes")
    return conclude(
        out, dataset, fit.loss, current,
        register=lambda: _register_fit(registry, fit, dataset, seed=seed, minutes=spent / 60.0),
        registry=registry, new_metrics={"choice": fit.label, "cv_loss": fit.info.get("cv_loss")},
    )  # fmt: skip


def _register_fit(
    root: str | Path, fit: PriorFit, dataset: LoadedDataset, *, seed: int, minutes: float
) -> tuple[str, str]:
    """Register ``fit`` (not promoted) under ``root``, its card as ``training.train.register_trained``
    writes one plus the prior, the choice and the device-minutes measured; ``(registry id, version)``."""
    from ficco.training.predict.coverage import Coverage
    from ficco.training.predict.registry import register

    table = dataset.table
    backend = rows_backend(dataset.info["backends"])
    model_id = registry_id(dataset.hardware.id, backend)
    ops = sorted({s.op for s in table.scenarios})
    rows = {op: [s.m for s in table.scenarios if s.op == op] for op in ops}
    version = register(
        root,
        model_id,
        scorer=fit.scorer,
        ratio=fit.ratio,
        policy=fit.policy,
        dataset_hash=dataset.hash,
        coverage=Coverage.of(table.scenarios, table.modes),
        info={
            "dataset": dataset.info,
            "model_backend": backend,
            "hardware": dataclasses.replace(dataset.hardware, id=model_id).to_dict(),
            "world_sizes": sorted({s.world_size for s in table.scenarios}),
            "ops": ops,
            "m_range": {op: [min(m), max(m)] for op, m in rows.items()},
            "modes": sorted(set(np.asarray(table.modes).tolist())),
            "config": fit.scorer.get_params(),
            "host_factor": round(table.host_factor, 4),
            "choice_reason": f"training.priors.fit_with_prior chose {fit.label} by grouped cross-validation "
            f"over the new rows (held-out loss by mode and candidate: {fit.info.get('cv_loss')})",
            "prior": fit.info,
            "device_minutes": round(minutes, 3),
            "seed": seed,
        },
    )
    return model_id, version
