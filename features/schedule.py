"""Schedule: how a scenario's communication and GEMM are decomposed, overlapped and executed.

Canonical string form ``serial/<sm|dma>``, ``shard/<sm|dma>[/hp]`` or
``finer/<sm|dma>/s<splits>/<chunk|shard>[/hp]``, e.g. ``finer/dma/s4/chunk/hp``; token-range tables of
schedules (``ScheduleTable``). See docs/shapes.md.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Literal, get_args

from ficco.features._roundtrip import JsonRoundTrip
from ficco.features._validate import check_choice

if TYPE_CHECKING:
    from ficco.features.scenario import Scenario

Granularity = Literal["serial", "shard", "finer"]
Executor = Literal["sm", "dma"]
Grain = Literal["chunk", "shard", "whole"]
Priority = Literal["normal", "high"]

GRANULARITIES: tuple[str, ...] = get_args(Granularity)
EXECUTORS: tuple[str, ...] = get_args(Executor)
PRIORITIES: tuple[str, ...] = get_args(Priority)
FINER_SPLITS: tuple[int, ...] = (2, 4, 8)
SCHEDULE_FAMILIES: tuple[str, ...] = tuple(f"{g}/{e}" for g in GRANULARITIES for e in EXECUTORS)
"""Every ``granularity/executor`` (:attr:`Schedule.family`), serial first: what plots colour schedules by."""
_GRAINS_OF: dict[str, tuple[str, ...]] = {
    "serial": ("whole",),
    "shard": ("shard",),
    "finer": ("chunk", "shard"),
}
_FORMS = "serial/<sm|dma>, shard/<sm|dma>[/hp] or finer/<sm|dma>/s<2|4|8>/<chunk|shard>[/hp]"


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule(JsonRoundTrip):
    """One point of the design space. Build it directly or with :meth:`parse`."""

    granularity: Granularity = "serial"
    """``serial``, ``shard`` (one chunk per rank) or ``finer`` (each shard split into ``splits``)."""
    executor: Executor = "sm"
    """``sm`` (NCCL kernels) or ``dma`` (copy engines)."""
    splits: int = 1
    """Sub-chunks per shard: 1 unless ``finer``, where it is one of 2, 4, 8."""
    grain: Grain | None = None
    """Compute grain: ``chunk``, ``shard`` or ``whole``; None picks the granularity's default
    (serial -> whole, shard -> shard, finer -> chunk)."""
    priority: Priority = "normal"
    """Communication-stream priority; ``high`` only for overlapped (non-serial) schedules."""

    def __post_init__(self) -> None:
        check_choice("Schedule", "granularity", self.granularity, GRANULARITIES)
        check_choice("Schedule", "executor", self.executor, EXECUTORS)
        if self.grain is None:
            object.__setattr__(self, "grain", _GRAINS_OF[self.granularity][0])
        check_choice("Schedule", "grain", self.grain, _GRAINS_OF[self.granularity])
        check_choice("Schedule", "priority", self.priority, PRIORITIES)
        if self.granularity == "finer":
            check_choice("Schedule", "splits", self.splits, FINER_SPLITS)
        elif self.splits != 1:
            raise ValueError(
                f"Schedule.splits must be 1 for granularity {self.granularity!r} (only 'finer' splits "
                f"shards); got {self.splits!r}"
            )
        if self.granularity == "serial" and self.priority != "normal":
            raise ValueError(
                "Schedule.priority must be 'normal' for granularity 'serial' (nothing overlaps); "
                f"got {self.priority!r}"
            )

    @property
    def overlapped(self) -> bool:
        """True when communication and GEMM run concurrently (everything but ``serial``)."""
        return self.granularity != "serial"

    @property
    def family(self) -> str:
        """``granularity/executor``, one of :data:`SCHEDULE_FAMILIES`: ``finer/dma/s4/chunk`` is in
        ``finer/dma``."""
        return f"{self.granularity}/{self.executor}"

    def __str__(self) -> str:
        parts = [self.granularity, self.executor]
        if self.granularity == "finer":
            parts += [f"s{self.splits}", self.grain]
        if self.priority == "high":
            parts.append("hp")
        return "/".join(parts)

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """Parse the canonical string form; raise ``ValueError`` naming the string and the allowed forms."""
        if not isinstance(text, str):
            raise ValueError(f"a schedule must be a string of the form {_FORMS}; got {text!r}")
        parts = text.split("/")
        try:
            priority = "normal"
            if parts[-1] == "hp":
                priority = "high"
                parts = parts[:-1]
            granularity, executor, *rest = parts
            splits, grain = 1, None
            if granularity == "finer":
                s, grain = rest
                if not (s.startswith("s") and s[1:].isdigit()):
                    raise ValueError(f"bad splits field {s!r}")
                splits = int(s[1:])
            elif rest:
                raise ValueError(f"unexpected fields {rest}")
            schedule = cls(
                granularity=granularity, executor=executor, splits=splits, grain=grain, priority=priority
            )
        except ValueError as err:
            raise ValueError(f"unknown schedule {text!r}: {err}. Allowed forms: {_FORMS}") from None
        if str(schedule) != text:
            raise ValueError(f"unknown schedule {text!r}: not canonical, write {str(schedule)!r}")
        return schedule

    def check(self, scenario: Scenario) -> None:
        """Raise ``ValueError`` if this schedule cannot run ``scenario`` (divisibility of the split rows)."""
        pieces = scenario.world_size * self.splits
        if scenario.rows % pieces:
            raise ValueError(
                f"schedule {self} needs the split rows ({scenario.rows}) of scenario {scenario.key()} "
                f"divisible by world_size * splits = {pieces}"
            )


def all_schedules() -> list[Schedule]:
    """Every schedule of the design space, in canonical order (serial first)."""
    out = [Schedule(granularity="serial", executor=e) for e in EXECUTORS]
    out += [Schedule(granularity="shard", executor=e, priority=p) for e in EXECUTORS for p in PRIORITIES]
    out += [
        Schedule(granularity="finer", executor=e, splits=s, grain=g, priority=p)
        for e in EXECUTORS
        for s in FINER_SPLITS
        for g in _GRAINS_OF["finer"]
        for p in PRIORITIES
    ]
    return out


SERIAL = Schedule(granularity="serial", executor="sm")
"""The baseline every recommendation is measured against: NCCL collective, then the GEMM."""
SCHEDULES: tuple[str, ...] = tuple(str(s) for s in all_schedules())
"""Every schedule string in canonical order (serial/sm first): the column order of schedule arrays."""
SCHEDULE_INDEX: dict[str, int] = {s: i for i, s in enumerate(SCHEDULES)}


def max_splits(rows: int, world_size: int) -> int:
    """The largest ``finer`` split count whose sub-chunks divide ``rows`` (a scenario's split rows,
    ``Scenario.rows``) among ``world_size`` ranks evenly, 1 if none does: ``finer/sN`` runs exactly when
    ``N <= max_splits`` (the splits divide one another)."""
    for splits in _SPLITS_DOWN:
        if rows % (world_size * splits) == 0:
            return splits
    return 1


_SPLITS_DOWN = tuple(sorted(FINER_SPLITS, reverse=True))


def range_starts(points: Sequence[int], picks: Sequence[object]) -> tuple[list[int], list[int]]:
    """The one breakpoint rule of token-range tables (docs/shapes.md) over sorted token counts ``points``
    decided ``picks``: each range's first index into ``points`` and its start (the first at ``points[0]``)."""
    firsts, starts = [0], [int(points[0])]
    for i in range(1, len(points)):
        if picks[i] != picks[i - 1]:
            lo, hi = int(points[i - 1]), int(points[i])
            firsts.append(i)
            starts.append(max(lo + 1, round(math.sqrt(lo * hi))))
    return firsts, starts


