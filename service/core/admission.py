"""Admission of large batches: at most ``concurrency`` run at once, ``queue`` more wait, and any further
batch is refused at once (``BusyError``: 429 with Retry-After) instead of piling up.

The batches themselves run in the batch worker processes (``service.core.worker_pool``), one per slot;
the gate bounds how many requests hold a body or an answer: a batch counts until its answer is sent
(``core.offload``), so answers that clients do not read hold bounded memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class BusyError(RuntimeError):
    """Too many batches are running or waiting; retry after ``retry_after_s`` seconds."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class BatchGate:
    """Runs batch jobs ``concurrency`` at a time, with ``queue`` more waiting.

    Use from one event loop only (the counters are not locked).
    """

    def __init__(self, *, concurrency: int, queue: int, retry_after_s: int) -> None:
        self.limit = concurrency + queue
        """Batches admitted at most (running + waiting)."""
        self.admitted = 0
        """Batches running or waiting now."""
        self.retry_after_s = retry_after_s
        self._slots = asyncio.Semaphore(concurrency)

    def admit(self) -> Callable[[], None]:
        """Count one batch in, or ``BusyError`` at once when full; returns the call (idempotent) that counts
        it out, which the caller makes once its answer is sent (``core.offload``)."""
        if self.admitted >= self.limit:
            log.info("batch refused: %d batches running or waiting (limit %d)", self.admitted, self.limit)
            raise BusyError(
                f"the server is busy with {self.admitted} batches (FICCO_BATCH_CONCURRENCY + "
                f"FICCO_BATCH_QUEUE = {self.limit}); retry after {self.retry_after_s} s",
                self.retry_after_s,
            )
        self.admitted += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.admitted -= 1

        return release

    async def run_admitted(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)`` once a slot is free, for a batch already admitted (:meth:`admit`)."""
        async with self._slots:
            return await fn(*args)

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)`` once a slot is free; ``BusyError`` at once when full."""
        release = self.admit()
        try:
            return await self.run_admitted(fn, *args)
        finally:
            release()
