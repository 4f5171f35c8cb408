"""Where a planner's schedules come from: a local ``Predictor``, the HTTP service, exported tables, a fixed
schedule or a function. Every source answers a batch of scenarios in one call, ``source.recommend(scenarios,
mode) -> list[Answer]``, and bounds its own wait; ``answer_from`` builds the ``Answer`` a planner reads from a
predictor's ``Recommendation`` or the service's ``RecommendationPublic``.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import types
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from ficco.features import (
    DEFAULT_HARDWARE_ID,
    SERIAL,
    Mode,
    Scenario,
    Schedule,
    ScheduleTable,
    parse_schedule_table,
)
from ficco.features.schedule_table import Entry, ScheduleTableFile

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class Answer:
    """A source's recommendation for one scenario, as the planner uses it."""

    schedule: str
    """Canonical schedule string (``serial/sm`` when the source itself fell back)."""
    predicted_speedup: float | None = None
    """Predicted ``t_serial / t_schedule`` of ``schedule``; None if the source does not say."""
    fallback: bool = False
    """True when the source replaced its own pick with ``serial/sm``."""
    fallback_reason: str | None = None
    """Why the source fell back; None otherwise."""
    origin: str = ""
    """Who answered, e.g. ``model h200x2/20261122T054236Z-dbd58aaf`` or ``service http://...``."""
    model_backend: str | None = None
    """``measured`` or ``simulated``: what the answering model was trained on (``features.provenance``);
    None for a source without a model (fixed schedules, tables) or a server that does not say."""
    neighbours: int | None = None
    """Measured neighbours of the scenario in the answering model's training data
    (``training.predict.coverage``; a table's: the fewest over the range); None when the source does not say
    (fixed schedules, a model without coverage). Fewer than ``training.predict.coverage.OFF_MAP_BELOW`` is an
    answer off the measured map."""


class ScheduleSource(Protocol):
    """Anything that recommends schedules for a batch of scenarios in one execution mode."""

    def recommend(self, scenarios: Sequence[Scenario], mode: Mode) -> list[Answer]:
        """One answer per scenario, in order; may raise or take long (the planner bounds it)."""
        ...


def answer_from(rec: Any, origin: str) -> Answer:
    """An ``Answer`` from a predictor ``Recommendation`` (either version) or a service
    ``RecommendationPublic``: both carry ``schedule``, ``predicted_speedup``, ``fallback`` and
    ``fallback_reason`` (and, from newer models and servers, ``model_backend`` and ``neighbours``)."""
    return Answer(
        schedule=str(rec.schedule),
        predicted_speedup=None if rec.predicted_speedup is None else float(rec.predicted_speedup),
        fallback=bool(rec.fallback),
        fallback_reason=rec.fallback_reason,
        origin=origin,
        model_backend=getattr(rec, "model_backend", None),
        neighbours=getattr(rec, "neighbours", None),
    )


class PredictorSource:
    """A local ``training.predict.predictor.Predictor`` (``training.predict.registry.load_predictor``)."""

    def __init__(self, predictor: Any, host_factor: float | None = None) -> None:
        self.predictor = predictor
        self.host_factor = host_factor
        """This machine's host factor (``features.launch_cost``) for eager answers; None: the model's own."""
        self.origin = f"model {getattr(predictor, 'hardware_id', '?')}/{getattr(predictor, 'version', '?')}"
        if getattr(predictor, "backend", None):
            self.origin += f" ({predictor.backend})"

    @classmethod
    def load(
        cls,
        root: str | None = None,
        hardware_id: str = DEFAULT_HARDWARE_ID,
        version: str | None = None,
        host_factor: float | None = None,
    ):
        """Load ``hardware_id``'s current (or ``version``) model from the registry at ``root``
        (None: ``training.predict.registry.default_model_root()``), to answer for a machine of
        ``host_factor``."""
        from ficco.training.predict.registry import default_model_root, load_predictor

        return cls(load_predictor(root or default_model_root(), hardware_id, version), host_factor)

    @property
    def hardware_id(self) -> str | None:
        return getattr(self.predictor, "hardware_id", None)

    def recommend(self, scenarios: Sequence[Scenario], mode: Mode) -> list[Answer]:
        machine = {} if self.host_factor is None else {"host_factor": self.host_factor}
        recs = self.predictor.recommend(list(scenarios), mode=mode, **machine)
        return [answer_from(r, self.origin) for r in recs]


