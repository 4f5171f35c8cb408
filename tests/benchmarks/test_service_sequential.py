"""benchmarks/service_sequential.py: per-thread CPU of a live process, the request kinds, the rendering."""

from __future__ import annotations

import os
import threading
import time

from benchmarks.service_sequential import KINDS, bodies_of, render, thread_cpu_s


def test_thread_cpu_counts_a_busy_thread_apart_from_the_main_thread():
    spun, release = threading.Event(), threading.Event()

    def spin() -> None:
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:
            pass
        spun.set()
        release.wait()  # alive until measured: an ended thread leaves /proc/<pid>/task

    before = thread_cpu_s(os.getpid())
    worker = threading.Thread(target=spin)
    worker.start()
    spun.wait()
    after = thread_cpu_s(os.getpid())
    release.set()
    worker.join()
    grown = {tid: after[tid] - before.get(tid, 0.0) for tid in after if tid != os.getpid()}
    assert max(grown.values()) >= 0.2  # the spinning thread's own time, not the main thread's
    assert after[os.getpid()] - before[os.getpid()] < 0.2


def test_bodies_of_each_kind():
    cached = bodies_of("cached", 5, seed=1)
    assert len(cached) == 5 and all(body == cached[0] for body in cached)
    for kind in ("unseen eager", "unseen graph"):
        bodies = bodies_of(kind, 50, seed=2)
        assert len({tuple(sorted(b.items())) for b in bodies}) == 50
        assert {b["mode"] for b in bodies} == {kind.split()[-1]}
    assert KINDS == ("cached", "unseen eager", "unseen graph")


def test_render_has_a_row_per_kind():
    row = {"requests": 100, "p50_ms": 1.0, "p90_ms": 1.5, "p99_ms": 2.0, "max_ms": 3.0,
           "loop_cpu_ms_per_request": 0.4, "other_cpu_ms_per_request": 0.9}  # fmt: skip
    result = {
        "when": "now",
        "machine": {"cpus": 2, "platform": "linux", "python": "3.11", "load_average_1m_at_start": 0.1},
        "rows": [{"kind": kind, **row} for kind in KINDS],
    }
    text = render(result)
    assert all(f"| {kind} | 100 | 1.0 |" in text for kind in KINDS)
