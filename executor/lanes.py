"""Side streams ("lanes") that carry the communication beside the GEMMs on the current stream.

``DeviceLanes`` holds CUDA streams at one priority: ``copy`` lanes for the pieces (one per peer when all
peers move at once) and one ``signal`` lane for the device barriers that publish landed pieces. Ordering is
done with stream waits and CUDA events only, never with host synchronisation. ``HostLanes`` is the CPU
stand-in: everything runs in program order, so every method is a no-op.

Fork and join are explicit and mirrored::

    lane.wait_stream(current)        # fork: the lane sees everything issued before the call
    with lane: ...                   # work on the lane
    current.wait_stream(lane)        # join: the caller sees everything the lane did
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import torch


class HostLanes:
    """CPU lanes: work runs in program order, so there is nothing to fork, wait for or join."""

    def fork(self) -> None:
        """No-op: nothing runs concurrently on the CPU path."""

    def join(self) -> None:
        """No-op."""

    def on_copy_lane(self, index: int) -> contextlib.AbstractContextManager[Any]:
        """A context in which lane ``index``'s copies run (the caller's thread)."""
        return contextlib.nullcontext()

    def after_current(self, index: int) -> None:
        """No-op: the GEMM that produced the data has already run."""

    def signal_after(self, lanes: Iterable[int], key: int, barrier: Callable[[], None]) -> None:
        """Run ``barrier`` now (the copies before it have finished)."""
        barrier()

    def wait_signal(self, key: int) -> None:
        """No-op: the barrier already returned."""


class DeviceLanes:
    """CUDA lanes at one stream priority; the per-piece events are created once and reused."""

    def __init__(self, device: torch.device, count: int, high_priority: bool) -> None:
        priority = _HIGH_PRIORITY if high_priority else 0
        self.copy = [torch.cuda.Stream(device=device, priority=priority) for _ in range(count)]
        """Copy lanes, one per concurrent stream of pieces."""
        self.signal = torch.cuda.Stream(device=device, priority=priority)
        """The lane that runs device barriers after copies and records when pieces have landed."""
        self._copied = [torch.cuda.Event() for _ in range(count)]
        self._produced = torch.cuda.Event()
        self._landed: dict[int, torch.cuda.Event] = {}

    def fork(self) -> None:
        """Every lane waits for the work issued so far on the current stream."""
        current = torch.cuda.current_stream()
        for lane in (*self.copy, self.signal):
            lane.wait_stream(current)

    def join(self) -> None:
        """The current stream waits for everything issued on the lanes."""
        current = torch.cuda.current_stream()
        for lane in (*self.copy, self.signal):
            current.wait_stream(lane)

    def on_copy_lane(self, index: int) -> contextlib.AbstractContextManager[Any]:
        """Make copy lane ``index`` the current stream inside the ``with`` block."""
        return torch.cuda.stream(self.copy[index])

    def after_current(self, index: int) -> None:
        """Copy lane ``index`` waits for the work issued so far on the current stream (a produced piece)."""
        self._produced.record(torch.cuda.current_stream())
        self.copy[index].wait_event(self._produced)

    def signal_after(self, lanes: Iterable[int], key: int, barrier: Callable[[], None]) -> None:
        """After the copies issued so far on ``lanes``, run ``barrier`` on the signal lane and remember
        the moment it completes under ``key`` (for :meth:`wait_signal`)."""
        for index in lanes:
            self._copied[index].record(self.copy[index])
            self.signal.wait_event(self._copied[index])
        with torch.cuda.stream(self.signal):
            barrier()
        landed = self._landed.get(key)
        if landed is None:
            landed = self._landed[key] = torch.cuda.Event()
        landed.record(self.signal)

    def wait_signal(self, key: int) -> None:
        """The current stream waits until the barrier recorded under ``key`` has completed."""
        torch.cuda.current_stream().wait_event(self._landed[key])


_HIGH_PRIORITY = -1
"""A higher-than-default CUDA stream priority (lower numbers are higher). -1 lies inside every CUDA
device's priority range, so nothing relies on how a torch version clamps values outside it."""
