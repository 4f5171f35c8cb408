"""From the pair model's outputs to a recommendation: the pick, then the safe fallback.

The pick is the valid schedule of lowest predicted cost; a pick whose predicted gain over serial is below
the mode's ``min_gain`` (:class:`ModePolicy`, chosen by cross-validation) falls back to serial/sm. See
docs/training.md and docs/models.md, "The fallback to serial".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ficco.features import MODES
from ficco.training.predict.pairs import SERIAL_INDEX


@dataclass(frozen=True, kw_only=True, slots=True)
class DecisionPolicy:
    """When a pick falls back to serial/sm (docs/training.md)."""

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
"""Candidates for cross-validation in each mode, the laxest first (ties in the selection go to the earlier
one)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModePolicy:
    """A :class:`DecisionPolicy` per execution mode: what a model applies to its picks."""

    eager: DecisionPolicy = field(default_factory=DecisionPolicy)
    graph: DecisionPolicy = field(default_factory=DecisionPolicy)

    def __post_init__(self) -> None:
        for mode in MODES:
            if not isinstance(getattr(self, mode), DecisionPolicy):
                raise ValueError(
                    f"ModePolicy.{mode} must be a DecisionPolicy; got {type(getattr(self, mode)).__name__}"
                )

    @classmethod
    def uniform(cls, policy: DecisionPolicy) -> ModePolicy:
        """``policy`` in every mode."""
        return cls(eager=policy, graph=policy)

    def of(self, mode: str) -> DecisionPolicy:
        """The policy of ``mode``; ValueError naming the modes for another."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}; got {mode!r}")
        return getattr(self, mode)

    def mask(self, speedup: np.ndarray, picked_serial: np.ndarray, modes: Sequence[str]) -> np.ndarray:
        """:meth:`DecisionPolicy.mask` of each row under the policy of its mode (``modes`` ``[n]``): bool
        ``[n]``."""
        modes = np.asarray(modes, dtype=object)
        present = set(modes.tolist())
        if len(present) == 1:  # one mode (a single decision, a request's batch): no per-mode split
            return self.of(present.pop()).mask(speedup, picked_serial)
        out = np.zeros(len(speedup), dtype=bool)
        for mode in present:
            on = modes == mode
            out[on] = self.of(mode).mask(speedup[on], picked_serial[on])
        return out

    def to_dict(self) -> dict[str, dict[str, float | None]]:
        return {mode: self.of(mode).to_dict() for mode in MODES}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModePolicy:
        """A card's policy: ``{"eager": {"min_gain": g}, "graph": {...}}``, or a model card from before the
        per-mode policy, ``{"min_gain": g}`` (one threshold for both modes). TypeError for another shape."""
        if set(data) == {"min_gain"}:
            return cls.uniform(DecisionPolicy(**data))
        return cls(**{mode: DecisionPolicy(**value) for mode, value in data.items()})


def apply_policy(
    cost: np.ndarray, log_ratio: np.ndarray, policy: ModePolicy, modes: Sequence[str]
) -> tuple[np.ndarray, ...]:
    """Picks from costs ``[n, S]`` (+inf = invalid) and predicted ``log(t / t_serial)`` ``[n, S]`` of rows
    in ``modes`` ``[n]``, each falling back under its mode's policy: ``(final, raw, fallback, speedup)``, the
    recommended column, the model's own pick, where the fallback fired and the raw pick's speedup, ``[n]``."""
    raw = cost.argmin(axis=1)
    rows = np.arange(len(raw))
    speedup = np.exp(-log_ratio[rows, raw])
    speedup[raw == SERIAL_INDEX] = 1.0
    fallback = policy.mask(speedup, raw == SERIAL_INDEX, modes)
    return np.where(fallback, SERIAL_INDEX, raw), raw, fallback, speedup
