"""The planner: one schedule per (op, m, n, k, dtype, world size, mode), asked once and kept.

A failing or unusable answer, one first needed inside a CUDA graph capture, and a graph-mode answer off the
measured map run ``serial/sm``, with the reason in the log; rank 0 of the group asks and broadcasts, so
every rank runs the same schedule (a deterministic source, such as a fixed schedule, a table or a function,
is asked on each rank, even during a capture). :func:`as_planner` turns every form of ``schedules=`` the
runtimes take into a planner. The rules and their measurements: docs/planner.md.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from ficco.executor import library
from ficco.executor.layout import Rates, batch_extra_us, call_us, gemm_us, weight_columns
from ficco.features import (
    DEFAULT_HARDWARE_ID,
    MODES,
    SERIAL,
    Mode,
    Scenario,
    Schedule,
    ScheduleTable,
    get_hardware,
)
from ficco.features.hardware import hardware_of
from ficco.features.schedule import range_starts
from ficco.features.vector import roofline_comm_us
from ficco.runtime.sources import Answer, ScheduleSource
from ficco.tables import markdown_table
from ficco.training.predict.coverage import OFF_MAP_BELOW, off_map

OffMap = Literal["serial", "model"]
OFF_MAP_CHOICES: tuple[str, ...] = ("serial", "model")
"""What runs for an answer off the measured map: ``serial/sm`` (the default) or the model's pick."""

log = logging.getLogger(__name__)

Direction = Literal["fwd", "bwd-input", "bwd-weight"]
"""Where a layer runs an op: its forward, the input gradient, or the weight gradient."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OpShape:
    """An op and its per-rank shape (``features.Scenario`` conventions), element type and group size."""

    op: Literal["ag_gemm", "gemm_rs"]
    m: int
    n: int
    k: int
    dtype: str
    world_size: int


def _shape_fields(shape: object) -> dict[str, object]:
    """``OpShape``'s fields of ``shape`` (any object that has them, e.g. an ``OpRequest``), by name."""
    return {f.name: getattr(shape, f.name) for f in dataclasses.fields(OpShape)}


@dataclass(frozen=True, kw_only=True, slots=True)
class OpKey(OpShape):
    """What a decision depends on: the op's shape, the sequences its rows hold and the execution mode."""

    mode: Mode
    batch: int = 1
    """Sequences the op's rows hold (``OpRequest.batch``): a batched call's layout costs GPU work the
    planner prices (:func:`priced`)."""
    ns: tuple[int, ...] = ()
    """The columns of each weight of a gather that feeds several (``OpRequest.ns``)."""

    @property
    def shape(self) -> str:
        sequences = f" batch={self.batch}" if self.batch > 1 else ""
        weights = f" ({'+'.join(map(str, self.ns))})" if self.ns else ""
        return f"{self.op} m={self.m} n={self.n}{weights} k={self.k}{sequences}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Decision:
    """The schedule a key runs, and where it came from."""

    schedule: Schedule
    """What runs (``serial/sm`` on any fallback)."""
    predicted_speedup: float | None = None
    """The source's predicted ``t_serial / t_schedule``; None when unknown or on a fallback."""
    reason: str | None = None
    """Why ``serial/sm`` runs instead of the source's pick; None when the source's pick runs."""
    origin: str = ""
    """Who decided (the source's origin, or ``planner`` for a fallback of the planner's own)."""
    neighbours: int | None = None
    """The answer's measured-neighbour count (``Answer.neighbours``); None when the source does not say."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OpRequest(OpShape):
    """One op a layer will run, for :meth:`Planner.prepare` (and the decision table)."""

    layer: str
    """The layer's name, e.g. ``layers.0.attn.qkv``."""
    direction: Direction
    batch: int = 1
    """Sequences the rows hold: a sequence-parallel ``[batch, seq/w, k]`` shard gathered (or scattered)
    along the sequence."""
    ns: tuple[int, ...] = ()
    """The columns of each weight of an ``ag_gemm`` whose gathered input feeds several (q/k/v: their own
    GEMMs, summing to ``n``), () for one: the planner prices each GEMM of a split (:func:`priced`)."""


