"""Batching: concurrent scenarios share prediction calls; large lists split over threads; order kept."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from ficco.features import Scenario
from ficco.service.core.micro_batch import MicroBatcher, predict_split


class GatedPredict:
    """Records each call's scenarios; the first call waits until ``release`` is set."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[int]] = []
        self.release = threading.Event()
        self.fail = fail

    def __call__(self, scenarios):
        if not self.calls:
            self.release.wait(timeout=10)
        self.calls.append([s.m for s in scenarios])
        if self.fail:
            raise RuntimeError("model broke")
        return [f"answer-{s.m}" for s in scenarios]


async def _ask(batcher, predict, ms):
    tasks = [asyncio.ensure_future(batcher.recommend(Scenario(m=m))) for m in ms]
    await asyncio.sleep(0.05)  # every request is waiting: the first call is in flight, the rest queued
    predict.release.set()
    return await asyncio.gather(*tasks, return_exceptions=True)


def test_batcher_groups_requests_waiting_on_a_prediction():
    predict = GatedPredict()
    with ThreadPoolExecutor(1) as pool:
        answers = asyncio.run(_ask(MicroBatcher(predict, pool), predict, [2, 4, 6, 8]))
    assert answers == ["answer-2", "answer-4", "answer-6", "answer-8"]
    assert predict.calls == [[2], [4, 6, 8]]


def test_batcher_passes_errors_to_every_waiting_request():
    predict = GatedPredict(fail=True)
    with ThreadPoolExecutor(1) as pool:
        answers = asyncio.run(_ask(MicroBatcher(predict, pool), predict, [2, 4, 6]))
    assert all(isinstance(a, RuntimeError) for a in answers)
    assert predict.calls == [[2], [4, 6]]


def test_batcher_answers_a_lone_request_at_once():
    predict = GatedPredict()
    predict.release.set()
    with ThreadPoolExecutor(1) as pool:
        batcher = MicroBatcher(predict, pool)
        assert asyncio.run(batcher.recommend(Scenario(m=64))) == "answer-64"
        with pytest.raises(AttributeError):
            asyncio.run(batcher.recommend(None))  # a call that fails leaves the batcher working
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
