"""From the pair model's outputs to a recommendation: the guard, the pick, the tie rule, the fallback.

Every answer is consistent with the model's own predicted speedups (docs/models.md, "What an answer
guarantees"):

1. **The guard.** A schedule the time-ratio regressor predicts slower than serial/sm beyond the mode's
   noise band (speedup below ``1 / (1 + noise_band)``) is never recommended: the pick is the valid schedule
   of lowest cost (the ranker's order) among the others; serial/sm always stays.
2. **Ties with the /hp twin.** A ``/hp`` pick whose normal-priority twin is predicted within the noise band
   of it (and passes the guard) gives way to the twin: stream priority is raised only for a predicted gain.
3. **The fallback.** A pick whose predicted gain over serial is below the mode's ``min_gain`` (chosen by
   cross-validation) falls back to serial/sm.

The noise band is the card's (:func:`card_noise_band`). See docs/training.md and docs/models.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from ficco.features import MODES
from ficco.features.launch_cost import TWIN_OF
from ficco.features.schedule_table import BEST_SET_FLOOR
from ficco.training.predict.pairs import SERIAL_INDEX

DEFAULT_NOISE_BAND = BEST_SET_FLOOR
"""The noise band of a mode whose card has no noise ceiling (a dataset without an independent re-measure):
1%, the best set's floor, below which two measured times of one schedule cannot be told apart."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DecisionPolicy:
    """What a mode's picks may be (docs/training.md): the noise band of the guard and the tie rule, and
    when a pick falls back to serial/sm."""

    min_gain: float | None = None
    """Fall back when the pick's predicted speedup over serial is below ``1 + min_gain``, in [0, 1);
    None disables the rule (0 falls back whenever the pick is predicted slower than serial)."""
    noise_band: float = DEFAULT_NOISE_BAND
    """Relative gap in predicted speedup within which two schedules are a tie, in [0, 1): no schedule
    predicted slower than serial/sm by more is recommended, and a ``/hp`` schedule within it of its twin
    gives way to the twin."""

    def __post_init__(self) -> None:
        if self.min_gain is not None and not 0.0 <= self.min_gain < 1.0:
            raise ValueError(f"DecisionPolicy.min_gain must be None or in [0, 1); got {self.min_gain!r}")
        if not 0.0 <= self.noise_band < 1.0:
            raise ValueError(f"DecisionPolicy.noise_band must be in [0, 1); got {self.noise_band!r}")

    @property
    def slowest(self) -> float:
        """The lowest predicted speedup over serial/sm a recommended schedule may have: ``1 / (1 +
        noise_band)``."""
        return 1.0 / (1.0 + self.noise_band)

    def mask(self, speedup: np.ndarray, picked_serial: np.ndarray) -> np.ndarray:
        """Which picks fall back: bool ``[n]`` from the pick's predicted speedup over serial ``[n]`` and
        whether the pick already is serial/sm ``[n]`` (those never count as a fallback)."""
        if self.min_gain is None:
            return np.zeros(len(speedup), dtype=bool)
        return (speedup < 1.0 + self.min_gain) & ~picked_serial

    def reason(self, speedup: float) -> str:
        """Why one pick fell back under ``min_gain``, for a person to read."""
        return (
            f"predicted gain over serial {speedup - 1.0:+.1%} is within the noise floor {self.min_gain:.0%}"
        )

    def guard_reason(self, schedule: str, speedup: float) -> str:
        """Why the ranker's first choice ``schedule`` (predicted ``speedup`` over serial/sm) was passed
        over by the guard, for a person to read."""
        return (
            f"the ranker's first choice {schedule} is predicted {1.0 / speedup - 1.0:.2%} slower than "
            f"serial/sm, beyond the noise band {self.noise_band:.2%}: no schedule predicted slower than "
            "serial beyond it is recommended"
        )

    def to_dict(self) -> dict[str, float | None]:
        return {"min_gain": self.min_gain, "noise_band": self.noise_band}


POLICY_GRID: tuple[DecisionPolicy, ...] = tuple(
    DecisionPolicy(min_gain=g) for g in (None, 0.0, 0.01, 0.02, 0.03, 0.05)
)
"""Candidates for cross-validation in each mode, the laxest first (ties in the selection go to the earlier
one); each mode's noise band is set from the data (:meth:`ModePolicy.with_bands`), not chosen."""