class Planner:
    """Decides, caches and reports the schedule of every (op, shape, dtype, world size, mode).

    Parameters
    ----------
    source : ScheduleSource
        Where schedules come from (``runtime.sources``).
    mode : {"eager", "graph"}, default="eager"
        Execution mode the layers run in (``graph``: replayed from a CUDA graph, inference and decode).
    hardware : str, optional
        Hardware id of the scenarios asked about; default: the source's own (a local model's), else
        ``h200x2`` (for a larger group, the same GPUs at its size: ``h200x4`` for 4 ranks).
    group : ProcessGroup, optional
        The tensor-parallel group whose ranks must agree (default: the world, when initialised).
    off_map : {"serial", "model"}, default="serial"
        What runs for an answer off the measured map (fewer measured neighbours than
        ``training.predict.coverage.OFF_MAP_BELOW`` of the mode): ``serial/sm`` (the reason in the log and the
        table), or the source's pick (then check the plan in place, ``runtime.verify.verify_plan``).
    timeout_s : deprecated
        Does nothing (the source bounds its own wait: ``ServiceClient(timeout_s=...)``); goes in the next
        release.
    """

    def __init__(
        self,
        source: ScheduleSource,
        *,
        mode: Mode = "eager",
        hardware: str | None = None,
        group: dist.ProcessGroup | None = None,
        off_map: OffMap = "serial",
        timeout_s: float | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"Planner.mode must be one of {list(MODES)}; got {mode!r}")
        if off_map not in OFF_MAP_CHOICES:
            raise ValueError(f"Planner.off_map must be one of {list(OFF_MAP_CHOICES)}; got {off_map!r}")
        deprecated_timeout("Planner(timeout_s=...)", timeout_s)
        self.source = source
        self.mode = mode
        given = hardware or getattr(source, "hardware_id", None)
        self.hardware = get_hardware(given or DEFAULT_HARDWARE_ID)
        self._hardware_given = given is not None
        """False when the hardware is the default: then a group larger than it is asked about as the same
        GPUs at the group's size (``h200x4`` for 4 ranks)."""
        self.group = group
        self.off_map = off_map
        self.decisions: dict[OpKey, Decision] = {}
        self.uses: dict[tuple[str, str, OpKey | str], None] = {}
        """Every (layer, direction, key it ran, or a description of a plain GEMM) seen, in order."""
        self._by_request: dict[int, tuple[OpRequest, Schedule]] = {}
        """id(request) -> (request, its schedule): the hot path's cache, dropped when a decision changes."""
        self._overrides: dict[OpKey, Schedule] = {}
        """Keys that run another schedule than their decision for now (``override``: in-place trials)."""
        self._recording: set[OpKey] | None = None
        """While ``recording()`` runs: the keys looked up."""

    @contextmanager
    def step(self) -> Iterator[None]:
        """Deprecated, does nothing: decisions never change inside a step (nor between steps, but by
        :meth:`override` and :meth:`pin`). Goes in the next release."""
        warnings.warn(
            "Planner.step() is deprecated and does nothing (decisions never change by themselves); drop the "
            "with-block. It goes in the next release.",
            DeprecationWarning,
            stacklevel=3,
        )
        yield

    def key(self, shape: OpShape) -> OpKey:
        """The cache key of ``shape``'s op (an ``OpRequest`` or a bare ``OpShape``) in this planner's mode."""
        extra = {"batch": getattr(shape, "batch", 1), "ns": tuple(getattr(shape, "ns", ()))}
        return OpKey(mode=self.mode, **extra, **_shape_fields(shape))

    def schedule(self, request: OpRequest) -> Schedule:
        """The schedule of ``request``'s op (decided now if new). The hot path is one lookup by the request's
        identity: layers keep their requests, and hashing one field by field would cost more than the call."""
        hit = self._by_request.get(id(request))
        if hit is not None and hit[0] is request:
            return hit[1]
        key = self.key(request)
        decision = self.decisions.get(key)
        if decision is None:
            self._decide([key])
            decision = self.decisions[key]
        self.uses.setdefault((request.layer, request.direction, key), None)
        if self._recording is not None:
            self._recording.add(key)
        schedule = self._overrides.get(key, decision.schedule)
        self._by_request[id(request)] = (request, schedule)
        return schedule

    def override(self, schedules: dict[OpKey, Schedule]) -> None:
        """Run ``schedules[key]`` for these keys until the next ``override`` (``{}``: every decision again),
        keeping the decisions themselves: what an in-place trial (``runtime.verify``) switches between.
        Call it on every rank of the group, with the same mapping."""
        self._overrides = dict(schedules)
        self._by_request.clear()

    @contextmanager
    def recording(self) -> Iterator[set[OpKey]]:
        """The set of keys the ops run inside the block look up (each request is looked up afresh)."""
        self._recording = set()
        self._by_request.clear()
        try:
            yield self._recording
        finally:
            self._recording = None

    def pin(self, keys: Iterable[OpKey], reason: str) -> None:
        """Run ``serial/sm`` for ``keys`` from now on, with ``reason`` in the log and the table (a decision
        measured slower in place than serial). Call it on every rank of the group, with the same keys."""
        for key in keys:
            self._set(key, _fallback(reason, origin="verify"))

    def note(self, layer: str, direction: Direction, what: str) -> None:
        """Record a step that is not a planned op (a weight gradient's GEMM) for the table."""
        self.uses.setdefault((layer, direction, what), None)

    def prepare(self, requests: Iterable[OpRequest], *, timeout_s: float | None = None) -> None:
        """Decide every request's op now, in one batch (before a CUDA graph capture, or the first step).
        ``timeout_s`` is deprecated and does nothing."""
        deprecated_timeout("Planner.prepare(timeout_s=...)", timeout_s)
        keys = []
        for r in requests:
            key = self.key(r)
            self.uses.setdefault((r.layer, r.direction, key), None)
            if key not in self.decisions and key not in keys:
                keys.append(key)
        if keys:
            self._decide(keys)

    def _decide(self, keys: Sequence[OpKey]) -> None:
        """Decide ``keys`` (none cached): on rank 0 of the group ask the source, then agree by broadcast."""
        deterministic = getattr(self.source, "deterministic", False)
        if _capturing() and not deterministic:
            why = "first asked during a CUDA graph capture, where the planner asks no one"
            for key in keys:
                self._set(key, _fallback(f"{why}; call Planner.prepare before capturing"))
            return
        if deterministic:  # alike on every rank, at once: nothing to agree
            decisions = self._ask(keys)
        else:
            group = self._agree_group()
            decisions = self._ask(keys) if group is None or dist.get_rank(group) == 0 else None
            if group is not None:  # rank 0's decisions on every rank
                box = [decisions]
                dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
                decisions = box[0]
        for key, decision in zip(keys, decisions, strict=True):
            self._set(key, decision)

    def _ask(self, keys: Sequence[OpKey]) -> list[Decision]:
        """The source's decisions for ``keys``."""
        try:
            scenarios = [self._scenario(key) for key in keys]
        except ValueError as err:
            return [_fallback(f"not a valid scenario: {err}") for _ in keys]
        try:
            answers = self.source.recommend(scenarios, self.mode)
        except Exception as err:
            return [_fallback(f"the source failed: {type(err).__name__}: {err}") for _ in keys]
        if len(answers) != len(keys):
            why = f"the source gave {len(answers)} answers for {len(keys)} scenarios"
            return [_fallback(why)] * len(keys)
        return [
            priced(_decision(a, s, self.mode, self.off_map), s, key.batch, key.ns)
            for a, s, key in zip(answers, scenarios, keys, strict=True)
        ]

    def _set(self, key: OpKey, decision: Decision) -> None:
        self.decisions[key] = decision
        self._by_request.clear()
        if decision.reason is None:
            log.info(
                "planner: %s %s -> %s (predicted %.2fx, %s)",
                key.shape,
                key.mode,
                decision.schedule,
                decision.predicted_speedup or 1.0,
                decision.origin,
            )
        else:
            log.warning(
                "planner: %s %s -> %s because %s", key.shape, key.mode, decision.schedule, decision.reason
            )

    def _scenario(self, key: OpKey) -> Scenario:
        hardware = self.hardware
        if not self._hardware_given and key.world_size > hardware.gpu_count:  # the default at the group size
            hardware = hardware_of(hardware.gpu_name, key.world_size) or hardware
        return Scenario(hardware=hardware, **_shape_fields(key))

    def _agree_group(self) -> dist.ProcessGroup | None:
        """The group whose ranks must agree, or None when this process decides alone."""
        if not dist.is_initialized():
            return None
        group = self.group if self.group is not None else dist.group.WORLD
        return group if dist.get_world_size(group) > 1 else None

    def rows(self) -> list[dict]:
        """One row per (layer, direction, shape) seen, in order (the columns of :meth:`table`)."""
        out = []
        for layer, direction, key in self.uses:
            row = {"layer": layer, "direction": direction, "shape": key, "schedule": "-"}
            row |= {"predicted_speedup": None, "neighbours": None, "note": "", "origin": "", "ran": "-"}
            if isinstance(key, OpKey):  # a planned op, not a plain GEMM
                row |= self._decision_cells(key)
            out.append(row)
        return out

    def _decision_cells(self, key: OpKey) -> dict:
        """The cells of :meth:`rows` that ``key``'s decision and what the executor ran fill in."""
        d = self.decisions.get(key)
        if d is None:
            return {"shape": key.shape, "schedule": "(not decided)", "ran": "(not run)"}
        schedule = str(self._overrides.get(key, d.schedule))
        run = library.ran(key.op, key.m, key.n, key.k, key.dtype, key.world_size, schedule)
        notes = [d.reason or ""]
        if run is not None and run.reason is not None:
            notes.append(f"ran {run.ran}: {run.reason}")
        return {
            "shape": key.shape,
            "schedule": str(d.schedule),
            "predicted_speedup": d.predicted_speedup,
            "neighbours": d.neighbours,
            "note": "; ".join(n for n in notes if n),
            "origin": d.origin,
            "ran": run.ran if run is not None else "(not run)",
        }

    def table(self) -> str:
        """The decisions of the run as a markdown table."""
        header = ["layer", "direction", "shape", "schedule", "ran", "predicted speedup", "neighbours", "note"]
        rows = []
        for r in self.rows():
            speedup = "-" if r["predicted_speedup"] is None else f"{r['predicted_speedup']:.2f}x"
            neighbours = "-" if r["neighbours"] is None else str(r["neighbours"])
            cells = [r[c] for c in ("layer", "direction", "shape", "schedule", "ran")]
            rows.append([*cells, speedup, neighbours, r["note"]])
        return markdown_table(header, rows)


