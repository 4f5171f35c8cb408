"""A loaded model that answers "which schedule for this scenario, in this execution mode?".

>>> from ficco.training.registry import load_predictor                  # doctest: +SKIP
>>> predictor = load_predictor("models", "h200x2")                       # doctest: +SKIP
>>> [r.schedule for r in predictor.recommend([Scenario(m=1024)], mode="graph")]  # doctest: +SKIP
['serial/sm']

Two evaluation paths give the same picks: the reference path (``xgboost.Booster.inplace_predict``) and
the fast path (``training.fastpath.CompiledForest``, numpy), which is much cheaper for a few scenarios;
:meth:`Predictor.decide` takes the fast path up to ``FAST_PATH_MAX_CURSORS`` (pairs x trees) and the
reference path for larger batches, where XGBoost's own loop is faster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from ficco.features import Scenario, feature_matrix
from ficco.training.fastpath import CompiledForest
from ficco.training.model import SCHEDULES, SERIAL_INDEX, PairModel, check_modes, pair_matrix, valid_mask
from ficco.training.policy import DecisionPolicy

FAST_PATH_MAX_CURSORS = 2_000_000
"""Largest ``pairs x trees`` the fast path walks; beyond it the reference path is faster (one core)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Recommendation:
    """The schedule to run for one scenario in one execution mode, and why."""

    schedule: str
    """Canonical schedule string to run (``serial/sm`` when the fallback fired)."""
    mode: str
    """Execution mode the recommendation is for: ``eager`` or ``graph`` (CUDA-graph replay)."""
    predicted_speedups: dict[str, float]
    """Predicted ``t_serial / t_schedule`` of every schedule valid for the scenario (serial/sm: 1.0)."""
    predicted_speedup: float
    """Predicted ``t_serial / t_schedule`` of ``schedule`` (1.0 for serial/sm)."""
    fallback: bool
    """True when the model's own pick was replaced by serial/sm."""
    fallback_reason: str | None
    """Why the fallback fired; None otherwise."""
    model_version: str
    """Registry version of the model that answered."""
    hardware_id: str
    """Hardware profile the model was trained for."""


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Decision:
    """Vectorised outcome of :meth:`Predictor.decide` for ``n`` scenario rows over the ``S`` schedules."""

    schedules: np.ndarray
    """Recommended schedule strings, ``[n]``."""
    final: np.ndarray
    """Recommended schedule column, int ``[n]``."""
    raw: np.ndarray
    """The model's own pick (lowest cost) before the fallback, column ``[n]``."""
    speedup: np.ndarray
    """Predicted speedup over serial of ``raw``, ``[n]``."""
    fallback: np.ndarray
    """Where serial/sm replaced ``raw``, bool ``[n]``."""
    speedups: np.ndarray
    """Predicted speedup over serial of every schedule, ``[n, S]`` (NaN where it cannot run)."""


class Predictor:
    """The fitted pair model (``scorer``), the time-ratio regressor (``ratio``, the same object when the
    scorer is the regressor), the fallback policy and the model card."""

    def __init__(
        self,
        *,
        scorer: PairModel,
        ratio: PairModel,
        policy: DecisionPolicy,
        card: dict[str, Any],
        version: str,
        hardware_id: str,
    ) -> None:
        self.scorer = scorer
        self.ratio = ratio
        self.policy = policy
        self.card = card
        self.version = version
        self.hardware_id = hardware_id
        boosters = [scorer.booster_] if ratio is scorer else [scorer.booster_, ratio.booster_]
        self._fast = CompiledForest.from_boosters(boosters)

    def __repr__(self) -> str:
        return f"Predictor(hardware_id={self.hardware_id!r}, version={self.version!r})"

    def _outputs(self, Z: np.ndarray, fast: bool) -> tuple[np.ndarray, np.ndarray]:
        """(cost, predicted log ratio) of pairs ``Z``, each ``[N]``."""
        if fast:
            margins = self._fast.predict(Z)
            out, ratio = margins[:, 0], margins[:, -1]
        else:
            out = self.scorer.predict(Z)
            ratio = out if self.ratio is self.scorer else self.ratio.predict(Z)
        return (out if self.scorer.objective == "ratio" else -out), ratio

    def decide(self, X: np.ndarray, modes: Sequence[str], *, fast: bool | None = None) -> Decision:
        """Picks, predicted speedups and fallbacks of feature rows ``X`` ``[n, F]`` in ``modes`` ``[n]``.

        ``fast``: True = the numpy fast path, False = XGBoost's own prediction, None = by batch size.
        """
        valid = valid_mask(X)
        Z, (rows, cols) = pair_matrix(X, modes, valid)
        if fast is None:
            fast = len(Z) * len(self._fast.roots) <= FAST_PATH_MAX_CURSORS
        pair_cost, pair_ratio = self._outputs(Z, fast)
        cost = np.full(valid.shape, np.inf)
        log_ratio = np.full(valid.shape, np.nan)
        cost[rows, cols], log_ratio[rows, cols] = pair_cost, pair_ratio
        log_ratio[:, SERIAL_INDEX] = 0.0  # serial over serial, by definition
        raw = cost.argmin(axis=1)
        speedups = np.exp(-log_ratio)
        speedup = speedups[np.arange(len(raw)), raw]
        fallback = self.policy.mask(speedup, raw == SERIAL_INDEX)
        final = np.where(fallback, SERIAL_INDEX, raw)
        return Decision(
            schedules=np.asarray(SCHEDULES, dtype=object)[final], final=final, raw=raw, speedup=speedup,
            fallback=fallback, speedups=speedups,
        )  # fmt: skip

    def recommend(self, scenarios: Sequence[Scenario], mode: str = "eager") -> list[Recommendation]:
        """One :class:`Recommendation` per scenario, in order, for execution ``mode`` (eager or graph).

        Raises ``ValueError`` for a scenario on hardware other than the model's, or an unknown mode.
        """
        check_modes([mode])
        foreign = [s.key() for s in scenarios if s.hardware.id != self.hardware_id]
        if foreign:
            raise ValueError(
                f"this model was trained for hardware {self.hardware_id!r}; {len(foreign)} scenario(s) are "
                f"on other hardware, e.g. {foreign[0]}. Load the model of that hardware (list them with "
                "ficco.training.registry.list_models)"
            )
        d = self.decide(feature_matrix(scenarios), [mode] * len(scenarios))
        out = []
        for i in range(len(scenarios)):
            fell_back = bool(d.fallback[i])
            row = d.speedups[i]
            out.append(
                Recommendation(
                    schedule=str(d.schedules[i]),
                    mode=mode,
                    predicted_speedups={
                        SCHEDULES[j]: float(row[j]) for j in np.flatnonzero(np.isfinite(row))
                    },
                    predicted_speedup=1.0 if fell_back else float(d.speedup[i]),
                    fallback=fell_back,
                    fallback_reason=self.policy.reason(float(d.speedup[i])) if fell_back else None,
                    model_version=self.version,
                    hardware_id=self.hardware_id,
                )
            )
        return out
