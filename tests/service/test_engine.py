"""The engine: a large batch split over threads answers as one call does."""

from __future__ import annotations

import numpy as np

from ficco.service.core.store import ModelStore
from ficco.service.engine import recommend_scenarios
from ficco.service.schemas import ScenarioIn


def test_recommend_scenarios_split_over_threads_equals_one_call(registry_root):
    rng = np.random.default_rng(0)
    items = [
        ScenarioIn(
            op=("ag_gemm", "gemm_rs")[i % 2],
            m=2 * int(rng.integers(1, 40_000)),
            n=128 * int(rng.integers(1, 100)),
            k=4096,
        )
        for i in range(2100)
    ]
    answers = {}
    for threads in (1, 2):
        store = ModelStore(registry_root, cache_size=0, bulk_threads=threads)
        store.refresh()
        answers[threads] = recommend_scenarios(store.served, items, default_hardware="h200x2")
        store.close()
    assert answers[1] == answers[2]