def _decision(answer: Answer, scenario: Scenario, mode: Mode, off_map_rule: OffMap = "serial") -> Decision:
    """The decision for one answer: its schedule if it is a valid candidate (and, under the ``serial``
    off-map rule, on the measured map), else ``serial/sm``."""
    near = answer.neighbours
    if answer.fallback:
        return _fallback(
            f"the source fell back: {answer.fallback_reason or 'no reason given'}", answer.origin, near
        )
    try:
        schedule = Schedule.parse(answer.schedule)
        schedule.check(scenario)
    except ValueError as err:
        return _fallback(f"the source answered an unusable schedule: {err}", answer.origin, near)
    if schedule != SERIAL and off_map_rule == "serial" and off_map(near, mode):
        reason = (
            f"off the measured map: {near} measured neighbours (fewer than {OFF_MAP_BELOW[mode]}) for "
            f"{schedule}; Planner(off_map='model') runs it (then check it in place with verify_plan)"
        )
        return _fallback(reason, answer.origin, near)
    speedup = 1.0 if schedule == SERIAL else answer.predicted_speedup
    return Decision(schedule=schedule, predicted_speedup=speedup, origin=answer.origin, neighbours=near)


DEFAULT_TOKEN_POINTS: tuple[int, ...] = tuple(2**i for i in range(6, 18))
"""Token counts (an op's ``m``) a dynamic-shape op is decided at: 64 to 131072, doubling."""


