"""Admission of large batches: at most ``concurrency`` run at once, ``queue`` more wait, and any further
batch is refused at once (``BusyError``: 429 with Retry-After) instead of piling up; and of requests a
client has no reason to repeat quickly (schedule tables): at most so many per second from one address.

The batches themselves run in the batch worker processes (``service.core.worker_pool``), one per slot;
the gate bounds how many requests hold a body or an answer: a batch counts until its answer is sent
(``core.offload``), so answers that clients do not read hold bounded memory.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
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


class ClientRate:
    """At most ``per_s`` requests a second from one client address, in bursts of up to ``2 * per_s``
    (a token bucket per address); a further request gets ``BusyError`` (429, Retry-After: when its next
    token comes). ``per_s`` 0: no limit. Buckets of addresses that are full again are forgotten once
    ``max_clients`` are kept, so the bookkeeping stays bounded.

    Use from one event loop only (the buckets are not locked).
    """

    def __init__(self, per_s: float, *, what: str, max_clients: int = 10_000) -> None:
        self.per_s = per_s
        self.burst = max(1.0, 2 * per_s)
        self.what = what
        """What is limited, for the refusal's message (e.g. ``schedule tables``)."""
        self.max_clients = max_clients
        self._buckets: dict[str, tuple[float, float]] = {}
        """Address -> (tokens, when they were counted, ``time.monotonic``)."""

    def take(self, client: str) -> None:
        """Count one request of ``client``, or ``BusyError`` when its bucket is empty."""
        if self.per_s <= 0:
            return
        now = time.monotonic()
        tokens, then = self._buckets.get(client, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.per_s)
        if tokens < 1:
            retry = max(1, math.ceil((1 - tokens) / self.per_s))
            raise BusyError(
                f"at most {self.per_s:g} requests a second for {self.what} from one client; retry after "
                f"{retry} s",
                retry,
            )
        if len(self._buckets) >= self.max_clients and client not in self._buckets:
            self._forget_full(now)
        self._buckets[client] = (tokens - 1, now)

    def _forget_full(self, now: float) -> None:
        """Drop the buckets that have refilled (their clients are back to a fresh start anyway)."""
        full = [c for c, (t, then) in self._buckets.items() if t + (now - then) * self.per_s >= self.burst]
        for client in full or list(self._buckets)[: len(self._buckets) // 2]:
            del self._buckets[client]
