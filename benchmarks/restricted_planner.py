"""Candidate fixes for eager overlap that loses in a training step, as restrictions on a planner's picks,
switchable between steps so that one run times them side by side (``benchmarks/runtimes.py``).

A :class:`RestrictedPlanner` is a ``runtime.Planner`` whose every answer passes through its current
:class:`Restriction`; :meth:`RestrictedPlanner.use` switches it (between steps: the styles of
``runtime.tp`` and the compile pass ask ``Planner.schedule`` for each call's schedule, so the next call
runs the new one). Each restriction is one cause the eager slowdown could have and the fix that would remove
it (:data:`RESTRICTIONS`; what each predicts is in ``docs/runtimes.md``, "Why eager overlap can lose"):

- ``all_serial``: every op ``serial/sm``. Not a fix: the styles' own cost (host time, layout copies) with
  no overlap at all. Slower than eager serial means the loss is in ficco's eager path, not in the picks.
- ``bwd_serial``: the backward's ops (``bwd-input``) ``serial/sm``, the forward as planned: the fix if the
  backward's picks lose (planned from each op timed alone, where the step's backward overlaps them with
  the weight gradients' GEMMs).
- ``sm_only``: every pick's transfers on NCCL instead of the copy engines (``x/dma`` -> ``x/sm``): the fix
  if the copy engines' transfers slow the neighbouring GEMMs (HBM contention).
- ``min_gain_5``: picks predicted less than 5% faster than serial run ``serial/sm``: the fix if the
  losses are the picks the model is unsure of.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from ficco.features import SERIAL, Schedule
from ficco.runtime import OpRequest, Planner


@dataclass(frozen=True, kw_only=True, slots=True)
class Restriction:
    """What a planner's pick goes through before its op runs it."""

    all_serial: bool = False
    """Every op ``serial/sm``."""
    backward: Literal["planned", "serial"] = "planned"
    """``serial``: the ops of the backward (input gradients) run ``serial/sm``."""
    transport: Literal["any", "sm"] = "any"
    """``sm``: picks that move data with the copy engines move it with NCCL instead."""
    min_gain: float | None = None
    """Picks whose predicted speedup over serial is below ``1 + min_gain`` run ``serial/sm``; None: none."""

    def apply(self, direction: str, schedule: Schedule, predicted: float | None) -> Schedule:
        """The schedule an op of ``direction`` runs for the pick ``schedule`` of ``predicted`` speedup."""
        if schedule == SERIAL:
            return schedule
        if self.all_serial or (self.backward == "serial" and direction != "fwd"):
            return SERIAL
        if self.min_gain is not None and (predicted is None or predicted < 1.0 + self.min_gain):
            return SERIAL
        if self.transport == "sm" and schedule.executor == "dma":
            return replace(schedule, executor="sm")
        return schedule


PLANNED = "planned"
RESTRICTIONS: dict[str, Restriction] = {
    PLANNED: Restriction(),
    "all_serial": Restriction(all_serial=True),
    "bwd_serial": Restriction(backward="serial"),
    "sm_only": Restriction(transport="sm"),
    "min_gain_5": Restriction(min_gain=0.05),
}
"""The restrictions by name (module docstring); ``planned`` runs the picks as they are."""


class RestrictedPlanner(Planner):
    """A ``runtime.Planner`` (same arguments) whose answers pass through :attr:`restriction`."""

    restriction: Restriction = RESTRICTIONS[PLANNED]

    def use(self, name: str) -> None:
        """Run the restriction ``name`` (:data:`RESTRICTIONS`) from the next call on; every rank alike."""
        if name not in RESTRICTIONS:
            raise ValueError(f"restriction must be one of {list(RESTRICTIONS)}; got {name!r}")
        self.restriction = RESTRICTIONS[name]
        self._by_request.clear()

    def schedule(self, request: OpRequest) -> Schedule:
        hit = self._by_request.get(id(request))
        if hit is not None and hit[0] is request:
            return hit[1]
        picked = super().schedule(request)  # an override (runtime.verify's trials) stays what it says
        decision = self.decisions[self.key(request)]
        schedule = self.restriction.apply(request.direction, picked, decision.predicted_speedup)
        self._by_request[id(request)] = (request, schedule)  # the hot path's cache, as Planner keeps it
        return schedule