def card_noise_band(card: Mapping[str, Any], mode: str) -> float:
    """A model's noise band in ``mode``: the one its card's policy records; else (cards from before it was
    recorded) the card's noise-ceiling geometric-mean regret (how far apart two measurements of the same
    best schedule typically are); else :data:`DEFAULT_NOISE_BAND` (no re-measure)."""
    recorded = (card.get("policy") or {}).get(mode)
    if isinstance(recorded, Mapping) and recorded.get("noise_band") is not None:
        return float(recorded["noise_band"])
    try:
        band = card["metrics"]["modes"][mode]["family_holdout"]["ceiling"]["geomean_regret"]
        return max(0.0, float(band))
    except (KeyError, TypeError, ValueError):
        return DEFAULT_NOISE_BAND


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

    def with_bands(self, bands: Mapping[str, float]) -> ModePolicy:
        """This policy with the noise band of each mode of ``bands`` replaced (others kept)."""
        return ModePolicy(**{m: replace(self.of(m), noise_band=bands.get(m, self.of(m).noise_band))
                             for m in MODES})  # fmt: skip

    def per_row(self, modes: Sequence[str], name: str) -> np.ndarray:
        """The float field ``name`` of each row's mode policy, ``[n]``."""
        modes = np.asarray(modes, dtype=object)
        out = np.empty(len(modes))
        for mode in set(modes.tolist()):
            out[modes == mode] = getattr(self.of(mode), name)
        return out

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
        """A card's policy: ``{"eager": {"min_gain": g, "noise_band": b}, "graph": {...}}`` (a mode without
        ``noise_band``: :data:`DEFAULT_NOISE_BAND`), or a model card from before the per-mode policy,
        ``{"min_gain": g}`` (one threshold for both modes). TypeError for another shape."""
        if set(data) == {"min_gain"}:
            return cls.uniform(DecisionPolicy(**data))
        return cls(**{mode: DecisionPolicy(**value) for mode, value in data.items()})

    @classmethod
    def from_card(cls, card: Mapping[str, Any]) -> ModePolicy:
        """A model card's policy (:meth:`from_dict`) with each mode's noise band from
        :func:`card_noise_band` (cards from before the band was recorded: their noise ceiling)."""
        policy = cls.from_dict(card["policy"])
        return policy.with_bands({mode: card_noise_band(card, mode) for mode in MODES})


class Picks(NamedTuple):
    """What :func:`apply_policy` decides for ``n`` rows."""

    final: np.ndarray
    """The recommended schedule column, int ``[n]``."""
    raw: np.ndarray
    """The model's own pick (lowest cost among every valid schedule), ``[n]``."""
    fallback: np.ndarray
    """Where serial/sm is recommended in place of a ``raw`` that is not, bool ``[n]`` (the guard left
    nothing else, or the pick's predicted gain is below ``min_gain``)."""
    speedup: np.ndarray
    """The predicted speedup over serial of the pick the fallback judged (``raw``, or the schedule the guard
    and the tie rule left in its place), ``[n]``."""


def apply_policy(cost: np.ndarray, log_ratio: np.ndarray, policy: ModePolicy, modes: Sequence[str]) -> Picks:
    """Picks from costs ``[n, S]`` (+inf = invalid) and predicted ``log(t / t_serial)`` ``[n, S]`` of rows
    in ``modes`` ``[n]``, each under its mode's policy (the module docstring's three rules, in order)."""
    rows = np.arange(len(cost))
    speedups = np.exp(-log_ratio)
    speedups[:, SERIAL_INDEX] = 1.0  # serial over serial, by definition
    band = policy.per_row(modes, "noise_band")
    with np.errstate(invalid="ignore"):  # NaN speedups: invalid schedules, whose cost is +inf anyway
        allowed = ~(speedups < (1.0 / (1.0 + band))[:, None])
    raw = cost.argmin(axis=1)
    pick = np.where(allowed, cost, np.inf).argmin(axis=1)
    twin = TWIN_OF[pick]  # the pick itself unless it is a /hp schedule
    tie = allowed[rows, twin] & (speedups[rows, twin] * (1.0 + band) >= speedups[rows, pick])
    pick = np.where(tie, twin, pick)
    fallback = policy.mask(speedups[rows, pick], pick == SERIAL_INDEX, modes)
    final = np.where(fallback, SERIAL_INDEX, pick)
    return Picks(final, raw, (final == SERIAL_INDEX) & (raw != SERIAL_INDEX), speedups[rows, pick])
