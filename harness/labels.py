"""Labels with confidence: which schedules cannot be told apart from the fastest at the measured noise.

A scenario's schedules are timed in interleaved rounds (``harness.torch_backend``): round ``r`` of every
schedule ran within the same few milliseconds, so rounds pair across schedules and drift (clocks,
neighbours) lands on a whole round rather than on one schedule. The best set of a scenario and mode is::

    best     = argmin_s median_r T[s, r]
    in_set_s = median(T[s]) <= (1 + margin) * median(T[best])                      # the floor
               or quantile_alpha( median(T[s, R*]) / median(T[best, R*]) ) <= 1 + margin

over paired bootstrap resamples ``R*`` of the rounds: a schedule leaves the set only when it is slower
than the fastest by more than ``margin`` in at least ``1 - alpha`` of the resamples. ``margin`` is never
below 1%, the issue's floor and about the run-to-run spread of large GEMMs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ficco.harness.backend import Measurement, ScenarioResult

MARGIN = 0.01
"""Relative slowdown below which a schedule always counts as tied with the fastest."""
ALPHA = 0.05
"""One-sided level of the bootstrap: a schedule leaves the best set when it is slower than the fastest by
more than ``MARGIN`` in at least 95% of the resamples."""
RESAMPLES = 1000
"""Paired bootstrap resamples of the rounds."""


def best_set(
    rounds: np.ndarray, *, margin: float = MARGIN, alpha: float = ALPHA, seed: int = 0
) -> np.ndarray:
    """Which schedules belong to the best set.

    Parameters
    ----------
    rounds : array, shape [schedules, rounds]
        Per-call time of each schedule in each round, ms; a row of NaN marks a failed schedule (never in
        the set). Rounds pair across schedules.
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
    if not (margin >= 0 and 0 < alpha < 1):
        raise ValueError(
            f"best_set needs margin >= 0 and alpha in (0, 1); got margin={margin}, alpha={alpha}"
        )
    ok = np.isfinite(rounds).all(axis=1) & (rounds.shape[1] > 0)
    out = np.zeros(rounds.shape[0], dtype=bool)
    if not ok.any():
        return out
    times = rounds[ok]
    medians = np.median(times, axis=1)
    best = int(np.argmin(medians))
    inside = medians <= (1 + margin) * medians[best]
    n_rounds = times.shape[1]
    if n_rounds > 1:
        rng = np.random.default_rng(seed)
        picks = rng.integers(0, n_rounds, size=(RESAMPLES, n_rounds))
        resampled = np.median(times[:, picks], axis=2)  # [schedules, resamples]
        ratio = resampled / resampled[best]
        inside |= np.quantile(ratio, alpha, axis=1) <= 1 + margin
    out[np.flatnonzero(ok)] = inside
    return out


def label_result(result: ScenarioResult, *, seed: int = 0) -> ScenarioResult:
    """``result`` with ``in_best_set`` set on every measurement, per mode (see ``best_set``)."""
    measurements = list(result.measurements)
    for mode in dict.fromkeys(m.mode for m in measurements):
        index = [i for i, m in enumerate(measurements) if m.mode == mode]
        flags = best_set(_round_matrix([measurements[i] for i in index]), seed=seed)
        for i, flag in zip(index, flags, strict=True):
            measurements[i] = replace(measurements[i], in_best_set=bool(flag))
    return replace(result, measurements=measurements)


def _round_matrix(measurements: Sequence[Measurement]) -> np.ndarray:
    """``[len(measurements), rounds]`` per-call times; NaN rows for failed ones (or ragged rounds)."""
    width = max((len(m.round_ms) for m in measurements if m.ok), default=0)
    out = np.full((len(measurements), width), math.nan)
    for i, m in enumerate(measurements):
        if m.ok and len(m.round_ms) == width:
            out[i] = m.round_ms
    return out
