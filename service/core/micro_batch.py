"""Batching predictions: micro-batches of single-scenario requests, and large batches split over threads.

Single requests: the scenarios of the requests that reach a model in one turn of the event loop are
predicted together, with one call, on the event loop, at the start of its next turn.

A prediction of one scenario costs ~0.4-0.9 ms (the numpy fast path's walk and the policy; an h200x2 model,
one core), a call of 8 eager scenarios ~3.3 ms and of 32 ~6.3 ms (``Predictor.decide`` hands lists past a few
scenarios to XGBoost), so answering requests one call each under load caps a server near 1,000 req/s of
pure model time and leaves nothing for HTTP. Requests that arrive
together (the loop finds several connections readable at once) share one call; a lone request waits only
for the loop to turn. The call runs on the loop itself: the one-row walk holds the GIL for most of its time,
so a prediction thread would not run beside the loop, and the hand-off to it and back cost the server
~0.4 ms of CPU per request (measured on 2 cores; docs/service.md#single-requests).

    timeline (one event-loop thread)
    turn 1:  parse r1 | parse r2 | parse r3 |
    turn 2:  predict [r1, r2, r3] |
    turn 3:  reply r1 | reply r2 | reply r3 | parse r4
    turn 4:  predict [r4] | ...
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
    """Collects the scenarios of the requests that reach it in one turn of the event loop and predicts them
    with one ``predict`` call on the loop, at the start of its next turn.

    ``predict`` maps a list of scenarios to one answer each (``Predictor.recommend``). Use from one event loop
    only.
    """

    def __init__(self, predict: Callable[[Sequence[Scenario]], list[Any]]) -> None:
        self._predict = predict
        self._pending: list[tuple[Scenario, asyncio.Future]] = []

    async def recommend(self, scenario: Scenario) -> Any:
        """The answer for ``scenario``, predicted with the other scenarios that arrived in the same turn."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((scenario, future))
        return await future

    def _flush(self) -> None:
        """Predict every pending scenario in one call; each waiting request gets its answer, or the error."""
        batch, self._pending = self._pending, []
        waiting = [future for _, future in batch]
        try:
            answers = self._predict([scenario for scenario, _ in batch])
        except Exception as err:  # every request of the call gets the error; the batcher keeps working
            for future in waiting:
                if not future.cancelled():
                    future.set_exception(err)
            return
        for future, answer in zip(waiting, answers, strict=True):
            if not future.cancelled():
                future.set_result(answer)
