"""From the pair model's outputs to a recommendation: the pick, then the safe fallback.

1. Pick: among the schedules valid for the scenario, the one of lowest predicted cost (the predicted
   ``log(t / t_serial)`` of the regressor, or the negated score of the ranker).
2. Safe fallback: overlap that goes wrong is worse than no overlap (async-TP runs up to 4x slower than
   serial on small shapes), so a pick whose predicted gain over serial (from the time-ratio regressor) is
   below ``min_gain``, i.e. within measurement noise, falls back to serial/sm.

``min_gain`` is chosen by cross-validation (``training.crossval``) and stored in the model card.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ficco.training.model import SERIAL_INDEX


@dataclass(frozen=True, kw_only=True, slots=True)
class DecisionPolicy:
    """When a pick falls back to serial/sm (module docstring)."""

    min_gain: float | None = None
    """Fall back when the pick's predicted speedup over serial is below ``1 + min_gain``, in [0, 1);
    None disables the rule (0 falls back whenever the pick is predicted slower than serial)."""

    def __post_init__(self) -> None:
        if self.min_gain is not None and not 0.0 <= self.min_gain < 1.0:
            raise ValueError(f"DecisionPolicy.min_gain must be None or in [0, 1); got {self.min_gain!r}")

    def mask(self, speedup: np.ndarray, picked_serial: np.ndarray) -> np.ndarray:
        """Which picks fall back: bool ``[n]`` from the pick's predicted speedup over serial ``[n]`` and
        whether the pick already is serial/sm ``[n]`` (those never count as a fallback)."""
        if self.min_gain is None:
            return np.zeros(len(speedup), dtype=bool)
        return (speedup < 1.0 + self.min_gain) & ~picked_serial

    def reason(self, speedup: float) -> str:
        """Why one pick fell back, for a person to read."""
        return (
            f"predicted gain over serial {speedup - 1.0:+.1%} is within the noise floor {self.min_gain:.0%}"
        )

    def to_dict(self) -> dict[str, float | None]:
        return {"min_gain": self.min_gain}


POLICY_GRID: tuple[DecisionPolicy, ...] = tuple(
    DecisionPolicy(min_gain=g) for g in (None, 0.0, 0.01, 0.02, 0.03, 0.05)
)
"""Candidates for cross-validation, the laxest first (ties in the selection go to the earlier one)."""


def apply_policy(cost: np.ndarray, log_ratio: np.ndarray, policy: DecisionPolicy) -> tuple[np.ndarray, ...]:
    """Picks from costs ``[n, S]`` (+inf = invalid) and predicted ``log(t / t_serial)`` ``[n, S]``.

    Returns ``(final, raw, fallback, speedup)``: recommended column ``[n]``, the model's own pick ``[n]``,
    where the fallback fired (bool ``[n]``) and the raw pick's predicted speedup over serial ``[n]``.
    """
    raw = cost.argmin(axis=1)
    rows = np.arange(len(raw))
    speedup = np.exp(-log_ratio[rows, raw])
    speedup[raw == SERIAL_INDEX] = 1.0
    fallback = policy.mask(speedup, raw == SERIAL_INDEX)
    return np.where(fallback, SERIAL_INDEX, raw), raw, fallback, speedup
