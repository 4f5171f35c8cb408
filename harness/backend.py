"""What a measurement backend returns, and the protocol every backend (GPU, gloo, sim) implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ficco.features import Scenario, Schedule

BASELINE_KEYS: tuple[str, ...] = ("gemm_alone_ms", "nccl_comm_ms", "dma_comm_ms", "async_tp_ms")
"""Per-scenario reference timings every ``ScenarioResult.baselines`` carries (NaN when not measured)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Measurement:
    """The timing of one schedule on one scenario (rank 0's view; milliseconds)."""

    schedule: str = "serial/sm"
    """Canonical schedule string (``str(Schedule)``)."""
    median_ms: float = float("nan")
    """Median over the timed repetitions; NaN if the schedule failed."""
    p10_ms: float = float("nan")
    """10th percentile over the timed repetitions; NaN if failed."""
    p90_ms: float = float("nan")
    """90th percentile over the timed repetitions; NaN if failed."""
    ok: bool = True
    """False when the schedule raised, timed out or produced a result different from serial."""
    error: str = ""
    """Why it failed (one line); empty when ``ok``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ScenarioResult:
    """Everything measured for one scenario: one ``Measurement`` per requested schedule, plus baselines."""

    measurements: list[Measurement] = field(default_factory=list)
    """One per schedule passed to ``Backend.measure``, in the same order."""
    baselines: dict[str, float] = field(default_factory=dict)
    """Keys ``BASELINE_KEYS``: GEMM alone, NCCL collective alone, copy-engine transfer alone and PyTorch
    async-TP, in ms (NaN if not measured)."""


class Backend(Protocol):
    """Measures schedules of scenarios. Under torchrun ``measure`` is collective: every rank calls it with
    the same arguments in the same order, and rank 0's result is the one written."""

    name: str
    """``gpu`` (CUDA + NCCL / copy engines), ``gloo`` (CPU torch.distributed) or ``sim``."""
    rank: int
    """This process's rank (0 for sim)."""
    world_size: int
    """Processes in the group (sim: the hardware profile's GPU count)."""

    def measure(self, scenario: Scenario, schedules: list[Schedule]) -> ScenarioResult:
        """Time every schedule of ``schedules`` on ``scenario``; a failing schedule gives ``ok=False``."""
        ...

    def fingerprint(self) -> dict:
        """What the measurements depend on (GPU, driver, library versions...), JSON-serialisable."""
        ...