def token_table(points: Sequence[int], schedules: Sequence[Schedule]) -> str:
    """One schedule string, or a token-range table that switches at the geometric mean of two neighbouring
    ``points`` that decided differently (``features.schedule.range_starts``, the rule ``ficco export``'s
    tables share), its first range from 0."""
    firsts, starts = range_starts(points, schedules)
    bounds = (0, *starts[1:])
    return str(ScheduleTable(bounds=bounds, schedules=tuple(schedules[i] for i in firsts)))


PRICED_MARGIN = 1.05
"""The speedup a batched call's pick must keep once priced (:func:`priced`): the cost model's own error (a
split's GEMM time over the whole GEMM's within 5% on average, ``executor.layout.KERNEL_FLOOR_US``), so that a
pick is kept only where the overlap pays for the extra GPU work beyond what the model can tell apart."""


def priced(decision: Decision, scenario: Scenario, batch: int, ns: tuple[int, ...] = ()) -> Decision:
    """``decision`` for an op whose rows hold ``batch`` sequences, with the GPU work of its decomposition
    priced in (``executor.layout``): the source predicted ``t_serial / t_schedule`` for the op on one
    sequence. On ``batch`` both pay their layout's work (serial: PyTorch's concatenation of the gathered
    input or of the partial product; an overlapped schedule: its concatenations, or a weight read per
    segment), and no schedule ends before its own GEMMs and copies, whatever it overlaps: one GEMM per
    weight (``ns``, a gather feeding several) and piece, each at the rate a GEMM of its size reaches
    (``executor.layout.gemm_us``: a split's small pieces run below the whole GEMM's rate). The op's serial
    time is estimated as its GEMMs plus its communication at the link's bandwidth (no latency: what overlap
    can hide at most). The pick stays where that predicts a speedup above :data:`PRICED_MARGIN`, else
    ``serial/sm`` runs with the reason. Nothing to price for one sequence (the source measured the
    decomposition there), ``serial/sm`` or a source that predicts no speedup (a fixed schedule, a
    function)."""
    r = decision.predicted_speedup
    if batch <= 1 or decision.schedule == SERIAL or r is None or r <= 0:
        return decision
    s = scenario
    itemsize = s.dtype_bytes
    ns = weight_columns(s.op, s.n, ns)
    shape = {"m": s.m, "n": s.n, "k": s.k, "world_size": s.world_size, "itemsize": itemsize, "ns": ns}
    shape |= {"hardware": s.hardware}
    extra = batch_extra_us(s.op, decision.schedule, batch=batch, **shape)
    serial_extra = batch_extra_us(s.op, SERIAL, batch=batch, **shape)
    own = call_us(s.op, decision.schedule, batch=batch, **shape)
    rates = Rates.of(s.hardware, itemsize)
    t_serial = sum(gemm_us(s.m, n, s.k, itemsize, rates) for n in ns) + roofline_comm_us(s)
    speedup = (t_serial + serial_extra) / max(t_serial / r + extra, own)
    if speedup > PRICED_MARGIN:
        return dataclasses.replace(decision, predicted_speedup=speedup)
    reason = (
        f"{decision.schedule} predicted {r:.2f}x on one sequence, {speedup:.2f}x on {batch}: its GEMMs and "
        f"copies take {own:.0f} us, its batched layout adds {extra:.0f} us (serial's {serial_extra:.0f} us) "
        f"to an op of about {t_serial:.0f} us"
    )
    return _fallback(reason, decision.origin, decision.neighbours)


