"""time_interleaved: short steps get more rounds (up to the cap), long steps keep the least, every rank
gets the same numbers, and the slowest rank's step time counts.

Steps sleep a known time (milliseconds, far above the sleep's jitter), so the round counts are known."""

from __future__ import annotations

import time

import torch
from executor_world import run_world

from ficco.runtime.timing import time_interleaved


def _timed_world(rank: int, world_size: int, sleep_ms: dict[str, list[float]], settings: dict) -> dict:
    """Time one sleeping step per variant (``sleep_ms[name][rank]`` on this rank); count each step's calls."""
    calls = dict.fromkeys(sleep_ms, 0)

    def variant(name: str):
        def step() -> None:
            calls[name] += 1
            time.sleep(sleep_ms[name][rank] / 1e3)

        return (lambda: None, step)

    times, host = time_interleaved(
        {name: variant(name) for name in sleep_ms}, device=torch.device("cpu"), **settings
    )
    return {"times": times, "host": host, "calls": calls}


def test_short_steps_get_more_rounds_up_to_the_cap() -> None:
    # the fastest variant's step is ~2 ms: 40 ms over 2 reps of 2 ms asks for 10 rounds, capped at 6.
    sleep = {"fast": [2.0, 2.0], "slow": [6.0, 6.0]}
    settings = {"warmup": 1, "rounds": 2, "reps": 2, "timed_ms": 40.0, "max_rounds": 6}
    results = run_world(2, _timed_world, sleep, settings)
    for result in results:
        assert result["calls"] == {"fast": 1 + 6 * 2, "slow": 1 + 6 * 2}
    assert results[0]["times"] == results[1]["times"]
    assert 2.0 <= results[0]["times"]["fast"] < 4.0
    assert 6.0 <= results[0]["times"]["slow"] < 9.0


def test_long_steps_keep_the_least_rounds_and_the_slowest_rank_counts() -> None:
    # 5 ms on one rank, 15 ms on the other: 20 ms over 2 reps of 15 ms (slowest rank) needs 1 round; 3 stay.
    sleep = {"only": [5.0, 15.0]}
    settings = {"warmup": 0, "rounds": 3, "reps": 2, "timed_ms": 20.0, "max_rounds": 10}
    results = run_world(2, _timed_world, sleep, settings)
    for result in results:
        assert result["calls"] == {"only": 3 * 2}
        assert result["times"]["only"] >= 15.0


def test_without_a_time_target_the_rounds_are_fixed() -> None:
    sleep = {"fast": [1.0, 1.0]}
    settings = {"warmup": 0, "rounds": 2, "reps": 3}
    for result in run_world(2, _timed_world, sleep, settings):
        assert result["calls"] == {"fast": 2 * 3}
