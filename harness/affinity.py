"""Where a rank's threads run on the host: CPU placement for timing.

Eager-mode times of small shapes are the host's time to issue the executor's work, so they follow the
speed of the core the rank's Python thread runs on. On the GPU machines that speed flips: a single CPU
runs a fixed piece of pure Python in about twice its usual time for a millisecond to several seconds, each
CPU on its own schedule (on one H200 machine, 16 CPUs sampled together: no correlation between CPUs' slow
spells, one CPU slow 86% of 10 s and one all of it; `benchmarks/results/host-states-*.json`), and the
executor's calls slow down with it (fresh processes up to 1.8x apart within two minutes,
`benchmarks/results/host-placement-loopback-h200.json`). A hardware thread whose sibling on the physical
host is busy behaves so; the guest cannot see its siblings (one thread per core is all it is shown).

Policies (``PIN_POLICIES``):

- ``none``: leave placement to the kernel;
- ``share``: each local rank gets an equal, disjoint share of the allowed CPUs for all its threads;
- ``core``: as ``share``, and the main thread gets one physical core of the share to itself (preferring
  CPUs local to the rank's GPU): every other thread of the process, including threads started later,
  is moved to the rest of the share whenever :meth:`Placement.apply` runs (the harness calls it before
  each scenario), and the core's SMT siblings stay idle;
- ``seek``: as ``core``, and before each timed block :meth:`Placement.settle` checks the interpreter's
  speed on the main thread's core (:class:`Seeker`) and, while it is slow, moves the main thread (and the
  other threads off its new core) to the next core of the share, so that eager blocks are timed at the
  host's usual speed rather than in whatever state its CPUs happen to be.

CPU sets come from ``os.sched_getaffinity`` and Linux's sysfs (``/sys/devices/system/cpu`` for SMT
siblings, ``/sys/bus/pci/devices/<bus id>/local_cpulist`` for the GPU's NUMA-local CPUs); where sysfs
says nothing, every allowed CPU counts as its own core and as local.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from ficco.harness.host_speed import python_work


class PinPolicy(StrEnum):
    """CPU placement policies (see the module docstring)."""

    none = "none"
    share = "share"
    core = "core"
    seek = "seek"


PIN_POLICIES = tuple(policy.value for policy in PinPolicy)
DEFAULT_PIN = PinPolicy.seek
"""The harness's policy (``ficco bench --pin``). Every GPU dataset committed before ``seek`` was measured
under ``share`` (its manifest says so; a resume asks for that policy). On one H200, six fresh jobs per
policy of two processes at once (local ranks 0 and 1 of 2, each case the slower one's) timed the
executor's host path with a slowest-over-fastest spread of 1.08-1.13x (CV 3-5%) under ``seek`` against
1.66-1.89x (CV 20-24%) under ``share`` and 1.76-2.06x under ``core``
(``benchmarks/results/host-placement-seek-loopback2-h200.json``; one process per job: ``-loopback-h200``);
on another H200 machine 1.17-1.31x against 1.41-1.63x (``-loopback2-h200-b``), the rest a drift of the whole
machine's speed.
On an H100 machine whose CPUs were slow most of the time, ``share`` measured the slow state steadily
(1.04-1.28x) and ``seek`` the usual speed, 22-35% faster (1.04-1.50x; ``-loopback2-h100-{a,b}``): the
labels then describe the host's usual speed, which is what the host factor scales."""
HOST_FACTOR_PIN = PinPolicy.share
"""``ficco host-factor``'s policy: a runtime's process does not seek, so the host factor a model is asked at
is what a process that stays on its CPUs gets, slow spells included (labels measured under ``seek`` give
the same machine a lower factor: the model then predicts for a host slower than its labels', as that
process's is)."""
SLOW_FACTOR = 1.3
"""``seek``: the main thread's core counts as slow when a probe takes more than this times the fastest
probe the process has seen (the slow state is about 2x; CPUs in their usual state differ by up to 10%)."""
PROBE_CALLS = 16
"""``seek``: :func:`harness.host_speed.python_work` calls per probe batch (about 60 us)."""
PROBE_BATCHES = 3
"""``seek``: a probe that finds a core slow is confirmed as the fastest of this many batches before the main
thread moves (an interrupt in one batch is not a slow state; a slow state lasts far longer than a probe).
A core found fast after one batch is not probed again: the check costs one batch per block."""
SEEK_PASSES = 4
"""``seek``: passes over the share's cores before a block is timed where it stands (between passes a pause of
:data:`SEEK_PAUSE_S`: at most ``(SEEK_PASSES - 1) * SEEK_PAUSE_S`` of waiting per block, plus the probes)."""
SEEK_PAUSE_S = 0.003
"""``seek``: seconds to wait when every core of the share probed slow (on most CPUs sampled on the GPU
machines the median slow spell lasted 0-2 ms, ``benchmarks/results/host-states-*.json``)."""
SYS_CPU = Path("/sys/devices/system/cpu")
SYS_PCI = Path("/sys/bus/pci/devices")


def parse_cpulist(text: str) -> list[int]:
    """CPUs of a Linux cpulist such as ``"0-3,8,10-11"`` (sysfs, ``taskset -c``), sorted.

    Raises ``ValueError`` naming the bad entry."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        try:
            lo, hi = int(first), int(last or first)
        except ValueError:
            raise ValueError(f"bad cpulist entry {part!r} in {text.strip()!r}: want N or N-M") from None
        if hi < lo:
            raise ValueError(f"bad cpulist range {part!r}: {hi} < {lo}")
        cpus.update(range(lo, hi + 1))
    return sorted(cpus)


def _read_cpulist(path: Path) -> list[int] | None:
    """The cpulist in ``path``, or None where the file is missing or unreadable."""
    try:
        return parse_cpulist(path.read_text())
    except (OSError, ValueError):
        return None


def physical_cores(cpus: list[int], sys_cpu: Path = SYS_CPU) -> list[tuple[int, ...]]:
    """``cpus`` grouped into physical cores (SMT siblings together, each group sorted, groups in order of
    their first CPU); a CPU whose siblings sysfs does not list is a core of its own."""
    allowed, cores, seen = set(cpus), [], set()
    for cpu in sorted(cpus):
        if cpu in seen:
            continue
        siblings = _read_cpulist(sys_cpu / f"cpu{cpu}" / "topology" / "thread_siblings_list") or [cpu]
        core = tuple(c for c in siblings if c in allowed) or (cpu,)
        seen.update(core)
        cores.append(core)
    return cores


def gpu_local_cpus(device_index: int, sys_pci: Path = SYS_PCI) -> set[int] | None:
    """The CPUs NUMA-local to CUDA device ``device_index`` (sysfs), or None where unknown (no CUDA, a
    torch without the device's PCI address, or no sysfs entry)."""
    try:
        import torch

        props = torch.cuda.get_device_properties(device_index)
        address = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except (AttributeError, RuntimeError, AssertionError):
        return None
    cpus = _read_cpulist(sys_pci / address / "local_cpulist")
    return set(cpus) if cpus else None


def probe_us(batches: int = 1) -> float:
    """The interpreter's speed on the calling thread now: microseconds per :func:`python_work` call, the
    fastest of ``batches`` batches of :data:`PROBE_CALLS` calls."""
    best = math.inf
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(PROBE_CALLS):
            python_work()
        best = min(best, (time.perf_counter() - start) / PROBE_CALLS * 1e6)
    return best


@dataclass
class Seeker:
    """``seek``: keeps the main thread on a core of the rank's share that runs at the host's usual speed.

    The first :meth:`settle` probes every core and starts on the fastest; each later one probes the current
    core and, while the probe is over :data:`SLOW_FACTOR` times the fastest seen, moves on to the next
    core; when a whole pass over the cores found them slow it waits :data:`SEEK_PAUSE_S` and passes again,
    :data:`SEEK_PASSES` passes at most. Counts what it did for the logs."""

    cores: tuple[tuple[int, ...], ...]
    """The share's physical cores; the main thread runs on the first CPU of one, the other threads on the
    rest of the share."""
    at: int = 0
    """Index of the core the main thread is on."""
    fastest_us: float = math.inf
    """Fastest probe seen, us per call."""
    settles: int = 0
    """:meth:`settle` calls."""
    moves: int = 0
    """Moves to another core."""
    slow: int = 0
    """Calls that found no core in the usual state (the block was timed on the last one tried)."""

    @property
    def mains(self) -> tuple[int, ...]:
        """The CPUs the main thread may run on: the first of each core."""
        return tuple(core[0] for core in self.cores)

    def place(self) -> int:
        """Put the main thread on core :attr:`at` and every other thread on the rest of the share; the
        number of other threads moved."""
        core = self.cores[self.at]
        rest = tuple(c for other in self.cores if other != core for c in other) or core
        return _pin_main(core[:1], rest)

    def settle(self) -> bool:
        """Before a timed block: True when the main thread's core runs at the usual speed (moving it there
        if needed), False when every core of the share probed slow."""
        self.settles += 1
        if self.fastest_us == math.inf:  # the first call: probe every core, then stay on the fastest
            probes = []
            for at in range(len(self.cores)):
                self.at = at
                self.place()
                probes.append(probe_us(PROBE_BATCHES))
            self.at = min(range(len(probes)), key=probes.__getitem__)
            self.fastest_us = probes[self.at]
            self.place()
            return True
        for attempt in range(SEEK_PASSES):
            if attempt:  # every core was slow: spells mostly last a few ms, so wait one out and look again
                time.sleep(SEEK_PAUSE_S)
            for tried in range(len(self.cores)):
                if tried:
                    self.at = (self.at + 1) % len(self.cores)
                    self.place()
                    self.moves += 1
                us = probe_us()
                if us > SLOW_FACTOR * self.fastest_us:  # slow, or an interrupt: confirm before moving
                    us = min(us, probe_us(PROBE_BATCHES))
                self.fastest_us = min(self.fastest_us, us)
                if us <= SLOW_FACTOR * self.fastest_us:
                    return True
        self.slow += 1
        return False

    def describe(self) -> str:
        """What it did so far, for logs."""
        return (
            f"{self.settles} settles, {self.moves} moves, {self.slow} found every core slow; fastest probe "
            f"{self.fastest_us:.2f} us"
        )


def _pin_main(main: tuple[int, ...], others: tuple[int, ...]) -> int:
    """Pin the calling (main) thread to ``main`` and every other thread of the process to ``others``; the
    number of other threads moved (a thread that ended meanwhile, or may not be moved, is skipped)."""
    me = _thread_id()
    os.sched_setaffinity(0, main)
    moved = 0
    for task in Path("/proc/self/task").iterdir():
        tid = int(task.name)
        if tid == me:
            continue
        try:
            os.sched_setaffinity(tid, others)
            moved += 1
        except (ProcessLookupError, PermissionError):
            continue
    return moved


@dataclass(frozen=True)
class Placement:
    """One local rank's CPUs: ``threads`` for all of its threads, or, with ``main`` set, ``main`` for the
    main thread alone and ``threads`` for every other thread."""

    policy: str
    threads: tuple[int, ...]
    main: tuple[int, ...] = ()
    gpu_local: bool | None = None
    """Whether ``main`` (or ``threads``) lies on CPUs local to the rank's GPU; None where unknown."""
    seeker: Seeker | None = field(default=None, compare=False)
    """``seek``: what moves the main thread off slow cores (:meth:`settle`)."""

    @property
    def cpus(self) -> tuple[int, ...]:
        """Every CPU of the rank: ``main`` and ``threads``."""
        return tuple(sorted({*self.main, *self.threads}))

    def confine(self) -> None:
        """Keep the calling thread, and every thread it starts from now on, within :attr:`cpus` (call it
        before the process group starts NCCL's threads: they stay within the rank's share, and
        :meth:`apply` later moves them off the main thread's core)."""
        if self.policy != "none":
            os.sched_setaffinity(0, self.cpus)

    def apply(self) -> int:
        """Pin the calling thread (the main thread) and move the process's other threads; the number of
        other threads moved. Idempotent: call it again to catch threads started since (NCCL starts a proxy
        thread per communicator, some lazily)."""
        if self.policy == "none":
            return 0
        if self.seeker is not None:
            return self.seeker.place()
        if not self.main:
            os.sched_setaffinity(0, self.threads)
            return 0
        return _pin_main(self.main, self.threads)

    def settle(self) -> bool:
        """Before a timed block: under ``seek``, :meth:`Seeker.settle` (True when the main thread runs at
        the host's usual speed); under every other policy nothing, and True."""
        return self.seeker.settle() if self.seeker is not None else True

    def describe(self) -> str:
        """One line for logs."""
        if self.policy == "none":
            return "none (the kernel places every thread)"
        where = {True: ", local to the GPU", False: ", not local to the GPU", None: ""}[self.gpu_local]
        if self.seeker is not None:
            return (
                f"seek: main thread on whichever of CPUs {_cpulist(self.seeker.mains)} runs at the usual "
                f"speed (now CPU {self.seeker.mains[self.seeker.at]}), other threads on the rest; "
                f"{self.seeker.describe()}"
            )
        if self.main:
            return (
                f"core: main thread on CPU {_cpulist(self.main)}{where}, "
                f"other threads on CPUs {_cpulist(self.threads)}"
            )
        return f"share: every thread on CPUs {_cpulist(self.threads)}{where}"


def _thread_id() -> int:
    """The calling thread's kernel id (what ``/proc/self/task`` lists)."""
    import threading

    return threading.get_native_id()


def _cpulist(cpus: tuple[int, ...]) -> str:
    """``cpus`` as a compact cpulist (``0-3,8``)."""
    ranges: list[list[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


def plan_placement(
    policy: str,
    local_rank: int,
    local_world_size: int,
    cpus: list[int],
    cores: list[tuple[int, ...]],
    local: set[int] | None = None,
) -> Placement:
    """Where local rank ``local_rank`` of ``local_world_size`` runs, by ``policy`` (``PIN_POLICIES``).

    ``cpus``: the CPUs the process may use; ``cores``: those CPUs as physical cores
    (:func:`physical_cores`); ``local``: the CPUs local to this rank's GPU, if known. Ranks get disjoint,
    equal shares of whole cores, in order; under ``core`` the main thread gets the share's first core that
    is local to the GPU (else its first core), and the other threads the rest of the share (the whole
    share when it has one core); ``seek`` starts as ``core`` and may move the main thread to any core of
    the share (:class:`Seeker`). Fewer cores than ranks: every rank keeps every CPU (``share``) and the
    main thread its rank's core modulo the count (``core``, ``seek``)."""
    if policy not in PIN_POLICIES:
        raise ValueError(f"pin policy {policy!r} is not one of {', '.join(PIN_POLICIES)}")
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local rank {local_rank} is outside 0..{local_world_size - 1}")
    if policy == "none" or not cpus:
        return Placement("none", tuple(cpus))
    per_rank = len(cores) // local_world_size
    share = cores[local_rank * per_rank : (local_rank + 1) * per_rank] if per_rank else cores
    threads = tuple(sorted(c for core in share for c in core))

    def is_local(group: tuple[int, ...]) -> bool | None:
        return None if local is None else set(group) <= local

    if policy == "share":
        return Placement("share", threads, gpu_local=is_local(threads))
    if per_rank:
        main_core = next((core for core in share if is_local(core)), share[0])
    else:
        main_core = cores[local_rank % len(cores)]
    rest = tuple(sorted(c for core in share if core != main_core for c in core)) or threads
    if policy == "seek":
        order = (main_core, *(core for core in share if core != main_core)) if per_rank else (main_core,)
        seeker = Seeker(cores=order)
        return Placement("seek", rest, main=main_core[:1], gpu_local=is_local(main_core), seeker=seeker)
    return Placement("core", rest, main=main_core[:1], gpu_local=is_local(main_core))


def placement_for_rank(
    policy: str, local_rank: int, local_world_size: int, device_index: int | None
) -> Placement:
    """:func:`plan_placement` on this machine: the CPUs this process may use, their physical cores, and
    the CPUs local to CUDA device ``device_index`` (None: no GPU)."""
    cpus = sorted(os.sched_getaffinity(0))
    local = gpu_local_cpus(device_index) if device_index is not None else None
    return plan_placement(policy, local_rank, local_world_size, cpus, physical_cores(cpus), local)


def placement_from_env(policy: str, cuda: bool) -> Placement:
    """:func:`placement_for_rank` of this torchrun process: its ``LOCAL_RANK`` of ``LOCAL_WORLD_SIZE``, on
    the GPU of its local rank when ``cuda`` (the device ``executor.process_group`` gives it)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return placement_for_rank(policy, local_rank, local_world_size, local_rank if cuda else None)
