"""The order a new machine's sweep measures its plan in, so that the model after any prefix of the sweep is
the best for the time spent (docs/new-hardware.md, "The order of the sweep").

Each scenario's value is what the prior does not know about it: in each mode, the largest spread of the
prior's components (``training.priors.Prior.uncertainty``) among the prior's three best schedules, summed over
the modes. The order is greedy: first the scenario of highest value, then each time the one that maximises
``(FLOOR + value / max value) * distance``, its distance (standardised features) to the nearest scenario
already in the order times its value, so that the sweep both settles what the sources disagree on and spreads
over the space the plan asks (model families' shapes and token counts, MoE routings) instead of measuring one
uncertain corner many times."""

from __future__ import annotations

import numpy as np

from ficco.features import MODES
from ficco.training.priors import Prior

TOP = 3
"""The prior's best schedules of a (scenario, mode) whose spread counts."""
FLOOR = 1.0
"""Value every scenario has on top of its normalised uncertainty: a scenario the sources agree on still
counts for the space it covers."""


def scenario_uncertainty(X: np.ndarray, prior: Prior, host_factor: float) -> np.ndarray:
    """What the prior does not know of each scenario row of ``X`` ``[n, F]``: over the modes, the summed
    largest spread among the prior's :data:`TOP` best schedules, ``[n]`` (0 for a prior of one component)."""
    out = np.zeros(len(X))
    for mode in MODES:
        modes = [mode] * len(X)
        cost = prior.log_ratio(X, modes, host_factor)
        spread = np.maximum(prior.uncertainty(X, modes, host_factor), 0.0)
        top = np.argsort(cost, axis=1, kind="stable")[:, :TOP]
        out += np.take_along_axis(spread, top, axis=1).max(axis=1)
    return out


def standardised(X: np.ndarray) -> np.ndarray:
    """``X`` ``[n, F]`` centred and scaled per column, constant columns dropped, ``[n, F']``."""
    spread = X.std(axis=0)
    keep = spread > 0
    return (X[:, keep] - X[:, keep].mean(axis=0)) / spread[keep]


def measurement_order(X: np.ndarray, value: np.ndarray) -> np.ndarray:
    """The order to measure scenario rows ``X`` ``[n, F]`` of ``value`` ``[n]`` (>= 0) in: a permutation of
    ``range(n)`` (module docstring); deterministic, ties to the lower index."""
    n = len(X)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    Z = standardised(X)
    top = value.max()
    weight = FLOOR + (value / top if top > 0 else np.zeros(n))
    order = [int(np.argmax(weight))]
    distance = np.linalg.norm(Z - Z[order[0]], axis=1)
    taken = np.zeros(n, dtype=bool)
    taken[order[0]] = True
    while len(order) < n:
        score = np.where(taken, -np.inf, weight * distance)
        i = int(np.argmax(score))
        if not np.isfinite(score[i]) or distance[i] <= 0:  # the rest are duplicates of measured rows
            rest = np.flatnonzero(~taken)
            order += rest[np.argsort(-weight[rest], kind="stable")].tolist()
            break
        order.append(i)
        taken[i] = True
        distance = np.minimum(distance, np.linalg.norm(Z - Z[i], axis=1))
    return np.asarray(order, dtype=np.int64)
