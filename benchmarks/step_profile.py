"""Where one step's time goes on the GPU: its kernels and copies split by kind, and the GPU's idle time.

:func:`profile_split` runs a step once under ``torch.profiler`` (CUDA activity) between two CUDA events and
returns :func:`split` of what the GPU ran: for each kind (:data:`KINDS`, :func:`kind_of` names a kernel's
kind) the time at least one of its kernels ran (the union over streams, ms), the time the GPU ran anything
(``busy_ms``), the step between the events (``step_ms``) and the rest, ``idle_ms``: the GPU waiting for the
host (the host's gaps). ``exposed_comm_ms`` is the time communication ran with no compute beside it (the
communication not hidden). :func:`dominant` names what the step's time goes to most.

Kinds, from the kernel's name: ``gemm`` (cuBLAS / CUTLASS / nvjet GEMMs, Inductor's matmul templates),
``attention`` (flash, memory-efficient and cuDNN attention), ``comm`` (NCCL kernels, symmetric-memory
kernels, peer-to-peer copies), ``copy`` (device copies and memsets on the copy engines: ficco's ``dma``
transfers over mapped peer memory appear here when the driver reports them device-to-device, beside local
copies) and ``other`` (every other kernel: norms, rotary, pointwise, the optimizer). ``kernel_ms`` sums the
durations of every kernel but the copy engines' (the GPU work a step does on the SMs, however its streams
overlapped): what the loopback runs of ``benchmarks/runtimes.py`` compare.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

KINDS: tuple[str, ...] = ("gemm", "attention", "comm", "copy", "other")
COMPUTE: tuple[str, ...] = ("gemm", "attention", "other")
"""The kinds that hide communication when they run beside it."""
_PATTERNS: tuple[tuple[str, re.Pattern], ...] = (
    ("comm", re.compile(r"nccl|symm_mem|symmetric|cross_device|Memcpy PtoP", re.I)),
    ("copy", re.compile(r"^Memcpy|^Memset", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|attn|sdpa", re.I)),
    ("gemm", re.compile(r"gemm|gemv|cutlass|xmma|nvjet|cublas|triton_tem_|splitk", re.I)),
)
"""First match wins: attention kernels before GEMMs (CUTLASS attention kernels say ``cutlass``)."""


def kind_of(name: str) -> str:
    """The kind (:data:`KINDS`) of a kernel, copy or memset reported under ``name``."""
    for kind, pattern in _PATTERNS:
        if pattern.search(name):
            return kind
    return "other"


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint, sorted intervals covering the same time as ``intervals``."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _minus(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """The time in the disjoint sorted intervals ``a`` outside the disjoint sorted intervals ``b``."""
    left, j = 0.0, 0
    for start, end in a:
        t = start
        while j < len(b) and b[j][1] <= t:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > t:
                left += b[k][0] - t
            t = max(t, b[k][1])
            k += 1
        left += max(0.0, end - t)
    return left


def split(activity: Iterable[tuple[str, float, float]], step_ms: float) -> dict[str, Any]:
    """The split of a step of ``step_ms`` from its GPU activity ``(name, start_us, end_us)``: the time each
    kind ran (``kinds``, ms), ``busy_ms``, ``idle_ms`` (``step_ms - busy_ms``, at least 0),
    ``exposed_comm_ms`` and ``kernels`` (how many); and the GPU work: ``kernel_ms``, the durations of its
    kernels summed (every kind but ``copy``: work on the SMs, however it overlapped), and ``work_ms``, that
    sum per kind (``copy``: the copy engines' copies and memsets)."""
    by_kind: dict[str, list[tuple[float, float]]] = {k: [] for k in KINDS}
    count = 0
    for name, start, end in activity:
        by_kind[kind_of(name)].append((start, end))
        count += 1
    unions = {k: _union(v) for k, v in by_kind.items()}
    busy = _union(x for v in unions.values() for x in v)
    compute = _union(x for k in COMPUTE for x in unions[k])
    busy_ms = _length(busy) / 1e3
    work = {k: sum(end - start for start, end in v) / 1e3 for k, v in by_kind.items()}
    return {
        "step_ms": step_ms,
        "busy_ms": busy_ms,
        "idle_ms": max(0.0, step_ms - busy_ms),
        "kinds": {k: _length(unions[k]) / 1e3 for k in KINDS},
        "exposed_comm_ms": _minus(unions["comm"], compute) / 1e3,
        "kernels": count,
        "kernel_ms": sum(ms for k, ms in work.items() if k != "copy"),
        "work_ms": work,
    }


def dominant(profile: dict[str, Any]) -> str:
    """What the step's time goes to most: ``host`` (the GPU idle, waiting for it), ``comm`` (exposed
    communication) or the compute kind that ran longest (``gemm``, ``attention``, ``other``)."""
    shares = {"host": profile["idle_ms"], "comm": profile["exposed_comm_ms"]}
    shares |= {k: profile["kinds"][k] for k in COMPUTE}
    return max(shares, key=shares.__getitem__)


def profile_split(step: Callable[[], Any], device: Any, calls: int = 1) -> dict[str, Any]:
    """:func:`split` of a call of ``step`` on the CUDA ``device`` (this process's GPU only); with ``calls``
    > 1, each call profiled on its own and the call whose ``kernel_ms`` is the median kept (the GPU work of
    a step moves by a percent or so between calls), with ``kernel_ms_calls``, every call's."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    index = device.index if device.index is not None else torch.cuda.current_device()
    splits = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            start.record()
            step()
            end.record()
            torch.cuda.synchronize(device)
        activity = [
            (e.name, e.time_range.start, e.time_range.end)
            for e in prof.events()
            if e.device_type == DeviceType.CUDA and e.device_index in (index, -1)
        ]
        splits.append(split(activity, start.elapsed_time(end)))
    ranked = sorted(splits, key=lambda s: s["kernel_ms"])
    median = ranked[len(ranked) // 2]
    if calls > 1:
        median["kernel_ms_calls"] = [s["kernel_ms"] for s in splits]
    return median
