"""Timing one thing alone (a collective's bandwidth, a copy) on a ``harness.torch_backend.TorchBackend``'s
ranks; schedules go through the backend's ``measure``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ficco.harness.torch_backend import TorchBackend


def time_rounds(backend: TorchBackend, run: Callable[[], object], *, untimed: int = 2) -> list[float]:
    """Per-call ms of ``run`` in each of ``backend.timing.rounds`` rounds (collective): ``untimed`` warm-up
    calls, then per round the ranks aligned and one call timed (CUDA events; CPU: host clock), the maximum
    over ranks."""
    import torch

    for _ in range(untimed):
        run()
    times = []
    for _ in range(backend.timing.rounds):
        backend._align()
        if backend.name == "gpu":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            run()
            times.append(1e3 * (time.perf_counter() - t0))
    return backend._max_over_ranks(times)
