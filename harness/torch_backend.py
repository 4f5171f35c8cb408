"""TorchBackend: times the executor's schedules inside an initialised torch.distributed process group.

One process per rank (torchrun); ``measure`` is collective: every rank calls it with the same scenario and
schedules, and ranks stay in lockstep even when a schedule fails (they agree on each outcome by an
all-reduce). For each scenario:

1. seeded random inputs (fresh per scenario, different per rank) and the ``serial/sm`` reference output;
2. per schedule: poison the executor's buffers and the output with NaN, run once, compare with the
   reference (relative Frobenius error <= 1e-2 for bf16/fp16, 1e-4 for fp32; NaN fails), then
   ``warmup - 1`` more untimed runs and ``reps`` timed runs;
3. baselines: the GEMM alone, the NCCL (gloo) collective alone, the copy-engine transfer alone and
   PyTorch async-TP (``torch.ops.symm_mem.fused_*``; NaN on the CPU or when unavailable).

Timing: CUDA events around each repetition, one synchronisation after the last; on the CPU,
``time.perf_counter`` between a barrier and the end of the call. Each repetition's time is the maximum over
ranks (one all-reduce per schedule); median, p10 and p90 are taken over repetitions.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from ficco.features import SERIAL, Scenario, Schedule
from ficco.harness.backend import BASELINE_KEYS, Measurement, ScenarioResult

if TYPE_CHECKING:
    import torch

TOLERANCE: dict[str, float] = {"bf16": 1e-2, "fp16": 1e-2, "fp32": 1e-4}
"""Largest relative error (||C - C_serial|| / ||C_serial||) a schedule may show, per dtype."""
EXECUTOR_OPS: tuple[str, ...] = ("ag_gemm", "gemm_rs")
"""Ops the executor runs; the MoE ops are measured by the simulator only."""
_ERROR_CHARS = 300
"""Longest error message kept in a Measurement (one line)."""


class TorchBackend:
    """The ``gpu`` (CUDA: NCCL and copy engines) or ``gloo`` (CPU) measurement backend.

    Parameters
    ----------
    device : {"cuda", "cpu"}, default="cuda"
        CUDA tensors on the current device (NCCL group) or CPU tensors (gloo group).
    warmup : int, default=3
        Untimed runs per schedule, the correctness check included (>= 1).
    reps : int, default=20
        Timed runs per schedule (>= 1; published numbers use >= 20).
    timeout_s : float, default=120.0
        Device barriers of the copy-engine executor trap after this long instead of hanging (0: never).
    seed : int, default=0
        Added to each scenario's seed, to draw other inputs.
    """

    def __init__(
        self,
        device: Literal["cuda", "cpu"] = "cuda",
        warmup: int = 3,
        reps: int = 20,
        timeout_s: float = 120.0,
        seed: int = 0,
    ) -> None:
        import torch
        import torch.distributed as dist

        from ficco import executor

        if device not in ("cuda", "cpu"):
            raise ValueError(f"TorchBackend.device must be one of ['cuda', 'cpu']; got {device!r}")
        for field, value in (("warmup", warmup), ("reps", reps)):
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"TorchBackend.{field} must be an int >= 1; got {value!r}")
        if not dist.is_initialized():
            raise ValueError("TorchBackend needs an initialised torch.distributed process group; none is")
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("TorchBackend(device='cuda') needs a CUDA GPU; torch sees none")
        executor.set_barrier_timeout(timeout_s)
        self.name = "gpu" if device == "cuda" else "gloo"
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
        )
        self.warmup = warmup
        self.reps = reps
        self.seed = seed

    # Backend protocol ---------------------------------------------------------------------------------

    def measure(self, scenario: Scenario, schedules: list[Schedule]) -> ScenarioResult:
        """Check and time every schedule on ``scenario`` (collective; see the module docstring)."""
        from ficco import executor

        if scenario.world_size != self.world_size:
            raise ValueError(
                f"Scenario.world_size must equal the process group size {self.world_size}; "
                f"got {scenario.world_size} ({scenario.key()})"
            )
        if scenario.op not in EXECUTOR_OPS:
            error = f"op {scenario.op!r} is not run by the executor (it runs {list(EXECUTOR_OPS)})"
            return ScenarioResult(
                measurements=[_failed(s, error) for s in schedules],
                baselines=dict.fromkeys(BASELINE_KEYS, math.nan),
            )
        try:
            case = _Case(scenario, self.device, self._seed(scenario))
            measurements = [self._measure_schedule(case, schedule) for schedule in schedules]
            baselines = self._baselines(case)
        finally:
            executor.clear_buffers()
        return ScenarioResult(measurements=measurements, baselines=baselines)

    def fingerprint(self) -> dict:
        """GPU, driver, CUDA, torch, NCCL and interconnect (``gpu``), or CPU model and torch (``gloo``)."""
        from ficco.harness.fingerprint import cpu_fingerprint, gpu_fingerprint

        return gpu_fingerprint(self.world_size) if self.name == "gpu" else cpu_fingerprint(self.world_size)

    # One schedule -------------------------------------------------------------------------------------

    def _measure_schedule(self, case: _Case, schedule: Schedule) -> Measurement:
        """Check ``schedule`` against the reference, then time it; a failure anywhere fails it everywhere."""
        from ficco import executor

        error = ""
        try:
            schedule.check(case.scenario)
            executor.poison_buffers()
            case.out.fill_(math.nan)
            case.run(schedule)
            err = _relative_error(case.out, case.reference)
            tol = TOLERANCE[case.scenario.dtype]
            if not err <= tol:
                error = f"wrong result: relative error {err:.3g} against serial/sm exceeds {tol:g}"
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        error = self._agree(error)
        if not error:
            times, error = self.time_agreed(lambda: case.run(schedule))
        if error:
            return _failed(schedule, error)
        p10, median, p90 = _percentiles(times)
        return Measurement(schedule=str(schedule), median_ms=median, p10_ms=p10, p90_ms=p90, ok=True)

    def _baselines(self, case: _Case) -> dict[str, float]:
        """Median ms of the GEMM alone, each collective alone and async-TP (NaN where not measurable)."""
        from ficco import executor

        op = case.scenario.op
        comm_input = case.a if op == "ag_gemm" else case.partial
        runs: dict[str, Callable[[], object] | None] = {
            "gemm_alone_ms": case.gemm_alone,
            "nccl_comm_ms": lambda: executor.communicate(op, comm_input, "sm"),
            "dma_comm_ms": lambda: executor.communicate(op, comm_input, "dma"),
            "async_tp_ms": case.async_tp if self.name == "gpu" else None,
        }
        out = {}
        for key in BASELINE_KEYS:
            run = runs[key]
            times, error = self.time_agreed(run, untimed=self.warmup) if run is not None else ([], "n/a")
            out[key] = _percentiles(times)[1] if not error else math.nan
        return out

    # Timing and agreement -----------------------------------------------------------------------------

    def time_agreed(self, run: Callable[[], object], untimed: int | None = None) -> tuple[list[float], str]:
        """Time ``run`` on every rank (collective): ``reps`` per-repetition times in ms, each the maximum
        over ranks, after ``untimed`` runs (default ``warmup - 1``: a schedule's correctness check is its
        first). An error on any rank gives ``([], "rank R: <error>")`` on every rank."""
        error, times = "", []
        try:
            for _ in range(self.warmup - 1 if untimed is None else untimed):
                run()
            times = self._time_cuda(run) if self.name == "gpu" else self._time_cpu(run)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        error = self._agree(error)
        if error:
            return [], error
        return self._max_over_ranks(times), ""

    def _time_cuda(self, run: Callable[[], object]) -> list[float]:
        import torch

        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        for start, end in zip(starts, ends, strict=True):
            start.record()
            run()
            end.record()
        ends[-1].synchronize()
        return [start.elapsed_time(end) for start, end in zip(starts, ends, strict=True)]

    def _time_cpu(self, run: Callable[[], object]) -> list[float]:
        import torch.distributed as dist

        times = []
        for _ in range(self.reps):
            dist.barrier()
            start = time.perf_counter()
            run()
            times.append(1e3 * (time.perf_counter() - start))
        return times

    def _max_over_ranks(self, times: list[float]) -> list[float]:
        import torch
        import torch.distributed as dist

        t = torch.tensor(times, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def _agree(self, error: str) -> str:
        """On every rank: ``""`` if no rank failed, else ``"rank R: <error>"`` of the first failing rank."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([0.0 if error else 1.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if flag.item() == 1.0:
            return ""
        errors: list[str | None] = [None] * self.world_size
        dist.all_gather_object(errors, error)
        rank, message = next((r, e) for r, e in enumerate(errors) if e)
        return f"rank {rank}: {' '.join(message.split())}"[:_ERROR_CHARS]

    def _seed(self, scenario: Scenario) -> int:
        return (zlib.crc32(scenario.key().encode()) + 1_000_003 * self.rank + self.seed) % (1 << 62)