@dataclass(eq=False)
class ServiceSource:
    """The recommendation service, through a ``service.client.ServiceClient``.

    ``tables=True``: at the first decision of a (world size, mode, dtype), fetch the served model's schedule
    table once (``ServiceClient.fetch_table`` with ``config`` and ``cache_dir``; ``machine`` checked as
    :meth:`TableSource.load` does) and answer every shape from it (docs/tables.md, "Tables over HTTP").
    """

    client: Any
    host_factor: float | None = None
    """This machine's host factor (``features.launch_cost``) for eager answers; None: the served model's
    own."""
    _: KW_ONLY
    tables: bool = False
    config: dict[str, Any] | None = None
    cache_dir: str | Path | None = None
    machine: dict[str, Any] | Literal["auto"] | None = "auto"
    _tables: dict[tuple[str, int, str, str], TableSource] = field(default_factory=dict, init=False)
    """(hardware id, world size, mode, dtype) -> the fetched table's source."""

    @property
    def origin(self) -> str:
        return "service tables" if self.tables else "service"

    @property
    def hardware_id(self) -> str | None:
        return None

    def recommend(self, scenarios: Sequence[Scenario], mode: Mode) -> list[Answer]:
        if self.tables:
            return [self._table_of(s, mode).answer(s, mode) for s in scenarios]
        machine = {} if self.host_factor is None else {"host_factor": self.host_factor}
        bodies = [
            {"op": s.op, "m": s.m, "n": s.n, "k": s.k, "dtype": s.dtype, "world_size": s.world_size}
            | {"hardware": s.hardware.id, "mode": mode, **machine}
            for s in scenarios
        ]
        answers = self.client.recommend_many(bodies, errors="return")  # each scenario answered or refused
        return [
            _serial(f"the service refused it: {a}", self.origin)
            if isinstance(a, Exception)
            else answer_from(a, self.origin)
            for a in answers
        ]

    def _table_of(self, scenario: Scenario, mode: Mode) -> TableSource:
        """The table source of ``scenario``'s (hardware, world size, dtype) in ``mode``, fetched once."""
        key = (scenario.hardware.id, scenario.world_size, mode, scenario.dtype)
        found = self._tables.get(key)
        if found is None:
            table = self.client.fetch_table(
                key[0], tp=key[1], mode=mode, dtype=key[3], config=self.config, cache_dir=self.cache_dir
            )
            from ficco.features.fingerprint import machine_fingerprint

            here = machine_fingerprint() if self.machine == "auto" else self.machine
            if here is not None:
                table.check_machine(here, f"the service's table for {key}")
            found = self._tables[key] = TableSource(tables=[table], origin=table.origin)
        return found


class _EachScenario:
    """A source that answers one scenario at a time, the same on any hardware (``hardware_id`` None), at
    once and alike on every rank (no I/O, no model)."""

    origin: str
    deterministic = True
    """Its answers are immediate and equal on every rank: a planner over it asks it on each rank, without a
    broadcast (no collective)."""
    cache_key: str | None = None
    """What its answers depend on, for the compile pass's graph cache; None: unknown (no cache)."""

    @property
    def hardware_id(self) -> str | None:
        return None

    def recommend(self, scenarios: Sequence[Scenario], mode: Mode) -> list[Answer]:
        return [self.answer(s, mode) for s in scenarios]

    def answer(self, scenario: Scenario, mode: Mode) -> Answer:
        raise NotImplementedError


