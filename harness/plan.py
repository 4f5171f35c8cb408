"""The sweep plan: which scenarios to measure, from real model configs plus a log-uniform grid
(``plan_scenarios``), and how long the GPU sweep of a plan takes, from the simulator (``estimate_sweep``).
See docs/protocol.md, "The plan".
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from ficco.features import (
    DEFAULT_HARDWARE_ID,
    DENSE_OPS,
    MOE_OPS,
    OPS,
    HardwareProfile,
    Scenario,
    candidates,
    get_hardware,
)
from ficco.features._validate import check_int
from ficco.features.dataset import GRID_FAMILY
from ficco.features.model_config import ModelConfig, layer_pairs
from ficco.harness.backend import Timing
from ficco.harness.sim import SimBackend

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_TOKENS: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
"""Token counts per layer call (sequence x micro-batch)."""
DEFAULT_GRID = 260
"""Grid scenarios added to the real ones."""
DEFAULT_MAX_SERIAL_MS = 20.0
"""Scenarios whose simulated ``serial/sm`` time exceeds this, ms, are left out of the plan (and listed)."""
GRID_M = (128, 65536)
"""Range of the grid's ``m`` (tokens), log-uniform."""
GRID_NK = (512, 57344)
"""Range of the grid's ``n`` and ``k``, log-uniform."""

UNTIMED_CALLS = 2
"""Calls per timed item outside its timed blocks, on average (checks, warm-ups, capture checks)."""
BLOCK_OVERHEAD_MS = {"eager": 0.15, "graph": 0.02}
"""Wall time per timed block beyond its calls, ms, by mode (rank alignment, events)."""
ITEM_OVERHEAD_MS = 3.0
"""Wall time per timed item beyond its calls, ms (check, agreement, graph capture)."""
SCENARIO_OVERHEAD_MS = 60.0
"""Wall time per scenario beyond its items, ms (rotating inputs, serial references, buffers)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan(Sequence):
    """An ordered list of ``(family, Scenario)`` pairs (indexable and iterable like one) with provenance."""

    entries: tuple[tuple[str, Scenario], ...] = ()
    """The scenarios to measure, each with the family that first produced it."""
    shared: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Scenario id -> every family that produces it (the first is the one in ``entries``); only ids
    produced by more than one family."""
    dropped: tuple[str, ...] = ()
    """``family:scenario_id`` of real-model scenarios left out by ``max_serial_ms``."""
    settings: dict[str, Any] = field(default_factory=dict)
    """The arguments the plan was built from (JSON-serialisable)."""

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int | slice):
        return self.entries[index]

    def __iter__(self) -> Iterator[tuple[str, Scenario]]:
        return iter(self.entries)

    @property
    def families(self) -> list[str]:
        """Families with at least one scenario in the plan, in plan order."""
        return list(dict.fromkeys(family for family, _ in self.entries))

    def to_json(self) -> str:
        data = {
            "settings": self.settings,
            "entries": [[family, s.to_dict()] for family, s in self.entries],
            "shared": {k: list(v) for k, v in self.shared.items()},
            "dropped": list(self.dropped),
        }
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        data = json.loads(text)
        return cls(
            entries=tuple((family, Scenario.from_dict(s)) for family, s in data["entries"]),
            shared={k: tuple(v) for k, v in data["shared"].items()},
            dropped=tuple(data["dropped"]),
            settings=data["settings"],
        )


def splittable_configs(
    configs: list[ModelConfig], tp: int, tokens: list[int], hardware: HardwareProfile
) -> tuple[list[ModelConfig], dict[str, str]]:
    """The model configs whose layers split ``tp`` ways at every token count, and why each other one
    does not (name -> error)."""
    kept, skipped = [], {}
    for config in configs:
        try:
            for t in tokens:
                layer_pairs(config, tp=tp, tokens=t, hardware=hardware)
            kept.append(config)
        except ValueError as err:
            skipped[config.name] = str(err)
    return kept, skipped