def _fallback(reason: str, origin: str = "planner", neighbours: int | None = None) -> Decision:
    """A ``serial/sm`` decision, with the reason."""
    return Decision(schedule=SERIAL, reason=reason, origin=origin, neighbours=neighbours)


def deprecated_timeout(what: str, timeout_s: float | None) -> None:
    """Warn that ``what`` (a ``timeout_s`` given) does nothing: the source bounds its own wait."""
    if timeout_s is not None:
        warnings.warn(
            f"{what} is deprecated and does nothing: the source bounds its own wait (a local model or a "
            "table answers at once; ServiceClient(timeout_s=..., retries=...) bounds the service's). It goes "
            "in the next release.",
            DeprecationWarning,
            stacklevel=3,
        )


def _capturing() -> bool:
    """True while the current CUDA stream is being captured into a graph."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


Schedules = Planner | ScheduleSource | Schedule | str | Callable[..., Schedule | str] | None
"""Where schedules come from, in any form :func:`as_planner` takes."""

_planners: dict[tuple, tuple[object, Planner]] = {}
"""(what was given, mode, hardware, group) -> (it, its planner): one planner per source and group."""
_warned_serial: list[str] = []


def as_planner(
    schedules: Schedules = None,
    *,
    mode: Mode = "eager",
    hardware: str | None = None,
    group: dist.ProcessGroup | None = None,
) -> Planner:
    """The planner that ``schedules`` names, in any of its forms (docs/planner.md):

    - a ``Planner``: itself (its own mode, hardware and group);
    - a ``ScheduleSource``: a planner over it in ``mode``, about ``hardware``, agreeing over ``group``;
    - a schedule or token-range table string, or a ``features.Schedule``: a planner over ``FixedSource``;
    - a function ``(op, m, n, k, dtype, world_size) -> schedule``: a planner over ``FunctionSource``;
    - None: this machine's measured model (``sources.local_source``), else ``serial/sm`` with one warning.

    Every form but a planner gets one planner per (value, mode, hardware, group), shared by every layer
    given it: ``as_planner(x) is as_planner(x)``.
    """
    if isinstance(schedules, Planner):
        return schedules
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}; got {mode!r}")
    value = schedules
    if isinstance(value, Schedule):
        value = str(value)
    held = value if isinstance(value, str | None) else ("id", id(value))
    key = (held, mode, hardware, id(group) if group is not None else None)
    hit = _planners.get(key)
    if hit is None:
        hit = _planners[key] = (value, Planner(_source_of(value), mode=mode, hardware=hardware, group=group))
    return hit[1]


def _source_of(schedules: Schedules) -> ScheduleSource:
    """The source behind :func:`as_planner`'s forms (a planner excepted); ValueError naming the forms."""
    from ficco.runtime.sources import FixedSource, FunctionSource, local_source

    if schedules is None:
        source, why = local_source()
        if source is not None:
            log.info("ficco: schedules from %s", why)
            return source
        if why not in _warned_serial:
            _warned_serial.append(why)
            log.warning(
                "ficco: no schedule source given and no measured model for this machine (%s): every ficco op "
                "runs serial/sm; pass schedules= (a Planner, a ScheduleSource, a schedule string or "
                "function)",
                why,
            )
        return FixedSource(SERIAL)
    if hasattr(schedules, "recommend"):
        return schedules
    if isinstance(schedules, str):
        return FixedSource(schedules)  # a bad string is the caller's mistake: raised now
    if callable(schedules):
        return FunctionSource(schedules)
    raise ValueError(
        "schedules must be a runtime.Planner, a ScheduleSource (PredictorSource, ServiceSource, TableSource, "
        "FixedSource, FunctionSource), a schedule or token-range table string or features.Schedule, a "
        f"function (op, m, n, k, dtype, world_size) -> schedule, or None; got {type(schedules).__name__}"
    )
