"""Check a plan in place before trusting it: the planned step against the same step with ``serial/sm``.

Collective (every rank calls it, in the same place): the planned step is timed against every planned op
``serial/sm`` and each one alone ``serial/sm``; a variant that beats the plan again on fresh rounds has the
ops it runs serially pinned to ``serial/sm``. Why, the steps and their cost: docs/planner.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ficco.features import SERIAL
from ficco.runtime.planner import OpKey, Planner
from ficco.runtime.timing import Variant, time_interleaved
from ficco.tables import markdown_table

log = logging.getLogger(__name__)

PLANNED, ALL_SERIAL = "planned", "serial"
"""Names of the two whole-plan variants (a single flip is named ``serial:<shape> <mode>``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    """What :func:`verify_plan` measured and decided."""

    times_ms: dict[str, float]
    """Median step time of every variant, ms (slowest rank); empty when nothing was planned."""
    confirm_ms: dict[str, float]
    """The fresh head-to-head of the plan and the fastest other variant, ms; empty when none beat the
    plan by more than the margin."""
    winner: str
    """The variant kept: ``planned``, ``serial`` or ``serial:<shape> <mode>``."""
    pinned: tuple[OpKey, ...]
    """Keys now pinned to ``serial/sm``."""

    def table(self) -> str:
        """The variants' times as a markdown table (and the confirmation's), the winner marked."""
        rows = []
        for name, ms in self.times_ms.items():
            confirm = f"{self.confirm_ms[name]:.3f}" if name in self.confirm_ms else "-"
            rows.append([name, f"{ms:.3f}", confirm, "kept" if name == self.winner else ""])
        return markdown_table(["variant", "step ms", "confirmation ms", ""], rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "times_ms": self.times_ms,
            "confirm_ms": self.confirm_ms,
            "winner": self.winner,
            "pinned": [f"{k.shape} {k.mode}" for k in self.pinned],
        }


def verify_plan(
    planner: Planner,
    make_step: Callable[[], Callable[[], Any]],
    *,
    device: torch.device,
    warmup: int = 2,
    rounds: int = 5,
    reps: int = 3,
    margin: float = 0.01,
    flips: bool = True,
) -> Verdict:
    """Time the planned step against serial variants and pin what loses (docs/planner.md).

    Parameters
    ----------
    planner : Planner
        The planner the step's ops ask (through ``PlannedOps``); its group is the one timed over.
    make_step : callable
        Builds the runnable step under the planner's current schedules and returns it (a callable of no
        arguments): eager, the step itself; graph mode, a new capture (``lambda: GraphedCall(forward)``).
    device : torch.device
        Where the step runs (CUDA: timed with events; CPU: with ``perf_counter``).
    warmup, rounds, reps : int
        Untimed steps per variant; interleaved rounds; steps per round (each >= 1, warmup >= 0).
    margin : float
        A variant replaces the plan only if its step is faster by more than this fraction, in [0, 1).
    flips : bool
        Also time each planned key alone set to ``serial/sm`` (else only the whole plan against serial).
    """
    _check(warmup=warmup, rounds=rounds, reps=reps, margin=margin)
    planner.override({})
    with planner.recording() as used:
        planned_step = make_step()
        planned_step()
    keys = sorted(
        (k for k in used if planner.decisions[k].schedule != SERIAL), key=lambda k: (k.shape, k.mode)
    )
    if not keys:
        log.info("verify: every op of the step already runs serial/sm; nothing to check")
        return Verdict(times_ms={}, confirm_ms={}, winner=PLANNED, pinned=())
    trials: dict[str, tuple[OpKey, ...]] = {PLANNED: (), ALL_SERIAL: tuple(keys)}
    if flips and len(keys) > 1:
        trials |= {f"serial:{k.shape} {k.mode}": (k,) for k in keys}
    variants: dict[str, Variant] = {PLANNED: (_activate(planner, ()), planned_step)}
    for name, serial_keys in trials.items():
        if name != PLANNED:
            activate = _activate(planner, serial_keys)
            activate()
            variants[name] = (activate, make_step())
    settings = {"reps": reps, "device": device, "group": planner.group}
    try:
        times, _ = time_interleaved(variants, warmup=warmup, rounds=rounds, **settings)
        best = min(times, key=times.__getitem__)
        confirm: dict[str, float] = {}
        if times[best] < times[PLANNED] * (1.0 - margin):
            pair = {PLANNED: variants[PLANNED], best: variants[best]}
            confirm, _ = time_interleaved(pair, warmup=0, rounds=2 * rounds, **settings)
    finally:
        planner.override({})
    winner = best if confirm and confirm[best] < confirm[PLANNED] * (1.0 - margin) else PLANNED
    pinned = trials[winner]
    if pinned:
        reason = (
            f"measured in the step: {confirm[winner]:.3f} ms with serial/sm here against "
            f"{confirm[PLANNED]:.3f} ms as planned"
        )
        planner.pin(pinned, reason)
    verdict = Verdict(times_ms=times, confirm_ms=confirm, winner=winner, pinned=pinned)
    log.info("verify: %s kept (%d keys pinned to serial/sm)\n%s", winner, len(pinned), verdict.table())
    return verdict


def _activate(planner: Planner, serial_keys: tuple[OpKey, ...]) -> Callable[[], None]:
    """Put a variant in place: ``serial_keys`` run ``serial/sm``, every other key its decision."""
    overrides = dict.fromkeys(serial_keys, SERIAL)
    return lambda: planner.override(overrides)


def _check(*, warmup: int, rounds: int, reps: int, margin: float) -> None:
    for name, value, low in (("warmup", warmup, 0), ("rounds", rounds, 1), ("reps", reps, 1)):
        if not (isinstance(value, int) and value >= low):
            raise ValueError(f"verify_plan: {name} must be an int >= {low}; got {value!r}")
    if not (isinstance(margin, int | float) and 0.0 <= margin < 1.0):
        raise ValueError(f"verify_plan: margin must be a fraction in [0, 1); got {margin!r}")
