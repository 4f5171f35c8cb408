"""What a measurement backend returns, and the protocol every backend (GPU, gloo, sim) implements."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ficco.dataclass_options import option
from ficco.features import Scenario, Schedule

ROUNDS = 5
"""Fewest interleaved rounds per scenario and mode in the timing protocol (``harness.torch_backend``)."""
MAX_ROUNDS = 96
"""Most interleaved rounds per scenario and mode (cheap, noisy scenarios get more: ``Timing.rounds_for``)."""
BLOCK_MS = 0.5
"""Target length of one timed block of ``serial/sm`` calls, ms (why short blocks: docs/protocol.md)."""
TIMED_MS = 250.0
"""Timed milliseconds one scenario spends per mode: the rounds run until their total reaches this, within
``[ROUNDS, MAX_ROUNDS]``; eager mode gets ``EAGER_TIMED_FACTOR`` times as much."""
EAGER_TIMED_FACTOR = 3.0
"""Eager mode's timed work over graph mode's (its low-quantile labels need more rounds; docs/protocol.md)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Timing:
    """How long and how often the timing protocol (``harness.torch_backend``) times each item: blocks of
    about ``block_ms``, rounds sized by time within ``[rounds, max_rounds]``. Its fields are options of
    ``ficco bench`` and the worker (``ficco.dataclass_options``)."""

    rounds: int = option(
        ROUNDS,
        "Fewest interleaved rounds per scenario and mode (gpu/gloo); >= 5 for a dataset.",
        min=1,
        max=100,
    )
    max_rounds: int = option(
        MAX_ROUNDS,
        "Most rounds per scenario and mode (gpu/gloo): cheap scenarios get more rounds, up to this, while "
        "their timed work stays under --timed-ms.",
        min=1,
        max=1000,
    )
    block_ms: float = option(
        BLOCK_MS, "Target ms of one timed block of serial calls (gpu/gloo).", min=0.05, max=100.0
    )
    timed_ms: float = option(
        TIMED_MS,
        "Target timed ms per scenario and mode (gpu/gloo): sets the rounds between --rounds and --max-rounds "
        "from the first round's length; eager mode gets 3x this, for its 10th-percentile labels (0: always "
        "--rounds).",
        min=0.0,
        max=1e6,
    )

    def __post_init__(self) -> None:
        for name in ("rounds", "max_rounds"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"Timing.{name} must be an int >= 1; got {value!r}")
        if self.max_rounds < self.rounds:
            raise ValueError(f"Timing.max_rounds must be >= rounds={self.rounds}; got {self.max_rounds!r}")
        if not (isinstance(self.block_ms, int | float) and self.block_ms > 0):
            raise ValueError(f"Timing.block_ms must be a number > 0; got {self.block_ms!r}")
        if not (isinstance(self.timed_ms, int | float) and self.timed_ms >= 0):
            raise ValueError(f"Timing.timed_ms must be a number >= 0; got {self.timed_ms!r}")

    def rounds_for(self, round_ms: float, mode: str) -> int:
        """Rounds for a scenario in ``mode`` whose first round timed ``round_ms`` ms in total (its blocks):
        ``ceil(timed / round_ms)`` within ``[rounds, max_rounds]``, ``timed`` being ``timed_ms`` (graph) or
        ``EAGER_TIMED_FACTOR`` times it (eager)."""
        if not (round_ms > 0 and self.timed_ms > 0):
            return self.rounds
        timed = self.timed_ms * (EAGER_TIMED_FACTOR if mode == "eager" else 1.0)
        return int(min(self.max_rounds, max(self.rounds, math.ceil(timed / round_ms))))

    def to_dict(self) -> dict:
        """The settings as JSON-ready values, with eager mode's share of timed work (the manifest's)."""
        return {
            "rounds": self.rounds,
            "max_rounds": self.max_rounds,
            "block_ms": float(self.block_ms),
            "timed_ms": float(self.timed_ms),
            "eager_timed_factor": EAGER_TIMED_FACTOR,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Measurement:
    """The timing of one schedule on one scenario (rank 0's view; milliseconds)."""

    schedule: str = "serial/sm"
    """Canonical schedule string (``str(Schedule)``)."""
    mode: str = "eager"
    """Execution mode (``features.MODES``)."""
    median_ms: float = float("nan")
    """Per-call time: the median over ``round_ms``; NaN if the schedule failed."""
    p10_ms: float = float("nan")
    """10th percentile over ``round_ms``; NaN if failed."""
    p90_ms: float = float("nan")
    """90th percentile over ``round_ms``; NaN if failed."""
    round_ms: tuple[float, ...] = ()
    """Per-call time of each interleaved round (the maximum over ranks), in round order; empty if failed."""
    ok: bool = True
    """False when the schedule raised, timed out or produced a result different from serial."""
    error: str = ""
    """Why it failed (one line); empty when ``ok``."""
    in_best_set: bool = False
    """Cannot be told apart from the fastest ok schedule of its scenario and mode (``harness.labels``)."""

    @classmethod
    def from_rounds(cls, schedule: str, mode: str, round_ms: Sequence[float]) -> Measurement:
        """The measurement whose per-round times are ``round_ms`` (ms, at least one), with its median, 10th
        and 90th percentiles."""
        p10, median, p90 = np.percentile(np.asarray(round_ms, dtype=float), [10, 50, 90])
        return cls(
            schedule=schedule, mode=mode, median_ms=float(median), p10_ms=float(p10), p90_ms=float(p90),
            round_ms=tuple(float(t) for t in round_ms),
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class ScenarioResult:
    """Everything measured for one scenario: one ``Measurement`` per requested schedule, plus baselines."""

    measurements: list[Measurement] = field(default_factory=list)
    """One per (schedule passed to ``Backend.measure``, mode), schedules in the given order."""
    baselines: dict[str, dict[str, float]] = field(default_factory=dict)
    """Mode -> keys ``BASELINE_KEYS``: GEMM alone, NCCL collective alone, copy-engine transfer alone and
    PyTorch async-TP, per-call ms in that mode (NaN if not measured)."""


class Backend(Protocol):
    """Measures schedules of scenarios. Under torchrun ``measure`` is collective: every rank calls it with
    the same arguments in the same order, and rank 0's result is the one written."""

    name: str
    """``gpu`` (CUDA + NCCL / copy engines), ``gloo`` (CPU torch.distributed) or ``sim``."""
    rank: int
    """This process's rank (0 for sim)."""
    world_size: int
    """Processes in the group (sim: the hardware profile's GPU count)."""

    modes: tuple[str, ...]
    """The modes ``measure`` times every schedule in (a subset of ``features.MODES``, in that order)."""

    def protocol(self) -> dict:
        """The timing protocol's settings, JSON-serialisable: a dataset resumes only under the same ones."""
        ...

    def measure(self, scenario: Scenario, schedules: list[Schedule]) -> ScenarioResult:
        """Time every schedule of ``schedules`` on ``scenario`` in every mode of ``modes``; a failing
        schedule gives ``ok=False``."""
        ...

    def agree(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (collective under torchrun), so every rank decides alike."""
        ...

    def warm_up(self, scenario: Scenario, schedules: list[Schedule]) -> None:
        """Run ``scenario`` once untimed before a process's first measurement (lazy initialisation)."""
        ...

    def fingerprint(self) -> dict:
        """What the measurements depend on (GPU, driver, library versions...), JSON-serialisable."""
        ...
