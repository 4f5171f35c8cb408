"""Where a rank's threads run on the host (``PIN_POLICIES``): ``none`` leaves it to the kernel, ``share``
gives each local rank an equal, disjoint share of the allowed CPUs' physical cores. CPU sets come from
``os.sched_getaffinity`` and Linux's sysfs. See docs/protocol.md, "CPU placement".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from ficco.cpulists import format_cpulist, parse_cpulist


class PinPolicy(StrEnum):
    """CPU placement policies (see the module docstring)."""

    none = "none"
    share = "share"


PIN_POLICIES = tuple(policy.value for policy in PinPolicy)
DEFAULT_PIN = PinPolicy.share
"""The policy of ``--pin``: every committed dataset's, and a runtime's process's, which stays on its CPUs."""
SYS_CPU = Path("/sys/devices/system/cpu")
SYS_PCI = Path("/sys/bus/pci/devices")


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
    """One local rank's CPUs (sorted): ``cpus`` for all of its threads."""

    policy: str
    cpus: tuple[int, ...]
    gpu_local: bool | None = None
    """Whether ``cpus`` lie on CPUs local to the rank's GPU; None where unknown."""

    def confine(self) -> None:
        """Keep the calling thread, and every thread it starts from now on, within :attr:`cpus` (call it
        before the process group starts NCCL's threads, so that they stay within the rank's share)."""
        if self.policy != "none":
            os.sched_setaffinity(0, self.cpus)

    def describe(self) -> str:
        """One line for logs."""
        if self.policy == "none":
            return "none (the kernel places every thread)"
        where = {True: ", local to the GPU", False: ", not local to the GPU", None: ""}[self.gpu_local]
        return f"share: every thread on CPUs {format_cpulist(self.cpus)}{where}"


def plan_placement(
    policy: str,
    local_rank: int,
    local_world_size: int,
    cpus: list[int],
    cores: list[tuple[int, ...]],
    local: set[int] | None = None,
) -> Placement:
    """Where local rank ``local_rank`` of ``local_world_size`` runs, by ``policy``, given the ``cpus`` the
    process may use, those as physical ``cores`` and the CPUs ``local`` to its GPU (if known). Ranks get
    disjoint, equal shares of whole cores, in order; with fewer cores than ranks each keeps every CPU."""
    if policy not in PIN_POLICIES:
        raise ValueError(f"pin policy {policy!r} is not one of {', '.join(PIN_POLICIES)}")
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local rank {local_rank} is outside 0..{local_world_size - 1}")
    if policy == "none" or not cpus:
        return Placement("none", tuple(cpus))
    per_rank = len(cores) // local_world_size
    own = cores[local_rank * per_rank : (local_rank + 1) * per_rank] if per_rank else cores
    share = tuple(sorted(c for core in own for c in core))
    return Placement("share", share, gpu_local=None if local is None else set(share) <= local)


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
