"""How good a set of schedule picks is, measured against the dataset's times: ``top1``, ``in_best_set``,
regrets ``t / t_best - 1``, speedups over serial/sm (definitions: docs/training.md)."""

from __future__ import annotations

import numpy as np

from ficco.training.dataset_table import DatasetTable

WITHIN = 0.02
"""Tolerance of ``within_2pct`` (a pick within 2% of the best counts as good)."""
REGRESSION_PENALTY = 1.0
"""Extra weight of the log slowdown against serial in :func:`pick_loss`: a pick slower than serial/sm
costs twice its regret, because the user asked for overlap to go faster, not to take a gamble."""

REPORTED: tuple[str, ...] = ("top1", "in_best_set", "geomean_regret", "p95_regret", "max_regret",
                             "n_slower_than_serial_2pct", "n_scenarios")  # fmt: skip
"""The metrics that ``ficco report``'s tables and the evaluate and retrain summaries show, in this order."""


def pick_loss(t_pick: np.ndarray, t_best: np.ndarray, t_serial: np.ndarray) -> np.ndarray:
    """Serial-safe regret of each pick, ``[n]``: ``log(t/b) + REGRESSION_PENALTY * max(0, log(t/s))``, whose
    mean model selection, the decision policy and the fitted baselines minimise."""
    return np.log(t_pick / t_best) + REGRESSION_PENALTY * np.maximum(0.0, np.log(t_pick / t_serial))


def score_times(
    table: DatasetTable, t: np.ndarray, *, top1: np.ndarray, in_best: np.ndarray
) -> dict[str, float | int]:
    """Metrics of picks given as their measured times ``t`` (ms ``[n]``), whether each is the measured best
    (bool ``[n]``) and whether it lies in the best set (bool ``[n]``); see docs/training.md."""
    if len(table) == 0:
        return {"n_scenarios": 0}
    best, serial = table.best_ms, table.serial_ms
    log_regret = np.log(t / best)
    regret = t / best - 1.0
    return {
        "top1": float(np.mean(top1)),
        "in_best_set": float(np.mean(in_best)),
        "within_2pct": float(np.mean(t <= (1.0 + WITHIN) * best)),
        "geomean_regret": float(np.expm1(log_regret.mean())),
        "p95_regret": float(np.percentile(regret, 95)),
        "max_regret": float(regret.max()),
        "captured_speedup": float(np.exp(np.mean(np.log(serial / t)) - np.mean(np.log(serial / best)))),
        "speedup_vs_serial": float(np.exp(np.mean(np.log(serial / t)))),
        "n_regressions_vs_serial": int(np.sum(t > serial)),
        "n_slower_than_serial_2pct": int(np.sum(t > (1.0 + WITHIN) * serial)),
        "loss": float(np.mean(pick_loss(t, best, serial))),
        "n_scenarios": len(table),
    }


def score(table: DatasetTable, picks: np.ndarray) -> dict[str, float | int]:
    """Metrics of ``picks`` (schedule column indices ``[n]``) on ``table`` (:func:`score_times`), and
    ``n_unmeasured_picks``: picks without a measurement, charged the scenario's slowest time."""
    if len(table) == 0:
        return {"n_scenarios": 0}
    t, unmeasured = table.time_of(picks)
    in_best = table.in_best[np.arange(len(table)), picks]
    out = score_times(table, t, top1=picks == table.best, in_best=in_best)
    return {**out, "n_unmeasured_picks": int(unmeasured.sum())}


def mean_loss(table: DatasetTable, picks: np.ndarray) -> float:
    """Mean :func:`pick_loss` of ``picks`` on ``table`` (NaN for an empty table)."""
    if len(table) == 0:
        return float("nan")
    return float(pick_loss(table.time_of(picks)[0], table.best_ms, table.serial_ms).mean())


def reported_cells(metrics: dict[str, float | int]) -> list[str]:
    """:data:`REPORTED` of one :func:`score` result as table cells: rates and regrets to 4 decimals,
    counts as whole numbers."""
    return [f"{metrics[k]:.4f}" if isinstance(metrics[k], float) else str(metrics[k]) for k in REPORTED]
