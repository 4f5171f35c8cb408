"""Linux cpulists (``0-3,8,10-11``: what sysfs, ``taskset`` and ``FICCO_WORKER_CPUS`` spell CPU sets in),
read and written; the standard library only."""

from __future__ import annotations

from collections.abc import Iterable


def parse_cpulist(text: str) -> list[int]:
    """CPUs of a Linux cpulist such as ``"0-3,8,10-11"``, sorted; ``ValueError`` names a bad entry."""
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


def format_cpulist(cpus: Iterable[int]) -> str:
    """``cpus`` as a compact cpulist (``0-3,8``)."""
    ranges: list[list[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)
