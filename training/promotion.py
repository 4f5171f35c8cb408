"""Like-for-like promotion: a candidate model against the current model's recipe on the same rows and folds.

Both are cross-validated on the candidate's target rows with the folds and groups those rows alone fix
(``training.crossval``); slow picks are also counted on the rows the peer rule (vLLM's) covers, beside the
rule's own; the noise band comes from refits of the candidate with a few scenarios left out. See
docs/training.md, "Promotion".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ficco.features import MODES
from ficco.features.label_source import LabelSource
from ficco.training.crossval import Choice
from ficco.training.dataset_table import DatasetTable, LoadedDataset, load_dataset_table
from ficco.training.evaluate import Evaluation, evaluate
from ficco.training.fit import TrainConfig
from ficco.training.predict.policy import ModePolicy

log = logging.getLogger(__name__)

REFITS = 3
"""Refits the noise band is measured from."""
REFIT_LEAVE_OUT = 0.05
"""Share of the scenarios each refit leaves out."""
PEER_RULE = "vllm_sp_rule"
"""The rule a promoted model must not pick worse than on its rows (more picks > 2% slower than serial)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Recipe:
    """How a model was trained: its datasets (target, repeats, extra), learner and cross-validated choice."""

    paths: tuple[Path, ...]
    repeats: tuple[Path, ...] = ()
    extra: tuple[Path, ...] = ()
    learner: str = "sources"
    choice: Choice

    @classmethod
    def of_card(cls, card: dict[str, Any]) -> Recipe:
        """The recipe a model card records (cards from before ``learner`` was recorded: ``pooled``)."""
        data = card.get("dataset") or {}
        return cls(
            paths=tuple(Path(p) for p in str(data.get("path", "")).split(" + ") if p),
            repeats=tuple(Path(p) for p in data.get("repeats", [])),
            extra=tuple(Path(p) for p in data.get("extra", [])),
            learner=str(card.get("learner", "pooled")),
            choice=Choice(config=TrainConfig(**card["config"]), policy=ModePolicy.from_dict(card["policy"])),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    """The outcome of :func:`compare`."""

    better: bool
    """Whether the candidate should replace the current model."""
    reason: str
    """Why, for a person to read."""
    modes: dict[str, dict[str, float | int | None]] = field(default_factory=dict)
    """Per mode: both models' regret and slow picks, the peer rule's slow picks on its rows and the band."""
    rows: int = 0
    """Target rows both were scored on."""

    def to_dict(self) -> dict[str, Any]:
        return {"better": self.better, "reason": self.reason, "rows": self.rows, "modes": self.modes}


def mode_metrics(summary: dict[str, Any], mode: str) -> dict[str, float | int | None]:
    """The family-holdout numbers promotion compares, from an evaluation summary (``training.evaluate``),
    scored against the candidate's labels (``rescored`` where the summary has it): geomean regret, slow picks
    (> 2% slower than serial), the loss, and on the rows of :data:`PEER_RULE` the model's slow picks and the
    rule's (None: no such rows)."""
    holdout = summary["modes"][mode]["family_holdout"]
    model, peer, on_peer = holdout["model"], holdout.get(PEER_RULE), holdout.get("model_on_async_tp_rows")
    model = summary["modes"][mode].get("rescored", {}).get("model", model)
    return {
        "loss": model["loss"],
        "regret": model["geomean_regret"],
        "slow": model["n_slower_than_serial_2pct"],
        "slow_on_peer_rows": None if on_peer is None else on_peer["n_slower_than_serial_2pct"],
        "peer_slow": None if peer is None else peer["n_slower_than_serial_2pct"],
        "scenarios": model["n_scenarios"],
    }


def refit_band(
    table: DatasetTable,
    choice: Choice,
    *,
    refits: int = REFITS,
    leave_out: float = REFIT_LEAVE_OUT,
    seed: int = 0,
    n_jobs: int = 1,
) -> dict[str, float]:
    """The noise band of the recipe ``choice`` on ``table``, per mode: the largest change of its held-out
    geomean regret when it is refit with ``leave_out`` of the scenarios left out (each of ``refits`` a
    different random draw), scored on the rows every fit kept."""
    rng = np.random.default_rng(seed)
    full = evaluate(table, configs=(choice.config,), policy=choice.policy, seed=seed, n_jobs=n_jobs).cv
    scenarios = np.unique(table.scenario_ids)
    band = dict.fromkeys(MODES, 0.0)
    for _ in range(refits):
        gone = rng.choice(scenarios, size=max(1, round(leave_out * len(scenarios))), replace=False)
        kept = ~np.isin(table.scenario_ids, gone)
        part = table.subset(kept)
        cv = evaluate(part, configs=(choice.config,), policy=choice.policy, seed=seed, n_jobs=n_jobs).cv
        scored = part.is_target
        for mode in MODES:
            on = scored & (part.modes == mode)
            if not on.any():
                continue
            rows = np.flatnonzero(kept)[on]
            refit = _geomean_regret(part.subset(on), cv.final[on])
            before = _geomean_regret(table.subset(rows), full.final[rows])
            band[mode] = max(band[mode], abs(refit - before))
    return {mode: round(b, 6) for mode, b in band.items()}


def _geomean_regret(table: DatasetTable, picks: np.ndarray) -> float:
    return float(np.expm1(np.mean(np.log(table.time_of(picks)[0] / table.best_ms))))


def current_recipe_evaluation(
    dataset: LoadedDataset, card: dict[str, Any], *, seed: int = 0, n_jobs: int = 1
) -> Evaluation:
    """The current model's recipe (its card's learner, configuration and policy, its datasets as extra
    rows) re-run on ``dataset``'s target rows and folds: what it would score on the candidate's rows.
    ``ValueError`` naming a dataset of the recipe that is not on disk."""
    recipe = Recipe.of_card(card)
    missing = [p for p in (*recipe.paths, *recipe.extra) if not p.exists()]
    if missing:
        raise ValueError(
            f"the current model's datasets are not here ({', '.join(map(str, missing))}): run from the "
            "checkout that trained it, or pass --no-compare"
        )
    ours = {p.resolve() for p in dataset.paths}
    extra = [p for p in (*recipe.paths, *recipe.extra) if p.resolve() not in ours]
    repeats = [p for p in recipe.repeats if p.exists()]
    loaded = load_dataset_table(*dataset.paths, repeats=repeats, extra=extra)
    table = loaded.table if recipe.learner == "sources" else pooled(loaded, check=False).table
    target = dataset.table.subset(dataset.table.is_target)
    return evaluate(
        table, noise=loaded.noise, rescore=target, configs=(recipe.choice.config,),
        policy=recipe.choice.policy, seed=seed, n_jobs=n_jobs,
    )  # fmt: skip


def compare(candidate: Evaluation, current: Evaluation, band: dict[str, float]) -> Verdict:
    """Whether ``candidate`` beats ``current`` (both evaluated on the same target rows and folds): its mean
    serial-safe loss is lower, no mode's regret is worse than the current's by more than that mode's
    ``band``, and no mode has more slow picks than :data:`PEER_RULE` on its rows."""
    modes, worse, peer_worse = {}, [], []
    for mode in MODES:
        if mode not in candidate.summary["modes"]:
            continue
        mine, theirs = mode_metrics(candidate.summary, mode), mode_metrics(current.summary, mode)
        modes[mode] = {
            **{f"candidate_{k}": v for k, v in mine.items()},
            **{f"current_{k}": v for k, v in theirs.items() if k != "peer_slow"},
            "band": band.get(mode, 0.0),
        }
        if mine["regret"] > theirs["regret"] + band.get(mode, 0.0):
            worse.append(
                f"{mode} regret {mine['regret']:.2%} > {theirs['regret']:.2%} + band {band[mode]:.2%}"
            )
        if mine["peer_slow"] is not None and mine["slow_on_peer_rows"] > mine["peer_slow"]:
            peer_worse.append(
                f"{mode}: {mine['slow_on_peer_rows']} slow picks on {PEER_RULE}'s rows against its "
                f"{mine['peer_slow']}"
            )
    mine_loss, theirs_loss = (_loss(e.summary) for e in (candidate, current))
    rows = sum(m["candidate_scenarios"] for m in modes.values())
    if worse or peer_worse:
        return Verdict(better=False, reason="; ".join(worse + peer_worse), modes=modes, rows=rows)
    if mine_loss >= theirs_loss:
        reason = f"held-out loss {mine_loss:.5f} is not below the current recipe's {theirs_loss:.5f}"
        return Verdict(better=False, reason=reason, modes=modes, rows=rows)
    reason = f"held-out loss {mine_loss:.5f} < the current recipe's {theirs_loss:.5f} on the same {rows} rows"
    return Verdict(better=True, reason=reason, modes=modes, rows=rows)


def _loss(summary: dict[str, Any]) -> float:
    """Mean serial-safe loss (``training.metrics.pick_loss``) of the family-holdout picks over every mode,
    against the candidate's labels (:func:`mode_metrics`)."""
    models = [mode_metrics(summary, mode) for mode in summary["modes"]]
    return sum(m["loss"] * m["scenarios"] for m in models) / sum(m["scenarios"] for m in models)


def pooled(dataset: LoadedDataset, *, check: bool = True) -> LoadedDataset:
    """``dataset`` learned as one source: every row at the target's one host factor and its first source's
    label version. ``check``: refuse
    (``ValueError``, one line naming two datasets and the settings that differ) when its rows come from
    label sources that differ."""
    from dataclasses import replace

    if check:
        sources = dataset.info.get("sources", [])
        by_key: dict[tuple[Any, ...], dict[str, Any]] = {}
        for entry in sources:
            source = LabelSource(**{k: entry[k] for k in LabelSource.__dataclass_fields__})
            by_key.setdefault(source.key(), {"path": entry["path"], "source": source})
        if len(by_key) > 1:
            first, other = list(by_key.values())[:2]
            raise ValueError(
                f"datasets {first['path']} and {other['path']} have different label sources "
                f"({'; '.join(first['source'].differences(other['source']))}); the pooled learner would "
                "mix them as one: train with --learner sources, or leave one out"
            )
    table = dataset.table
    factor = float(dataset.info.get("host_factor", table.host_factor))
    one = replace(
        table, host_factors=np.full(len(table), factor), sources=np.zeros(len(table), dtype=np.int64),
        label_sources=table.label_sources[:1],
    )  # fmt: skip
    return replace(dataset, table=one)