class FixedSource(_EachScenario):
    """One schedule for every scenario (baselines: ``serial/sm`` everywhere, ``shard/dma`` everywhere), or a
    token-range table string (``"0:serial/sm;2048:shard/dma"``: the entry of the scenario's ``m``,
    ``features.ScheduleTable``); a scenario it cannot run gets ``serial/sm`` with the reason."""

    def __init__(self, schedule: Schedule | str) -> None:
        self.table = ScheduleTable(schedules=(schedule,)) if isinstance(schedule, Schedule) else None
        self.table = self.table or parse_schedule_table(schedule)
        self.schedule = self.table.schedules[0] if len(self.table.schedules) == 1 else self.table
        """The one schedule, or the table."""
        self.origin = f"fixed {self.table}"
        self.cache_key = self.origin

    def answer(self, scenario: Scenario, mode: Mode) -> Answer:
        schedule = self.table.at(scenario.m)
        try:
            schedule.check(scenario)
        except ValueError as err:
            return _serial(str(err), self.origin)
        return Answer(schedule=str(schedule), origin=self.origin)


ScheduleFn = Callable[[str, int, int, int, str, int], "Schedule | str"]
"""``(op, m, n, k, dtype, world_size) -> schedule``, ``features.Scenario`` conventions."""


class FunctionSource(_EachScenario):
    """Schedules from ``fn(op, m, n, k, dtype, world_size)`` (``features.Scenario`` conventions; it must be
    deterministic: every rank asks it); a call that raises or answers no schedule gives ``serial/sm`` with
    the reason."""

    def __init__(self, fn: ScheduleFn) -> None:
        self.fn = fn
        self.origin = f"function {getattr(fn, '__qualname__', type(fn).__name__)}"
        self.cache_key = _code_key(fn)

    def answer(self, scenario: Scenario, mode: Mode) -> Answer:
        s = scenario
        try:
            schedule = self.fn(s.op, s.m, s.n, s.k, s.dtype, s.world_size)
            schedule = schedule if isinstance(schedule, Schedule) else Schedule.parse(schedule)
        except Exception as err:  # a bad answer costs the overlap, not the step
            return _serial(f"the schedule function failed: {type(err).__name__}: {err}", self.origin)
        return Answer(schedule=str(schedule), origin=self.origin)


def _code_key(fn: Callable) -> str | None:
    """What a plain function's answers depend on: its name, code and constants; None for anything whose
    answers may depend on state (a closure, a bound method, a callable object, global data it reads such as
    a module-level table)."""
    code = getattr(fn, "__code__", None)
    if code is None or getattr(fn, "__closure__", None) or hasattr(fn, "__self__"):
        return None
    stateless = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type)
    if any(
        not isinstance(fn.__globals__.get(name), stateless)
        for name in code.co_names
        if name in fn.__globals__
    ):
        return None
    digest = hashlib.sha256(code.co_code + repr(code.co_consts).encode()).hexdigest()[:16]
    return f"function {fn.__module__}.{fn.__qualname__} {digest}"


