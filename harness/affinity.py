"""Where a rank's threads run on the host: CPU placement for timing.

Eager-mode times of small shapes are the host's time to issue the executor's work, so they follow the
speed of the core the rank's Python thread runs on. Within one process that speed is steady (schedules
timed in interleaved rounds keep their order), but between two processes on the same machine it moved by
up to 15% (`datasets/h200x2-unseen-v3`'s re-measure, eager, below 0.1 ms). A likely cause, not yet
measured (``benchmarks/host_placement.py`` measures it): the kernel places the main thread anew in every
process, beside or away from the process's helper threads (NCCL's proxy, the watchdog) and the other
rank's, on a hardware thread whose SMT sibling is busy or idle.

Policies (``PIN_POLICIES``):

- ``none``: leave placement to the kernel;
- ``share``: each local rank gets an equal, disjoint share of the allowed CPUs for all its threads;
- ``core``: as ``share``, and the main thread gets one physical core of the share to itself (preferring
  CPUs local to the rank's GPU): every other thread of the process, including threads started later,
  is moved to the rest of the share whenever :meth:`Placement.apply` runs (the harness calls it before
  each scenario), and the core's SMT siblings stay idle.

CPU sets come from ``os.sched_getaffinity`` and Linux's sysfs (``/sys/devices/system/cpu`` for SMT
siblings, ``/sys/bus/pci/devices/<bus id>/local_cpulist`` for the GPU's NUMA-local CPUs); where sysfs
says nothing, every allowed CPU counts as its own core and as local.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path


class PinPolicy(StrEnum):
    """CPU placement policies (see the module docstring)."""

    none = "none"
    share = "share"
    core = "core"


PIN_POLICIES = tuple(policy.value for policy in PinPolicy)
DEFAULT_PIN = PinPolicy.share
"""The harness's policy (``ficco bench --pin``), the one every GPU dataset so far was measured with."""
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


@dataclass(frozen=True)
class Placement:
    """One local rank's CPUs: ``threads`` for all of its threads, or, with ``main`` set, ``main`` for the
    main thread alone and ``threads`` for every other thread."""

    policy: str
    threads: tuple[int, ...]
    main: tuple[int, ...] = ()
    gpu_local: bool | None = None
    """Whether ``main`` (or ``threads``) lies on CPUs local to the rank's GPU; None where unknown."""

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
        if not self.main:
            os.sched_setaffinity(0, self.threads)
            return 0
        me = _thread_id()
        os.sched_setaffinity(0, self.main)
        moved = 0
        for task in Path("/proc/self/task").iterdir():
            tid = int(task.name)
            if tid == me:
                continue
            try:
                os.sched_setaffinity(tid, self.threads)
                moved += 1
            except (ProcessLookupError, PermissionError):
                continue  # the thread ended meanwhile, or may not be moved
        return moved

    def describe(self) -> str:
        """One line for logs."""
        if self.policy == "none":
            return "none (the kernel places every thread)"
        where = {True: ", local to the GPU", False: ", not local to the GPU", None: ""}[self.gpu_local]
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
    share when it has one core). Fewer cores than ranks: every rank keeps every CPU (``share``) and the
    main thread its rank's core modulo the count (``core``)."""
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
