"""TorchBackend: times the executor's schedules inside an initialised torch.distributed process group.

One process per rank (torchrun); ``measure`` is collective: every rank calls it with the same scenario and
schedules, and the ranks agree on every outcome. Each scenario: seeded rotating inputs and serial references,
a check of every schedule on poisoned buffers, then interleaved timed rounds of the schedules and baselines.
See docs/protocol.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import math
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from ficco.features import MODES, OP_SPECS, SERIAL, Routing, Scenario, Schedule
from ficco.features.dataset import BASELINE_KEYS
from ficco.features.ops import OpShapes
from ficco.harness.backend import Measurement, ScenarioResult, Timing
from ficco.harness.cpu_placement import Placement
from ficco.rounds import interleaved_rounds

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

TOLERANCE: dict[str, float] = {"bf16": 1e-2, "fp16": 1e-2, "fp32": 1e-4}
"""Largest relative error (||C - C_serial|| / ||C_serial||) a schedule may show, per dtype."""
EXECUTOR_OPS: tuple[str, ...] = tuple(OP_SPECS)
"""Ops the executor runs: every op of ``features.OP_SPECS``, the MoE all-to-alls included."""
ROTATE_BYTES = 256 << 20
"""Input sets rotate until a block touches at least this many bytes of operands (beyond L2)."""
MAX_SETS = 8
"""Most rotating input sets per scenario."""
MAX_CALLS = 64
"""Most calls per timed block (small shapes)."""
MAX_GRAPH_CALLS = 2
"""Most calls captured in one graph (a block replays it several times)."""
SPIN_CYCLES = 2_000_000
"""GPU clock cycles the spin kernel holds the device at the start of a queued round (about 1 ms on H200)."""
_ERROR_CHARS = 300
"""Longest error message kept in a Measurement (one line)."""


@dataclass(kw_only=True)
class _Item:
    """One timed thing of a scenario: a schedule or a baseline, in one mode."""

    name: str
    """Schedule string, or a ``BASELINE_KEYS`` key."""
    mode: str
    """``eager`` or ``graph``."""
    block: Callable[[], object] | None = None
    """Runs one timed block (eager calls, or graph replays)."""
    calls: int = 1
    """Calls one block runs (the per-call time is the block's over this)."""
    baseline: bool = False
    """A ``BASELINE_KEYS`` item: timed in the first ``timing.rounds`` rounds only."""
    lead: Callable[[], object] | None = None
    """Runs one untimed call right before the block (eager blocks of several calls; ``_Case.eager_lead``)."""
    error: str = ""
    """Why the item cannot be timed (agreed by every rank); empty when it can."""
    times: list[float] = field(default_factory=list)
    """Per-call time of each round, ms (the maximum over ranks)."""
    graph: object | None = None
    """The captured ``torch.cuda.CUDAGraph`` (kept alive while timed)."""


class TorchBackend:
    """The ``gpu`` (CUDA: NCCL and copy engines) or ``gloo`` (CPU) measurement backend.

    Parameters
    ----------
    device : {"cuda", "cpu"}, default="cuda"
        CUDA tensors on the current device (NCCL group) or CPU tensors (gloo group).
    modes : tuple of {"eager", "graph"}, default=MODES
        Execution modes to time; ``graph`` needs CUDA (on the CPU only ``eager`` is allowed).
    timing : Timing, default=Timing()
        Block length and rounds; blocks hold 1 to ``MAX_CALLS`` calls.
    timeout_s : float, default=120.0
        Device barriers of the copy-engine executor trap after this long instead of hanging (0: never).
    seed : int, default=0
        Added to each scenario's seed, to draw other inputs and other round orders.
    placement : harness.cpu_placement.Placement, optional
        Where this rank's threads run; applied before each scenario's timed rounds (after its checks and
        captures, which may start threads). Default: left to the kernel (policy ``none``).
    """

    def __init__(
        self,
        device: Literal["cuda", "cpu"] = "cuda",
        modes: tuple[str, ...] = MODES,
        timing: Timing | None = None,
        timeout_s: float = 120.0,
        seed: int = 0,
        placement: Placement | None = None,
    ) -> None:
        import torch
        import torch.distributed as dist

        from ficco import executor

        if device not in ("cuda", "cpu"):
            raise ValueError(f"TorchBackend.device must be one of ['cuda', 'cpu']; got {device!r}")
        allowed = MODES if device == "cuda" else ("eager",)
        if not modes or any(m not in allowed for m in modes):
            raise ValueError(
                f"TorchBackend.modes must be a non-empty subset of {list(allowed)}; got {modes!r}"
            )
        timing = Timing() if timing is None else timing
        if not isinstance(timing, Timing):
            raise ValueError(f"TorchBackend.timing must be a Timing; got {type(timing).__name__}")
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
        self.modes = tuple(m for m in MODES if m in modes)
        self.timing = timing
        self.seed = seed
        self.placement = placement or Placement("none", ())
        self.phase_seconds: dict[str, float] = {}
        """Wall seconds spent so far per phase: ``inputs``, ``checks``, ``captures``, ``timing <mode>``."""
        self._token = torch.zeros(1, device=self.device)

    # Backend protocol ---------------------------------------------------------------------------------

    def measure(self, scenario: Scenario, schedules: list[Schedule]) -> ScenarioResult:
        """Check and time every schedule on ``scenario`` in every mode (collective)."""
        from ficco import executor

        if scenario.world_size != self.world_size:
            raise ValueError(
                f"Scenario.world_size must equal the process group size {self.world_size}; "
                f"got {scenario.world_size} ({scenario.key()})"
            )
        if scenario.op not in EXECUTOR_OPS:
            error = f"op {scenario.op!r} is not run by the executor (it runs {list(EXECUTOR_OPS)})"
            return ScenarioResult(
                measurements=[_failed(s, mode, error) for mode in self.modes for s in schedules],
                baselines={mode: dict.fromkeys(BASELINE_KEYS, math.nan) for mode in self.modes},
            )
        items: list[_Item] = []
        gc.collect()
        gc.disable()  # a collection inside a timed block would land on one schedule
        try:
            with self._phase("inputs"):
                case = _Case(scenario, self.device, self._seed(scenario), self.rank)
            with self._phase("checks"):
                checked = {str(s): self._check(case, s) for s in schedules}
            with self._phase("captures"):
                for mode in self.modes:
                    calls = self._calls_per_block(case, mode)
                    for schedule in schedules:
                        items.append(self._schedule_item(case, schedule, mode, calls, checked[str(schedule)]))
                    items += [self._baseline_item(case, key, mode, calls) for key in BASELINE_KEYS]
            self.placement.confine()
            self._time_rounds(items, self._order_seed(scenario))
            log.debug("placement after %s: %s", scenario.key(), self.placement.describe())
            return self._result(items, schedules)
        finally:
            items.clear()  # graphs go before the buffers they replay into
            executor.clear_buffers()
            gc.enable()

    def agree(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (one all-reduce)."""
        return bool(self._max_over_ranks([float(flag)])[0])

    def warm_up(self, scenario: Scenario, schedules: list[Schedule]) -> None:
        """One untimed pass (one round) over ``scenario``, so that lazy initialisation stays out of timing."""
        timing, phases = self.timing, dict(self.phase_seconds)
        self.timing = dataclasses.replace(timing, rounds=1, max_rounds=1)
        try:
            self.measure(scenario, schedules)
        finally:
            self.timing, self.phase_seconds = timing, phases

    def protocol(self) -> dict:
        """Modes, ``Timing`` settings, fixed limits, graph-round alignment, CPU placement (``pin``), the MoE
        expert GEMMs' grouping, the executor's copy arrangement (``copy_streams``) and its label version
        (``features.label_source.LABEL_VERSION``)."""
        from ficco import executor
        from ficco.executor.experts import GROUPED_MIN_GEMMS
        from ficco.features.label_source import LABEL_VERSION

        return {
            "modes": list(self.modes),
            **self.timing.to_dict(),
            "max_calls": MAX_CALLS,
            "max_graph_calls": MAX_GRAPH_CALLS,
            "rotate_bytes": ROTATE_BYTES,
            "graph_rounds": "queued" if self.name == "gpu" else "host-aligned",
            "pin": self.placement.policy,
            "expert_gemms": f"grouped from {GROUPED_MIN_GEMMS}",
            "copy_streams": str(executor.copy_streams()),
            "label_version": LABEL_VERSION,
        }

    def fingerprint(self) -> dict:
        """GPU, driver, CUDA, torch, NCCL and interconnect (``gpu``), or CPU model and torch (``gloo``)."""
        from ficco.features.fingerprint import cpu_fingerprint, gpu_fingerprint

        return gpu_fingerprint(self.world_size) if self.name == "gpu" else cpu_fingerprint(self.world_size)

    # Checks and items ---------------------------------------------------------------------------------

    def _check(self, case: _Case, schedule: Schedule) -> str:
        """Run ``schedule`` once on poisoned buffers and compare with serial; the agreed error or ``""``."""
        from ficco import executor

        def check() -> str:
            schedule.check(case.scenario)
            executor.poison_buffers()
            case.outs[0].fill_(math.nan)
            case.run(schedule, 0)
            return case.compare(0)

        return self._agree(_try(check))

    def _calls_per_block(self, case: _Case, mode: str) -> int:
        """Calls per timed block in ``mode``: ``block_ms`` over the per-call time of ``serial/sm`` in that
        mode (slowest rank; graph: a captured call), in ``[1, MAX_CALLS]``; the same on every rank."""
        import torch

        def run() -> None:
            case.run(SERIAL, 0)

        for _ in range(2):
            run()
        if mode == "graph":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=case.pool):
                run()
            run = graph.replay
        self._align()
        start = time.perf_counter()
        for _ in range(3):
            run()
        self._sync()
        per_call = self._max_over_ranks([1e3 * (time.perf_counter() - start) / 3])[0]
        calls = int(min(MAX_CALLS, max(1, math.ceil(self.timing.block_ms / max(per_call, 1e-6)))))
        log.debug("%s %s: serial/sm %.3f ms per call -> %d calls", case.scenario.key(), mode, per_call, calls)
        return calls

    def _schedule_item(self, case: _Case, schedule: Schedule, mode: str, calls: int, error: str) -> _Item:
        item = _Item(name=str(schedule), mode=mode, error=error)
        if error:
            return item
        if mode == "eager":
            return case.eager_item(item, lambda s: case.run(schedule, s), calls)
        return self._capture(item, case, lambda s: case.run(schedule, s), calls, check=True)

    def _baseline_item(self, case: _Case, key: str, mode: str, calls: int) -> _Item:
        item = _Item(name=key, mode=mode, baseline=True)
        run = case.baseline(key) if self.name == "gpu" or key != "async_tp_ms" else None
        if run is None:
            item.error = "not measurable here"
            return item
        item.error = self._agree(_try(lambda: [run(s) for s in range(min(2, case.sets))]))
        if item.error:
            return item
        if mode == "eager":
            return case.eager_item(item, run, calls)
        return self._capture(item, case, run, calls, check=False)

    def _capture(
        self, item: _Item, case: _Case, run: Callable[[int], object], calls: int, *, check: bool
    ) -> _Item:
        """Capture ``run`` into one CUDA graph of ``graph_calls(calls)`` calls after two eager warm-up calls;
        a block replays it until about ``calls`` calls ran. With ``check``, replay it once on poisoned outputs
        and compare with serial. Sets ``item.block`` and ``item.calls``, or the agreed ``item.error``."""
        import torch

        from ficco import executor

        per_graph, replays = graph_calls(calls)

        def capture() -> str:
            for s in range(2):
                run(s % case.sets)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=case.pool):
                for j in range(per_graph):
                    run(j % case.sets)
            item.graph = graph
            if not check:
                return ""
            executor.poison_buffers()
            for out in case.outs:
                out.fill_(math.nan)
            graph.replay()
            torch.cuda.synchronize()
            return next((e for s in range(min(per_graph, case.sets)) if (e := case.compare(s))), "")

        item.error = self._agree(_try(capture, prefix="graph capture: "))
        if item.error:
            item.graph = None
            return item
        replay = item.graph.replay

        def block() -> None:
            for _ in range(replays):
                replay()

        item.block, item.calls = block, per_graph * replays
        return item

    # Timing -------------------------------------------------------------------------------------------

    def _time_rounds(self, items: list[_Item], seed: int) -> None:
        """Time the runnable items in interleaved rounds (:func:`ficco.rounds.interleaved_rounds`), the modes
        taking turns; after a mode's first round, ``Timing.rounds_for`` its total block time sets how many
        rounds it gets (the same on every rank, from maxima over ranks)."""
        modes = [mode for mode in self.modes if any(item.mode == mode for item in items)]
        wanted = dict.fromkeys(modes, self.timing.rounds)
        done = 0

        def run_round(order: list[int]) -> None:
            nonlocal done
            todo = [mode for mode in modes if done < wanted[mode]]
            for mode in todo if done % 2 == 0 else todo[::-1]:
                batch = [
                    i
                    for i in order
                    if items[i].mode == mode
                    and not items[i].error
                    and (done < self.timing.rounds or not items[i].baseline)
                ]
                with self._phase(f"timing {mode}"):
                    self._time_round(items, batch, queued=mode == "graph" and self.name == "gpu")
                if done == 0:
                    round_ms = sum(items[i].times[-1] * items[i].calls for i in batch if items[i].times)
                    wanted[mode] = self.timing.rounds_for(round_ms, mode)
            done += 1

        interleaved_rounds(
            range(len(items)),
            run_round,
            rounds=self.timing.rounds,
            seed=[seed, self.timing.rounds],
            more_rounds=lambda: max(wanted.values()),
        )
        log.debug("rounds per mode: %s", wanted)

    def _time_round(self, items: list[_Item], order: list[int], *, queued: bool) -> None:
        """One round over ``items[i]`` for ``i`` in ``order``, ``queued`` on the device (graph mode on CUDA)
        or aligned on the host before every block: each item's per-call time, the maximum over ranks, is
        appended to its ``times``; an item that raised on any rank gets the agreed error."""
        errors: dict[int, str] = {}
        run_round = self._queued_round if queued else self._aligned_round
        timed = run_round([(i, items[i]) for i in order], errors)
        local, failed = np.zeros(len(items)), np.zeros(len(items))
        local[list(timed)] = list(timed.values())
        failed[list(errors)] = 1.0
        merged = self._max_over_ranks([*local, *failed])
        for i in order:
            if merged[len(items) + i]:
                items[i].error = self._agree(errors.get(i, ""), force=True)
                items[i].graph = items[i].block = None
            else:
                items[i].times.append(merged[i])

    def _aligned_round(self, batch: list[tuple[int, _Item]], errors: dict[int, str]) -> dict[int, float]:
        """Per-call ms of each item, each block started from ranks aligned on the host (CUDA events on the
        GPU, the host clock on the CPU); failures go to ``errors``."""
        import torch

        times = {}
        for i, item in batch:
            self._align()
            try:
                if item.lead is not None:
                    item.lead()
                if self.name == "gpu":
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    item.block()
                    end.record()
                    end.synchronize()
                    times[i] = start.elapsed_time(end) / item.calls
                else:
                    t0 = time.perf_counter()
                    item.block()
                    times[i] = 1e3 * (time.perf_counter() - t0) / item.calls
            except Exception as exc:
                errors[i] = f"{type(exc).__name__}: {exc}"
        return times

    def _queued_round(self, batch: list[tuple[int, _Item]], errors: dict[int, str]) -> dict[int, float]:
        """Per-call ms of each item, the whole round queued on the device (CUDA): a spin kernel, then per
        item an in-stream all-reduce (every rank issues it, so the collectives stay matched even when an
        item fails), the start event, the block and the end event; one host synchronisation at the end."""
        import torch
        import torch.distributed as dist

        events = {}
        torch.cuda._sleep(SPIN_CYCLES)
        for i, item in batch:
            dist.all_reduce(self._token)  # the ranks leave it together: aligned on the device
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            try:
                start.record()
                item.block()
                end.record()
                events[i] = (start, end, item.calls)
            except Exception as exc:
                errors[i] = f"{type(exc).__name__}: {exc}"
        torch.cuda.synchronize()
        return {i: start.elapsed_time(end) / calls for i, (start, end, calls) in events.items()}

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        """Adds the wall time of the ``with`` body to ``phase_seconds[name]``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.phase_seconds[name] = self.phase_seconds.get(name, 0.0) + time.perf_counter() - start

    def _result(self, items: list[_Item], schedules: list[Schedule]) -> ScenarioResult:
        """Measurements in (mode, schedule) order and the baselines of each mode."""
        by_key = {(item.mode, item.name): item for item in items}
        measurements = []
        for mode in self.modes:
            for schedule in schedules:
                item = by_key[(mode, str(schedule))]
                if item.error or not item.times:
                    measurements.append(_failed(schedule, mode, item.error or "not timed"))
                    continue
                measurements.append(Measurement.from_rounds(str(schedule), mode, item.times))
        baselines = {
            mode: {
                key: float(np.median(item.times)) if not item.error and item.times else math.nan
                for key in BASELINE_KEYS
                for item in [by_key[(mode, key)]]
            }
            for mode in self.modes
        }
        return ScenarioResult(measurements=measurements, baselines=baselines)

    # Rank agreement -----------------------------------------------------------------------------------

    def _align(self) -> None:
        """Every rank leaves at about the same moment, with nothing of its own still queued: a one-element
        all-reduce behind the work issued so far, then the host waits for it (CPU: a gloo barrier)."""
        import torch.distributed as dist

        if self.name == "gpu":
            dist.all_reduce(self._token)
            self._sync()
        else:
            dist.barrier()

    def _sync(self) -> None:
        import torch

        if self.name == "gpu":
            torch.cuda.synchronize()

    def _max_over_ranks(self, values: list[float]) -> list[float]:
        import torch
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def _agree(self, error: str, *, force: bool = False) -> str:
        """On every rank: ``""`` if no rank failed, else ``"rank R: <error>"`` of the first failing rank.
        ``force``: every rank already knows some rank failed (skip the vote)."""
        import torch
        import torch.distributed as dist

        if not force:
            flag = torch.tensor([0.0 if error else 1.0], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            if flag.item() == 1.0:
                return ""
        errors: list[str | None] = [None] * self.world_size
        dist.all_gather_object(errors, error)
        rank, message = next(((r, e) for r, e in enumerate(errors) if e), (0, "failed"))
        return f"rank {rank}: {' '.join(message.split())}"[:_ERROR_CHARS]

    def _order_seed(self, scenario: Scenario) -> int:
        """Seeds the round orders: the same on every rank."""
        return (zlib.crc32(scenario.key().encode()) + self.seed) % (1 << 62)

    def _seed(self, scenario: Scenario) -> int:
        """Seeds this rank's inputs: different on every rank."""
        return (self._order_seed(scenario) + 1_000_003 * self.rank) % (1 << 62)


class _Case:
    """One scenario's tensors on this rank: rotating input sets, outputs, references, and the closures
    that run a schedule or a baseline on one set."""

    def __init__(self, scenario: Scenario, device: torch.device, seed: int, rank: int) -> None:
        import torch

        from ficco import executor
        from ficco.executor.checks import DTYPES

        dtype = {name: d for d, name in DTYPES.items()}[scenario.dtype]
        s, spec = scenario, OP_SPECS[scenario.op]
        self.routing = Routing.for_scenario(s) if spec.moe else None
        """The MoE ops' routing, the same on every rank; None for the dense ops."""
        shapes = spec.shapes(s, rank, self.routing)
        gen = torch.Generator(device=device).manual_seed(seed)
        # The busiest rank's set (MoE ranks hold different rows): every rank must rotate as many sets, as
        # the baselines' checks run one collective per set.
        set_bytes = max(_set_numel(spec.shapes(s, r, self.routing)) for r in range(s.world_size))
        set_bytes *= dtype.itemsize
        self.scenario = s
        self.sets = int(min(MAX_SETS, max(1, math.ceil(ROTATE_BYTES / set_bytes))))
        """Rotating input sets (call ``j`` of a block uses set ``j % sets``)."""
        self.a = [torch.randn(shapes.a, generator=gen, device=device, dtype=dtype) for _ in range(self.sets)]
        self.b = [
            torch.randn(shapes.b, generator=gen, device=device, dtype=dtype).mul_(s.k**-0.5)
            for _ in range(self.sets)
        ]
        self.outs = [torch.empty(shapes.out, device=device, dtype=dtype) for _ in range(self.sets)]
        self._run_op = executor.run_op
        # The GEMM alone and the collective alone: one reads the op's ``a``, the other what the op hands
        # between its collective and its GEMM.
        if s.op == "ag_gemm":  # the gathered A of the reference
            pairs = [executor.all_gather_matmul(a, b, SERIAL, return_gathered=True) for a, b in self._pairs()]
            self.references = [c for c, _ in pairs]
            between = [g for _, g in pairs]
        else:
            self.references = [
                executor.run_op(s.op, a, b, SERIAL, routing=self.routing) for a, b in self._pairs()
            ]
            if spec.moe:  # random rows of that shape: the experts' rows (dispatch), their outputs (combine)
                shape = (shapes.out[0], s.k) if spec.comm_first else shapes.comm
                between = [
                    torch.randn(shape, generator=gen, device=device, dtype=dtype) for _ in range(self.sets)
                ]
            else:  # gemm_rs: the partial products
                between = [torch.mm(a, b) for a, b in self._pairs()]
        self.comm_inputs, self.gemm_inputs = (self.a, between) if spec.comm_first else (between, self.a)
        gemm_rows = self.gemm_inputs[0].shape[0]  # m for the dense ops, the experts' rows for MoE
        self._gemm_out = torch.empty((gemm_rows, s.n), device=device, dtype=dtype)
        self._expert_rows = self.routing.expert_rows(rank) if self.routing is not None else ()
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        """One memory pool shared by every graph of the scenario."""
        self._next = 0

    def _pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return list(zip(self.a, self.b, strict=True))

    def run(self, schedule: Schedule, s: int) -> None:
        """The op under ``schedule`` on input set ``s``, into ``outs[s]``."""
        self._run_op(self.scenario.op, self.a[s], self.b[s], schedule, routing=self.routing, out=self.outs[s])

    def compare(self, s: int) -> str:
        """``""`` when ``outs[s]`` matches the serial reference within tolerance, else why not."""
        err = _relative_error(self.outs[s], self.references[s])
        tol = TOLERANCE[self.scenario.dtype]
        return (
            "" if err <= tol else f"wrong result: relative error {err:.3g} against serial/sm exceeds {tol:g}"
        )

    def eager_item(self, item: _Item, run: Callable[[int], object], calls: int) -> _Item:
        """``item`` timed as blocks of ``calls`` eager calls of ``run``, the input set rotating across blocks
        too; a block of several calls is led by one untimed call (docs/protocol.md, "Blocks")."""

        def one() -> None:
            run(self._next)
            self._next = (self._next + 1) % self.sets

        def block() -> None:
            for _ in range(calls):
                one()

        item.block, item.calls, item.lead = block, calls, (one if calls > 1 else None)
        return item

    def baseline(self, key: str) -> Callable[[int], object] | None:
        """The run-one-set closure of a ``BASELINE_KEYS`` baseline; None where PyTorch has no such op
        (async-TP of an all-to-all)."""
        import torch

        from ficco import executor

        op, routing = self.scenario.op, self.routing

        def gemm(s: int) -> None:
            torch.mm(self.gemm_inputs[s], self.b[s], out=self._gemm_out)

        def expert_gemms(s: int) -> None:
            executor.grouped_matmul(self.gemm_inputs[s], self.b[s], self._expert_rows, out=self._gemm_out)

        runs: dict[str, Callable[[int], object] | None] = {
            "gemm_alone_ms": gemm if routing is None else expert_gemms,
            "nccl_comm_ms": lambda s: executor.communicate(op, self.comm_inputs[s], "sm", routing=routing),
            "dma_comm_ms": lambda s: executor.communicate(op, self.comm_inputs[s], "dma", routing=routing),
            "async_tp_ms": self._async_tp if OP_SPECS[op].collective != "all_to_all" else None,
        }
        return runs[key]

    def _async_tp(self, s: int) -> None:
        """PyTorch's own overlapped op (``torch.ops.symm_mem``), on the default group."""
        import torch
        import torch.distributed as dist
        import torch.distributed._symmetric_memory  # registers torch.ops.symm_mem

        group_name = dist.group.WORLD.group_name
        if self.scenario.op == "ag_gemm":
            torch.ops.symm_mem.fused_all_gather_matmul(self.a[s], [self.b[s]], 0, group_name)
        else:
            torch.ops.symm_mem.fused_matmul_reduce_scatter(self.a[s], self.b[s], "sum", 0, group_name)


def _set_numel(shapes: OpShapes) -> int:
    """Elements of one input set on a rank: ``a``, ``b`` and the output."""
    return sum(math.prod(shape) for shape in (shapes.a, shapes.b, shapes.out))


def graph_calls(calls: int) -> tuple[int, int]:
    """``(calls per graph, replays per block)`` for a block of about ``calls`` calls: one replay of one
    call, or replays of an even number of calls (at most ``MAX_GRAPH_CALLS``): the copy-engine executor's
    double-buffered halves alternate."""
    if calls <= 1:
        return 1, 1
    per_graph = min(MAX_GRAPH_CALLS, calls + calls % 2)
    return per_graph, math.ceil(calls / per_graph)


def _try(fn: Callable[[], object], prefix: str = "") -> str:
    """``fn()``'s returned error (a str), ``""`` for any other return, or the exception it raised."""
    try:
        out = fn()
    except Exception as exc:
        return f"{prefix}{type(exc).__name__}: {exc}"
    return f"{prefix}{out}" if isinstance(out, str) and out else ""


def _relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    """``||out - reference|| / ||reference||`` in float64, chunked over rows (bounded extra memory); NaN
    anywhere in ``out`` gives NaN. An empty ``out`` (a MoE rank no rows are routed to) matches: 0.0."""
    import torch

    if out.numel() == 0:
        return 0.0

    num = torch.zeros((), dtype=torch.float64, device=out.device)
    den = torch.zeros((), dtype=torch.float64, device=out.device)
    step = max(1, (1 << 24) // max(1, out.shape[1]))
    for i in range(0, out.shape[0], step):
        ref = reference[i : i + step].double()
        num += (out[i : i + step].double() - ref).square().sum()
        den += ref.square().sum()
    return (num.sqrt() / den.sqrt()).item()


def _failed(schedule: Schedule | str, mode: str, error: str) -> Measurement:
    return Measurement(schedule=str(schedule), mode=mode, ok=False, error=error or "failed")