def plan_scenarios(
    configs: Sequence[ModelConfig],
    *,
    tp: int = 2,
    tokens: Sequence[int] = DEFAULT_TOKENS,
    grid_size: int = DEFAULT_GRID,
    hardware: HardwareProfile | None = None,
    dtype: str = "bf16",
    include_moe: bool = False,
    max_serial_ms: float = DEFAULT_MAX_SERIAL_MS,
    seed: int = 0,
    ops: Sequence[str] = OPS,
) -> Plan:
    """Build the plan (docs/protocol.md, "The plan"): scenarios of ``ops`` only, the MoE ops' only with
    ``include_moe``; the grid holds dense ops. Configs whose layers do not split ``tp`` ways are listed with
    the reason in ``settings["skipped_configs"]``. Raises ``ValueError`` naming a bad argument."""
    hardware = hardware or get_hardware(DEFAULT_HARDWARE_ID)
    _check_args(tp, tokens, grid_size, max_serial_ms, hardware, ops)
    configs, skipped = splittable_configs(list(configs), tp, list(tokens), hardware)
    serial_ms = SimBackend(hardware).serial_ms
    families: dict[str, list[str]] = {}
    firsts: list[tuple[str, Scenario]] = []
    for config in configs:
        for t in tokens:
            for pair in layer_pairs(config, tp=tp, tokens=t, dtype=dtype, hardware=hardware):
                s = pair.scenario
                if s.op not in ops or (s.op in MOE_OPS and not include_moe):
                    continue
                seen = families.setdefault(s.key(), [])
                if config.name in seen:
                    continue
                seen.append(config.name)
                if len(seen) == 1:
                    firsts.append((config.name, s))
    entries: list[tuple[str, Scenario]] = []
    dropped: list[str] = []
    times = serial_ms([s for _, s in firsts]) if firsts else []
    for (name, s), ms in zip(firsts, times, strict=True):
        if ms > max_serial_ms:
            log.info("scenario %s of %s left out: serial over %g ms", s.key(), name, max_serial_ms)
            dropped.append(f"{name}:{s.key()}")
        else:
            entries.append((name, s))
    kept = {s.key() for _, s in entries}
    grid_ops = [op for op in DENSE_OPS if op in ops]
    if grid_ops:
        grid = _grid(grid_size, grid_ops, tp, dtype, hardware, seed, kept, serial_ms, max_serial_ms)
        entries += [(GRID_FAMILY, s) for s in grid]
    settings = {
        "tp": tp,
        "tokens": list(tokens),
        "grid_size": grid_size,
        "hardware_id": hardware.id,
        "dtype": dtype,
        "include_moe": include_moe,
        "ops": [op for op in OPS if op in ops],
        "max_serial_ms": max_serial_ms,
        "seed": seed,
        "configs": [c.name for c in configs],
        "skipped_configs": skipped,
    }
    shared = {sid: tuple(f) for sid, f in families.items() if len(f) > 1 and sid in kept}
    return Plan(entries=tuple(entries), shared=shared, dropped=tuple(dropped), settings=settings)


def _check_args(
    tp: int,
    tokens: Sequence[int],
    grid_size: int,
    max_serial_ms: float,
    hw: HardwareProfile,
    ops: Sequence[str],
) -> None:
    check_int("plan_scenarios", "tp", tp, 2, min(8, hw.gpu_count))  # at most the GPUs of hw
    bad = [t for t in tokens if not (isinstance(t, int) and t >= tp and t % tp == 0)]
    if not tokens or bad:
        raise ValueError(
            f"tokens must be a non-empty list of positive multiples of tp={tp}; bad: {bad or tokens}"
        )
    check_int("plan_scenarios", "grid_size", grid_size, 0, 100_000)
    if not max_serial_ms > 0:
        raise ValueError(f"max_serial_ms must be > 0; got {max_serial_ms!r}")
    unknown = [op for op in ops if op not in OPS]
    if not ops or unknown:
        raise ValueError(f"ops must be a non-empty list of {list(OPS)}; bad: {unknown or list(ops)}")


def _round_log(rng: np.random.Generator, lo: int, hi: int, multiple: int) -> int:
    """A log-uniform draw in ``[lo, hi]`` rounded to a multiple of ``multiple`` (at least ``multiple``)."""
    value = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    return max(multiple, round(value / multiple) * multiple)


def _grid(
    count: int,
    ops: Sequence[str],
    tp: int,
    dtype: str,
    hardware: HardwareProfile,
    seed: int,
    taken: set[str],
    serial_ms: Callable[[Sequence[Scenario]], np.ndarray],
    max_serial_ms: float,
) -> list[Scenario]:
    """``count`` distinct seeded grid scenarios of the dense ``ops`` under the time cap: ``m`` a multiple of
    64 * tp (every finer split then divides), ``n`` and ``k`` multiples of 128. Drawn in batches (their
    serial times simulated together), taken in the order drawn."""
    rng = np.random.default_rng(seed)
    out: list[Scenario] = []
    taken = set(taken)
    draws = 0
    while len(out) < count and draws < 100 * count:
        batch = [
            Scenario(
                op=str(rng.choice(list(ops))),
                m=_round_log(rng, *GRID_M, 64 * tp),
                n=_round_log(rng, *GRID_NK, 128),
                k=_round_log(rng, *GRID_NK, 128),
                dtype=dtype,
                world_size=tp,
                hardware=hardware,
            )
            for _ in range(min(2 * (count - len(out)) + 8, 100 * count - draws))
        ]
        draws += len(batch)
        for s, ms in zip(batch, serial_ms(batch), strict=True):
            if len(out) < count and s.key() not in taken and ms <= max_serial_ms:
                taken.add(s.key())
                out.append(s)
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepEstimate:
    """How long a GPU sweep of a plan should take, from the simulator."""

    scenarios: int
    remeasured: int
    """Scenarios measured a second time for the noise table."""
    rows: int
    """Dataset rows written (one per candidate schedule and mode)."""
    timed_s: float
    """Seconds of GPU work: checks, warm-ups, captures and timed blocks (schedules and baselines)."""
    overhead_s: float
    """Seconds of alignment, checking and capture overhead."""

    @property
    def seconds(self) -> float:
        return self.timed_s + self.overhead_s

    def summary(self) -> str:
        again = f" (+{self.remeasured} re-measured)" if self.remeasured else ""
        return (
            f"{self.scenarios} scenarios{again}, {self.rows} rows: about {self.seconds / 60:.1f} min "
            f"({self.timed_s:.0f} s timed + {self.overhead_s:.0f} s overhead, simulated)"
        )