class _Case:
    """One scenario's tensors on this rank: inputs, output, reference and the GEMM/async-TP closures."""

    def __init__(self, scenario: Scenario, device: torch.device, seed: int) -> None:
        import torch
        from ficco.executor.checks import DTYPES

        from ficco import executor

        dtype = {name: d for d, name in DTYPES.items()}[scenario.dtype]
        s, w = scenario, scenario.world_size
        gen = torch.Generator(device=device).manual_seed(seed)
        rows = s.m // w if s.op == "ag_gemm" else s.m
        self.scenario = s
        self.a = torch.randn((rows, s.k), generator=gen, device=device, dtype=dtype)
        self.b = torch.randn((s.k, s.n), generator=gen, device=device, dtype=dtype).mul_(s.k**-0.5)
        self.out = torch.empty((s.m if s.op == "ag_gemm" else s.m // w, s.n), device=device, dtype=dtype)
        if s.op == "ag_gemm":
            self._op = executor.all_gather_matmul
            self.reference, self.gemm_input = executor.all_gather_matmul(
                self.a, self.b, SERIAL, return_gathered=True
            )
            self.partial = None
        else:
            self._op = executor.matmul_reduce_scatter
            self.reference = executor.matmul_reduce_scatter(self.a, self.b, SERIAL)
            self.gemm_input = self.a
            self.partial = torch.mm(self.a, self.b)
        self._gemm_out = torch.empty((s.m, s.n), device=device, dtype=dtype)

    def run(self, schedule: Schedule) -> None:
        self._op(self.a, self.b, schedule, out=self.out)

    def gemm_alone(self) -> None:
        """The rank's whole GEMM, ``[m, k] @ [k, n]``, with no communication."""
        import torch

        torch.mm(self.gemm_input, self.b, out=self._gemm_out)

    def async_tp(self) -> None:
        """PyTorch's own overlapped op (``torch.ops.symm_mem``), on the default group."""
        import torch
        import torch.distributed as dist
        import torch.distributed._symmetric_memory  # registers torch.ops.symm_mem

        group_name = dist.group.WORLD.group_name
        if self.scenario.op == "ag_gemm":
            torch.ops.symm_mem.fused_all_gather_matmul(self.a, [self.b], 0, group_name)
        else:
            torch.ops.symm_mem.fused_matmul_reduce_scatter(self.a, self.b, "sum", 0, group_name)


def _relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    """``||out - reference|| / ||reference||`` in float64, chunked over rows (bounded extra memory); NaN
    anywhere in ``out`` gives NaN."""
    import torch

    num = torch.zeros((), dtype=torch.float64, device=out.device)
    den = torch.zeros((), dtype=torch.float64, device=out.device)
    step = max(1, (1 << 24) // max(1, out.shape[1]))
    for i in range(0, out.shape[0], step):
        ref = reference[i : i + step].double()
        num += (out[i : i + step].double() - ref).square().sum()
        den += ref.square().sum()
    return (num.sqrt() / den.sqrt()).item()


def _percentiles(times: list[float]) -> tuple[float, float, float]:
    """(p10, median, p90) of ``times``."""
    import numpy as np

    p10, p50, p90 = np.percentile(np.asarray(times, dtype=np.float64), [10, 50, 90])
    return float(p10), float(p50), float(p90)


def _failed(schedule: Schedule, error: str) -> Measurement:
    return Measurement(
        schedule=str(schedule),
        median_ms=math.nan,
        p10_ms=math.nan,
        p90_ms=math.nan,
        ok=False,
        error=error or "failed",
    )
