"""From the models' outputs to a recommendation: the speedup-weighted pick, then the safe fallback.

1. Pick: among the valid schedules, the one maximising ``p * s ** speedup_weight``, where ``p`` is the
   classifier's probability that the schedule is the fastest and ``s`` the regressor's predicted speedup
   over serial. Weight 0 picks the most probable schedule; a large weight approaches "the schedule
   predicted fastest". The classifier knows which schedule tends to win; the regressor knows by how
   much, which is what regret counts. The probabilities reported stay the classifier's own.
2. Safe fallback: overlap that goes wrong is worse than no overlap (async-TP runs up to 4x slower than
   serial on small shapes), so a pick the classifier is unsure of (``p`` below ``min_probability``) or
   whose predicted gain is inside measurement noise (below ``min_gain``) falls back to serial/sm.

All three numbers are chosen by cross-validation (``training.crossval``) and stored in the model card.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, kw_only=True, slots=True)
class DecisionPolicy:
    """How probabilities and predicted speedups become one schedule (module docstring)."""

    speedup_weight: float = 0.0
    """Exponent ``w`` of the predicted speedup in the pick ``argmax p * s ** w``, in [0, 1000]; 0: the most
    probable schedule."""
    min_probability: float = 0.0
    """Fall back when the classifier's probability of the pick is below this, in [0, 1); 0: never."""
    min_gain: float | None = None
    """Fall back when the pick's predicted speedup over serial is below ``1 + min_gain``, in [0, 1);
    None disables the rule (0 falls back whenever the pick is predicted slower than serial)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.speedup_weight <= 1000.0:
            raise ValueError(
                f"DecisionPolicy.speedup_weight must be in [0, 1000]; got {self.speedup_weight!r}"
            )
        if not 0.0 <= self.min_probability < 1.0:
            raise ValueError(
                f"DecisionPolicy.min_probability must be in [0, 1); got {self.min_probability!r}"
            )
        if self.min_gain is not None and not 0.0 <= self.min_gain < 1.0:
            raise ValueError(f"DecisionPolicy.min_gain must be None or in [0, 1); got {self.min_gain!r}")

    def pick(self, proba: np.ndarray, speedup: np.ndarray) -> np.ndarray:
        """Column index of the pick of each row, int ``[n]``, from probabilities ``[n, c]`` (0 = invalid)
        and predicted speedups ``[n, c]`` (> 0); ties go to the first column (canonical order)."""
        if self.speedup_weight == 0.0:
            return proba.argmax(axis=1)
        with np.errstate(divide="ignore"):
            return (np.log(proba) + self.speedup_weight * np.log(speedup)).argmax(axis=1)

    def mask(self, probability: np.ndarray, speedup: np.ndarray, picked_serial: np.ndarray) -> np.ndarray:
        """Which picks fall back: bool ``[n]`` from the pick's probability ``[n]``, predicted speedup ``[n]``
        and whether the pick already is serial/sm ``[n]`` (those never count as a fallback)."""
        unsure = probability < self.min_probability
        if self.min_gain is not None:
            unsure |= speedup < 1.0 + self.min_gain
        return unsure & ~picked_serial

    def reason(self, probability: float, speedup: float) -> str:
        """Why one pick fell back, for a person to read."""
        if probability < self.min_probability:
            return (
                f"model unsure: probability {probability:.2f} of its pick is below {self.min_probability:.2f}"
            )
        return (
            f"predicted gain over serial {speedup - 1.0:+.1%} is within the noise floor {self.min_gain:.0%}"
        )

    def to_dict(self) -> dict[str, float | None]:
        return {
            "speedup_weight": self.speedup_weight,
            "min_probability": self.min_probability,
            "min_gain": self.min_gain,
        }


POLICY_GRID: tuple[DecisionPolicy, ...] = tuple(
    DecisionPolicy(speedup_weight=w, min_probability=p, min_gain=g)
    for w in (0.0, 4.0, 16.0, 64.0, 256.0, 1000.0)
    for p in (0.0, 0.3, 0.4, 0.5, 0.6)
    for g in (None, 0.0, 0.01, 0.02, 0.05)
)
"""Candidates for cross-validation, the most probable pick and the laxest thresholds first (ties in the
selection go to the earlier one). Weight 1000 is in effect the schedule predicted fastest among those
the classifier gives any probability; on simulated h200x2 data the held-out loss fell steadily with the
weight, so the grid reaches that far."""