class TableSource(_EachScenario):
    """Schedules looked up in tables: exported schedule tables (``features.schedule_table``, what
    ``ficco export`` writes; :meth:`load`), and/or a dict keyed by ``(op, m, n, k, mode)`` (e.g. the per-op
    best of a measured dataset), which wins where both hold a shape. A scenario in neither gets
    ``serial/sm`` with the reason, or ``on_missing(scenario, mode)`` (an ``Answer``) when given. An exported
    table answers ``m`` by ``features.schedule_table.Entry.lookup``'s rule (docs/tables.md, "Lookup").
    """

    def __init__(
        self,
        table: dict[tuple[str, int, int, int, str], Answer] | None = None,
        *,
        tables: Sequence[ScheduleTableFile] = (),
        on_missing: Callable[[Scenario, Mode], Answer] | None = None,
        origin: str = "table",
    ) -> None:
        self.table = table or {}
        self.tables = tuple(tables)
        self.on_missing = on_missing
        self.origin = origin
        self._entries: dict[tuple, tuple[Entry, dict[int, list[Answer]]]] = {}
        """(op, n, k, experts, top_k, world_size, mode, dtype) -> (the entry, one answer per range of each
        track, by the track's ``max_splits``)."""
        for t in self.tables:
            for (op, n, k, experts, top_k), entry in t.entries.items():
                answers = {
                    track.max_splits: [
                        Answer(
                            schedule=r.schedule,
                            predicted_speedup=r.predicted_speedup,
                            origin=t.origin,
                            neighbours=r.neighbours,
                        )
                        for r in track.ranges
                    ]
                    for track in entry.tracks
                }
                self._entries[(op, n, k, experts, top_k, t.world_size, t.mode, t.dtype)] = (entry, answers)

    @classmethod
    def load(
        cls,
        *paths: str | Path,
        machine: dict[str, Any] | Literal["auto"] | None = "auto",
        on_missing: Callable[[Scenario, Mode], Answer] | None = None,
    ) -> TableSource:
        """The exported tables in ``paths`` (files or directories), checked against ``machine``: the loading
        machine's fingerprint fields (``features.schedule_table.FINGERPRINT_KEYS``); ``"auto"`` reads them
        from this machine's GPUs (without CUDA the log says nothing was checked); None checks nothing. A
        table of another fingerprint raises ``FingerprintMismatch`` naming both fingerprints."""
        from ficco.features.fingerprint import machine_fingerprint
        from ficco.features.schedule_table import table_paths

        tables = []
        for path in table_paths(paths):
            t = ScheduleTableFile.read(path)
            here = machine_fingerprint() if machine == "auto" else machine
            if here is not None:
                t.check_machine(here, str(path))
            elif machine == "auto":
                log.warning("%s: no CUDA device here, fingerprint %s not checked", path, t.fingerprint)
            tables.append(t)
        origins = sorted({t.origin for t in tables})
        return cls(tables=tables, on_missing=on_missing, origin=", ".join(origins))

    @property
    def hardware_id(self) -> str | None:
        ids = {t.header.get("hardware_id") for t in self.tables}
        return ids.pop() if len(ids) == 1 else None

    def answer(self, scenario: Scenario, mode: Mode) -> Answer:
        hit = self.table.get((scenario.op, scenario.m, scenario.n, scenario.k, mode))
        if hit is not None:
            return hit
        s = scenario
        found = self._entries.get((s.op, s.n, s.k, s.experts, s.top_k, s.world_size, mode, s.dtype))
        if found is not None:
            entry, answers = found
            track = entry.track(s.m, s.world_size)
            return answers[track.max_splits][max(0, bisect.bisect_right(track.breakpoints, s.m) - 1)]
        if self.on_missing is not None:
            return self.on_missing(scenario, mode)
        return _serial(f"{scenario.key()} ({mode}) is not in the table", self.origin)


def local_source() -> tuple[PredictorSource | None, str]:
    """The measured model of this machine's GPUs from the local registry (``training.predict.registry``): the
    built-in hardware of CUDA's device name and count (``features.hardware.hardware_of``), and its
    description; ``(None, why)`` where there is none."""
    import torch

    from ficco.features.hardware import hardware_of
    from ficco.training.predict.registry import ModelLoadError

    if not torch.cuda.is_available():
        return None, "no CUDA GPU here"
    name, count = torch.cuda.get_device_name(), torch.cuda.device_count()
    profile = hardware_of(name, count)
    if profile is None:
        return None, f"{count} x {name} is no built-in hardware"
    try:
        source = PredictorSource.load(hardware_id=profile.id)
    except ModelLoadError as err:
        return None, str(err)
    return source, f"{source.origin}, for {count} x {name}"


def _serial(reason: str, origin: str) -> Answer:
    """The ``serial/sm`` fallback answer of a source, with the reason."""
    return Answer(schedule=str(SERIAL), fallback=True, fallback_reason=reason, origin=origin)
