"""Batching: requests of one event-loop turn share a prediction call on the loop; large lists split over
threads; order kept."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from ficco.features import Scenario
from ficco.service.core.micro_batch import MicroBatcher, predict_split


class RecordedPredict:
    """Records each call's scenarios and the thread it ran on; fails when ``fail`` is set."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[int]] = []
        self.threads: list[int] = []
        self.fail = fail

    def __call__(self, scenarios):
        self.calls.append([s.m for s in scenarios])
        self.threads.append(threading.get_ident())
        if self.fail:
            raise RuntimeError("model broke")
        return [f"answer-{s.m}" for s in scenarios]


async def _turns(batcher, *groups):
    """Send each group of scenarios (by ``m``) in one turn of the loop, the next group once the previous
    one's answers are in; every answer (or error), in order."""
    out = []
    for ms in groups:
        tasks = [asyncio.ensure_future(batcher.recommend(Scenario(m=m))) for m in ms]
        out += await asyncio.gather(*tasks, return_exceptions=True)
    return out


def test_requests_of_one_turn_share_one_call_on_the_event_loop():
    predict = RecordedPredict()

    async def main():
        return threading.get_ident(), await _turns(MicroBatcher(predict), [2, 4, 6], [8], [10, 12])

    loop_thread, answers = asyncio.run(main())
    assert answers == [f"answer-{m}" for m in (2, 4, 6, 8, 10, 12)]
    assert predict.calls == [[2, 4, 6], [8], [10, 12]]
    assert set(predict.threads) == {loop_thread}  # no hand-off to another thread


def test_an_error_goes_to_every_request_of_its_call_and_the_batcher_keeps_working():
    predict = RecordedPredict(fail=True)
    batcher = MicroBatcher(predict)
    answers = asyncio.run(_turns(batcher, [2, 4, 6]))
    assert all(isinstance(a, RuntimeError) for a in answers) and len(answers) == 3
    predict.fail = False
    assert asyncio.run(_turns(batcher, [8])) == ["answer-8"]
    assert predict.calls == [[2, 4, 6], [8]]


def test_a_cancelled_request_leaves_the_others_of_its_call_answered():
    predict = RecordedPredict()

    async def main():
        batcher = MicroBatcher(predict)
        tasks = [asyncio.ensure_future(batcher.recommend(Scenario(m=m))) for m in (2, 4)]
        await asyncio.sleep(0)  # both requests are waiting on the call
        tasks[0].cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    first, second = asyncio.run(main())
    assert isinstance(first, asyncio.CancelledError) and second == "answer-4"


def test_a_bad_scenario_fails_its_call_not_the_batcher():
    predict = RecordedPredict()
    batcher = MicroBatcher(predict)
    with pytest.raises(AttributeError):
        asyncio.run(batcher.recommend(None))  # predict reads .m of every scenario
    assert asyncio.run(batcher.recommend(Scenario(m=128))) == "answer-128"


def test_predict_split_cuts_large_lists_and_keeps_order():
    calls: list[int] = []

    def predict(scenarios):
        calls.append(len(scenarios))
        return [s.m for s in scenarios]

    scenarios = [Scenario(m=2 * i + 2) for i in range(2500)]
    with ThreadPoolExecutor(2) as pool:
        assert predict_split(predict, scenarios, pool, parts=2) == [s.m for s in scenarios]
        assert sorted(calls) == [1250, 1250]
        calls.clear()
        assert predict_split(predict, scenarios[:1500], pool, parts=2) == [s.m for s in scenarios[:1500]]
        assert calls == [1500]  # too small to be worth two threads