def candidates(scenario: Scenario) -> list[Schedule]:
    """The schedules that can run ``scenario``, in canonical order; ``SERIAL`` is always first."""
    out = []
    for schedule in all_schedules():
        try:
            schedule.check(scenario)
        except ValueError:
            continue
        out.append(schedule)
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleTable:
    """Schedules by token count, for an op whose row count changes from call to call (dynamic shapes).

    String form ``"M0:SCHED0;M1:SCHED1;..."`` (docs/shapes.md); a plain schedule string is a table of one
    entry. Parse with :func:`parse_schedule_table` (cached), look up with :meth:`at` (a bisect).
    """

    bounds: tuple[int, ...] = (0,)
    """Smallest ``m`` of each entry: starts at 0, strictly increasing."""
    schedules: tuple[Schedule, ...] = (Schedule(),)
    """The schedule of each entry (as many as ``bounds``)."""

    def __post_init__(self) -> None:
        if len(self.bounds) != len(self.schedules) or not self.bounds:
            raise ValueError(
                f"ScheduleTable needs one schedule per bound; got {len(self.bounds)} bounds and "
                f"{len(self.schedules)} schedules"
            )
        if self.bounds[0] != 0 or any(b >= c for b, c in zip(self.bounds, self.bounds[1:], strict=False)):
            raise ValueError(
                f"ScheduleTable.bounds must start at 0 and increase strictly; got {list(self.bounds)}"
            )

    def at(self, m: int) -> Schedule:
        """The schedule of an op of ``m`` rows (>= 0)."""
        return self.schedules[bisect_right(self.bounds, m) - 1]

    def __str__(self) -> str:
        if len(self.schedules) == 1:
            return str(self.schedules[0])
        return ";".join(f"{b}:{s}" for b, s in zip(self.bounds, self.schedules, strict=True))

    @classmethod
    def parse(cls, text: str) -> ScheduleTable:
        """Parse a schedule string or a table string; ValueError naming the bad entry and the forms."""
        if not isinstance(text, str) or not text:
            raise ValueError(f"a schedule table must be a non-empty string {_TABLE_FORM}; got {text!r}")
        if ":" not in text:
            return cls(schedules=(Schedule.parse(text),))
        bounds, schedules = [], []
        for entry in text.split(";"):
            bound, sep, schedule = entry.partition(":")
            if not (sep and bound.isdigit()):
                raise ValueError(f"schedule table {text!r}: bad entry {entry!r}; expected {_TABLE_FORM}")
            bounds.append(int(bound))
            schedules.append(Schedule.parse(schedule))
        try:
            return cls(bounds=tuple(bounds), schedules=tuple(schedules))
        except ValueError as err:
            raise ValueError(f"schedule table {text!r}: {err}") from None


_TABLE_FORM = "'SCHEDULE' or 'M0:SCHEDULE0;M1:SCHEDULE1;...' with M0 = 0 < M1 < ..."


@lru_cache(maxsize=1024)
def parse_schedule_table(text: str) -> ScheduleTable:
    """:meth:`ScheduleTable.parse`, cached: the one parser of schedule and table strings an op is given."""
    return ScheduleTable.parse(text)
