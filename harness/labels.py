"""Labels with confidence: which schedules of a scenario and mode cannot be told apart from the fastest at
the measured noise (the best set: a paired bootstrap over the interleaved rounds, never narrower than 1%).
See docs/protocol.md, "Labels".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ficco.features.dataset import label_quantile
from ficco.harness.backend import ScenarioResult

if TYPE_CHECKING:
    import pandas as pd

MARGIN = 0.01
"""Relative slowdown below which a schedule always counts as tied with the fastest."""
ALPHA = 0.05
"""One-sided level of the bootstrap: a schedule leaves the best set when it is slower than the fastest by
more than ``MARGIN`` in at least 95% of the resamples."""
RESAMPLES = 1000
"""Paired bootstrap resamples of the rounds."""


def relabel(df: pd.DataFrame, *, seed: int = 0, alpha: float = ALPHA) -> pd.DataFrame:
    """``df`` (dataset rows) with ``in_best_set`` recomputed from ``round_ms`` per (scenario, mode), as
    ``label_result`` sets it (``alpha``: ``best_set``'s); the rows keep their order, under a fresh index."""
    out = df.reset_index(drop=True)
    flags = np.zeros(len(out), dtype=bool)
    for (_, mode), group in out.groupby(["scenario_id", "mode"], sort=False):
        rounds = _round_matrix_of(group["round_ms"].tolist(), group["ok"].astype(bool).tolist())
        flags[group.index.to_numpy()] = best_set(
            rounds, quantile=label_quantile(mode), alpha=alpha, seed=seed
        )
    out["in_best_set"] = flags
    return out


def best_set(
    rounds: np.ndarray, *, quantile: float = 0.5, margin: float = MARGIN, alpha: float = ALPHA, seed: int = 0
) -> np.ndarray:
    """Which schedules belong to the best set.

    Parameters
    ----------
    rounds : array, shape [schedules, rounds]
        Per-call time of each schedule in each round, ms; a row of NaN marks a failed schedule (never in
        the set). Rounds pair across schedules.
    quantile : float, default=0.5
        The statistic over rounds that is a schedule's time (``label_quantile``), in (0, 1).
    margin : float, default=MARGIN
        The tie floor (relative), >= 0.
    alpha : float, default=ALPHA
        One-sided bootstrap level, in (0, 1).
    seed : int, default=0
        Seeds the resampling (the labels of a dataset are reproducible).

    Returns
    -------
    bool array, shape [schedules]. All False when no schedule has a finite time.
    """
    rounds = np.asarray(rounds, dtype=np.float64)
    if rounds.ndim != 2:
        raise ValueError(f"rounds must be a [schedules, rounds] array; got shape {rounds.shape}")
    if not (margin >= 0 and 0 < alpha < 1 and 0 < quantile < 1):
        raise ValueError(
            "best_set needs margin >= 0, alpha in (0, 1) and quantile in (0, 1); "
            f"got margin={margin}, alpha={alpha}, quantile={quantile}"
        )
    ok = np.isfinite(rounds).all(axis=1) & (rounds.shape[1] > 0)
    out = np.zeros(rounds.shape[0], dtype=bool)
    if not ok.any():
        return out
    times = rounds[ok]
    label = np.quantile(times, quantile, axis=1)
    best = int(np.argmin(label))
    inside = label <= (1 + margin) * label[best]
    n_rounds = times.shape[1]
    if n_rounds > 1:
        rng = np.random.default_rng(seed)
        picks = rng.integers(0, n_rounds, size=(RESAMPLES, n_rounds))
        resampled = np.quantile(times[:, picks], quantile, axis=2)  # [schedules, resamples]
        ratio = resampled / resampled[best]
        inside |= np.quantile(ratio, alpha, axis=1) <= 1 + margin
    out[np.flatnonzero(ok)] = inside
    return out


def label_result(result: ScenarioResult, *, seed: int = 0) -> ScenarioResult:
    """``result`` with ``in_best_set`` set on every measurement, per mode (see ``best_set``)."""
    measurements = list(result.measurements)
    for mode in dict.fromkeys(m.mode for m in measurements):
        index = [i for i, m in enumerate(measurements) if m.mode == mode]
        chosen = [measurements[i] for i in index]
        rounds = _round_matrix_of([m.round_ms for m in chosen], [m.ok for m in chosen])
        flags = best_set(rounds, quantile=label_quantile(mode), seed=seed)
        for i, flag in zip(index, flags, strict=True):
            measurements[i] = replace(measurements[i], in_best_set=bool(flag))
    return replace(result, measurements=measurements)


def _round_matrix_of(round_ms: Sequence[Sequence[float]], ok: Sequence[bool]) -> np.ndarray:
    """``[schedules, rounds]`` per-call times of schedules with rounds ``round_ms`` and outcomes ``ok``;
    NaN rows for failed ones (or ragged rounds)."""
    width = max((len(r) for r, good in zip(round_ms, ok, strict=True) if good), default=0)
    out = np.full((len(round_ms), width), math.nan)
    for i, (r, good) in enumerate(zip(round_ms, ok, strict=True)):
        if good and len(r) == width:
            out[i] = r
    return out
