"""A loaded model that answers "which schedule for this scenario?", many scenarios at a time.

>>> from training.registry import load_predictor                        # doctest: +SKIP
>>> predictor = load_predictor("models", "h200x2")                       # doctest: +SKIP
>>> [r.schedule for r in predictor.recommend([Scenario(m=1024)])]        # doctest: +SKIP
['serial/sm']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from ficco.features import SERIAL, Scenario, feature_matrix
from ficco.training.model import ScheduleClassifier, SpeedupRegressor, valid_mask
from ficco.training.policy import DecisionPolicy


@dataclass(frozen=True, kw_only=True, slots=True)
class Recommendation:
    """The schedule to run for one scenario, and why."""

    schedule: str
    """Canonical schedule string to run (``serial/sm`` when the fallback fired)."""
    probabilities: dict[str, float]
    """The classifier's probability of each schedule valid for the scenario being the fastest (sums to 1).
    ``schedule`` weighs these by predicted speedup (``training.policy``), so it need not be the most
    probable one."""
    predicted_speedup: float | None
    """Predicted ``t_serial / t_schedule`` of ``schedule`` (1.0 for serial/sm); None if unknown."""
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
    """Vectorised outcome of :meth:`Predictor.decide` for ``n`` scenarios over the ``c`` model classes."""

    schedules: np.ndarray
    """Recommended schedule strings, ``[n]``."""
    picked: np.ndarray
    """The model's most probable valid schedule before the fallback, ``[n]``."""
    probability: np.ndarray
    """Probability of ``picked``, ``[n]``."""
    speedup: np.ndarray
    """Predicted speedup over serial of ``picked``, ``[n]``."""
    fallback: np.ndarray
    """Where serial/sm replaced ``picked``, bool ``[n]``."""
    proba: np.ndarray
    """Probabilities over the model classes, ``[n, c]``."""
    valid: np.ndarray
    """Which classes can run each scenario, bool ``[n, c]``."""


class Predictor:
    """A fitted classifier and speedup regressor with their decision policy and model card."""

    def __init__(
        self,
        *,
        classifier: ScheduleClassifier,
        regressor: SpeedupRegressor,
        policy: DecisionPolicy,
        card: dict[str, Any],
        version: str,
        hardware_id: str,
    ) -> None:
        self.classifier = classifier
        self.regressor = regressor
        self.policy = policy
        self.card = card
        self.version = version
        self.hardware_id = hardware_id

    def __repr__(self) -> str:
        return f"Predictor(hardware_id={self.hardware_id!r}, version={self.version!r})"

    def decide(self, X: np.ndarray) -> Decision:
        """Picks, probabilities, predicted speedups and fallbacks of feature rows ``X`` ``[n, F]``."""
        classes = np.asarray(self.classifier.classes_, dtype=object)
        proba = self.classifier.predict_proba(X)
        valid = valid_mask(X, classes)
        rows = np.arange(len(proba))
        if self.policy.speedup_weight:
            # the pick weighs every valid class by its predicted speedup; predict those pairs only
            r, c = np.nonzero(valid)
            speedups = np.ones(proba.shape)
            speedups[r, c] = self.regressor.predict(X[r], classes[c].tolist())
            pick = self.policy.pick(proba, speedups)
            speedup = speedups[rows, pick]
        else:
            pick = proba.argmax(axis=1)
            speedup = self.regressor.predict(X, classes[pick].tolist())
        picked = classes[pick]
        fallback = self.policy.mask(proba[rows, pick], speedup, picked == str(SERIAL))
        return Decision(
            schedules=np.where(fallback, str(SERIAL), picked),
            picked=picked,
            probability=proba[rows, pick],
            speedup=speedup,
            fallback=fallback,
            proba=proba,
            valid=valid,
        )

    def recommend(self, scenarios: Sequence[Scenario]) -> list[Recommendation]:
        """One :class:`Recommendation` per scenario, in order (vectorised: 10k scenarios take well under 1 s).

        Raises ``ValueError`` for a scenario on hardware other than the model's.
        """
        foreign = [s.key() for s in scenarios if s.hardware.id != self.hardware_id]
        if foreign:
            raise ValueError(
                f"this model was trained for hardware {self.hardware_id!r}; {len(foreign)} scenario(s) are "
                f"on other hardware, e.g. {foreign[0]}. Load the model of that hardware (list them with "
                "ficco.training.registry.list_models)"
            )
        d = self.decide(feature_matrix(scenarios))
        classes = self.classifier.classes_
        out = []
        for i in range(len(scenarios)):
            fell_back = bool(d.fallback[i])
            out.append(
                Recommendation(
                    schedule=str(d.schedules[i]),
                    probabilities={classes[j]: float(d.proba[i, j]) for j in np.flatnonzero(d.valid[i])},
                    predicted_speedup=1.0 if fell_back else float(d.speedup[i]),
                    fallback=fell_back,
                    fallback_reason=self.policy.reason(float(d.probability[i]), float(d.speedup[i]))
                    if fell_back
                    else None,
                    model_version=self.version,
                    hardware_id=self.hardware_id,
                )
            )
        return out
