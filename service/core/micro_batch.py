"""Batching predictions: micro-batches of single-scenario requests, and large batches split over threads.

Single requests: one prediction in flight, the rest wait and go together.

A prediction costs a fixed ~0.3-0.7 ms per call plus ~20 us per scenario (an h200x2 model: XGBoost
``inplace_predict`` over ~3,000 trees, measured on 2 cores), so answering requests one call each caps a
server near 1,000 req/s of pure model time and leaves nothing for HTTP. Here predictions run in a worker
thread (XGBoost releases the GIL) while the event loop keeps parsing requests; the scenarios that arrive
meanwhile form the next call. An idle server still answers a lone request at once.

    timeline (loop = event-loop thread, worker = prediction thread)
    loop:    parse r1 | parse r2 | parse r3 | parse r4 |          | reply r1 | reply r2..r4
    worker:  ......... predict [r1] ....................| predict [r2, r3, r4] ...........
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any

from ficco.features import Scenario


def predict_split(
    predict: Callable[[Sequence[Scenario]], list[Any]],
    scenarios: Sequence[Scenario],
    executor: Executor,
    *,
    parts: int,
    min_part: int = 1024,
) -> list[Any]:
    """``predict(scenarios)``, a large list cut into up to ``parts`` chunks predicted concurrently on
    ``executor`` (XGBoost predicts without the GIL; answers are per scenario, so the cut changes none)."""
    parts = min(parts, len(scenarios) // min_part)
    if parts < 2:
        return predict(scenarios)
    size = -(-len(scenarios) // parts)
    chunks = [scenarios[i : i + size] for i in range(0, len(scenarios), size)]
    return [answer for answers in executor.map(predict, chunks) for answer in answers]


class MicroBatcher:
    """Collects scenarios from concurrent requests and predicts each group with one ``predict`` call.

    ``predict`` maps a list of scenarios to one answer each (``Predictor.recommend``); it runs on
    ``executor``. Use from one event loop only.
    """

    def __init__(self, predict: Callable[[Sequence[Scenario]], list[Any]], executor: Executor) -> None:
        self._predict = predict
        self._executor = executor
        self._pending: list[tuple[Scenario, asyncio.Future]] = []
        self._running = False

    async def recommend(self, scenario: Scenario) -> Any:
        """The answer for ``scenario``, predicted together with whatever else is waiting."""
        future = asyncio.get_running_loop().create_future()
        self._pending.append((scenario, future))
        if not self._running:
            self._start()
        return await future

    def _start(self) -> None:
        batch, self._pending = self._pending, []
        self._running = True
        loop = asyncio.get_running_loop()
        job = loop.run_in_executor(self._executor, self._predict, [scenario for scenario, _ in batch])
        job.add_done_callback(lambda done: self._finish(batch, done))

    def _finish(self, batch: list[tuple[Scenario, asyncio.Future]], done: asyncio.Future) -> None:
        self._running = False
        error = asyncio.CancelledError() if done.cancelled() else done.exception()
        for i, (_, future) in enumerate(batch):
            if future.cancelled():
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(done.result()[i])
        if self._pending:
            self._start()