def evenly_spaced(items: Sequence[T], count: int) -> list[T]:
    """``count`` of ``items`` spread evenly over them, in order (all of them if fewer)."""
    if count >= len(items):
        return list(items)
    step = len(items) / count
    return [items[math.floor(i * step)] for i in range(count)]


def estimate_sweep(
    plan: Sequence[tuple[str, Scenario]],
    hardware: HardwareProfile,
    *,
    modes: Sequence[str] = ("eager", "graph"),
    timing: Timing | None = None,
    remeasure: int = 0,
) -> SweepEstimate:
    """The protocol of ``harness.torch_backend`` priced with the simulator (``_scenario_cost``); each of the
    ``remeasure`` scenarios adds the plan's mean cost."""
    costs = _costs(plan, hardware, modes, timing)
    timed = sum(c[0] for c in costs)
    overhead = sum(c[1] for c in costs)
    rows = sum(c[2] for c in costs)
    n = len(plan)
    again = min(remeasure, n)
    scale = 1.0 + again / n if n else 1.0
    return SweepEstimate(
        scenarios=n, remeasured=again, rows=rows, timed_s=timed * scale, overhead_s=overhead * scale
    )


def scenario_seconds(
    plan: Sequence[tuple[str, Scenario]],
    hardware: HardwareProfile,
    *,
    modes: Sequence[str] = ("eager", "graph"),
    timing: Timing | None = None,
) -> list[float]:
    """The simulated GPU seconds of each scenario of ``plan`` under the protocol (``estimate_sweep``'s
    terms, one scenario at a time): what ``harness.fleet.shards`` balances the shards of a sweep by."""
    return [timed + overhead for timed, overhead, _ in _costs(plan, hardware, modes, timing)]


def _costs(
    plan: Sequence[tuple[str, Scenario]],
    hardware: HardwareProfile,
    modes: Sequence[str],
    timing: Timing | None,
) -> list[tuple[float, float, int]]:
    """``_scenario_cost`` of each scenario of ``plan``, priced by one simulator of ``hardware``."""
    sim = SimBackend(hardware, modes=tuple(modes))
    timing = Timing() if timing is None else timing
    return [_scenario_cost(sim, scenario, modes, timing) for _, scenario in plan]


def _scenario_cost(
    sim: SimBackend, scenario: Scenario, modes: Sequence[str], timing: Timing
) -> tuple[float, float, int]:
    """``(timed seconds, overhead seconds, rows)`` of one scenario under the protocol: per mode, blocks of
    ``clamp(timing.block_ms / serial time, 1, MAX_CALLS)`` calls (plus one leading call when several, in eager
    mode), ``Timing.rounds_for`` rounds (baselines: ``timing.rounds``), ``UNTIMED_CALLS`` untimed calls per
    item, and the overheads."""
    from ficco.harness.torch_backend import MAX_CALLS

    schedules = candidates(scenario)
    result = sim.measure(scenario, schedules)
    timed = overhead = 0.0
    for mode in modes:
        serial = next(
            m.median_ms for m in result.measurements if m.mode == mode and m.schedule == "serial/sm"
        )
        calls = min(MAX_CALLS, max(1, math.ceil(timing.block_ms / serial)))
        per_block = calls + (calls > 1 and mode == "eager")
        per_call = [m.median_ms for m in result.measurements if m.mode == mode and m.ok]
        base = [v for v in result.baselines[mode].values() if math.isfinite(v)]
        rounds = timing.rounds_for(calls * (sum(per_call) + sum(base)), mode)
        timed += (rounds * sum(per_call) + timing.rounds * sum(base)) * per_block / 1e3
        timed += UNTIMED_CALLS * (sum(per_call) + sum(base)) / 1e3
        blocks = rounds * len(per_call) + timing.rounds * len(base)
        items = len(per_call) + len(base)
        overhead += (blocks * BLOCK_OVERHEAD_MS[mode] + items * ITEM_OVERHEAD_MS) / 1e3
    overhead += SCENARIO_OVERHEAD_MS / 1e3
    return timed, overhead, len(schedules) * len(modes)
