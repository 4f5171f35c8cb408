"""The benchmark's goal metrics on a hand-made records list (benchmarks/executor_report.py, no GPU)."""

from __future__ import annotations

import math

import pytest

from benchmarks import executor_report as report


def _shape(op, m, gemm, nccl, dma, serial, async_tp, times):
    """Records of one shape: ``times`` maps schedule -> median (None: failed)."""
    base = {"op": op, "m": m, "n": 64, "k": 32, "gemm_alone_ms": gemm, "comm_alone_ms": nccl}
    base |= {"dma_comm_alone_ms": dma, "serial_ms": serial, "async_tp_ms": async_tp}
    return [{**base, "schedule": s, "median_ms": t, "ok": t is not None} for s, t in times.items()]


# A: comm-heavy, async-TP beats serial. serial 1.5, ideal max(1.0, min(0.6, 0.4)) = 1.0, best 1.1 -> 0.8
A = _shape(
    "ag_gemm", 1, 1.0, 0.6, 0.4, 1.5, 1.32, {"serial/sm": 1.5, "shard/dma": 1.1, "finer/dma/s2/chunk": None}
)
# B: comm-heavy, async-TP loses to serial. serial 2.0, ideal 1.0, best 1.4 -> 0.6
B = _shape("gemm_rs", 2, 1.0, 0.5, 0.9, 2.0, 2.8, {"serial/sm": 2.0, "shard/sm": 1.4})
# C: communication-light (0.1 < 20% of 1.0): left out of the overlap average
C = _shape("ag_gemm", 3, 1.0, 0.1, 0.2, 1.1, 1.1, {"serial/sm": 1.1, "shard/dma": 1.05})
RECORDS = A + B + C
BANDWIDTH = [
    {"mbytes": 1, "nccl_ms": 0.05, "dma_ms": 0.1},
    {"mbytes": 4, "nccl_ms": 0.1, "dma_ms": 0.08},
    {"mbytes": 256, "nccl_ms": 1.0, "dma_ms": 0.7},
    {"mbytes": 1024, "nccl_ms": 4.0, "dma_ms": 2.8},
]


def test_shape_summaries_pick_the_fastest_ok_schedule():
    a, b, c = report.shape_summaries(RECORDS)
    assert (a["best_schedule"], a["best_ms"], a["n_ok"], a["n_schedules"]) == ("shard/dma", 1.1, 2, 3)
    assert (b["best_schedule"], c["best_schedule"]) == ("shard/sm", "shard/dma")


def test_realized_overlap_uses_the_fastest_communication_alone():
    a, b, _ = report.shape_summaries(RECORDS)
    assert report.realized_overlap(a) == pytest.approx(0.8)
    assert report.realized_overlap(b) == pytest.approx(0.6)


def test_average_realized_overlap_counts_only_communication_heavy_shapes():
    result = report.average_realized_overlap(report.shape_summaries(RECORDS))
    assert result == {"value": pytest.approx(0.7), "shapes": 2, "undefined": 0}


def test_realized_overlap_is_undefined_without_room_to_overlap():
    (summary,) = report.shape_summaries(_shape("ag_gemm", 9, 1.0, 0.99, 1.2, 1.0, 1.0, {"serial/sm": 1.0}))
    assert report.realized_overlap(summary) is None


def test_async_tp_ratios_split_by_whether_async_tp_beats_serial():
    ratios = report.async_tp_ratios(report.shape_summaries(RECORDS))
    assert ratios["where_async_tp_wins"] == pytest.approx(1.32 / 1.1)
    assert ratios["shapes_where_async_tp_wins"] == 1
    assert ratios["all"] == pytest.approx(
        math.exp((math.log(1.2) + math.log(2.0) + math.log(1.1 / 1.05)) / 3)
    )


def test_bandwidth_summary_reports_big_transfers_and_the_latency_region():
    bw = report.bandwidth_summary(BANDWIDTH)
    expected = [256 * 2**20 / 0.7e-3 / 1e9, 1024 * 2**20 / 2.8e-3 / 1e9]
    assert bw["ce_gbps_big_mean"] == pytest.approx(sum(expected) / 2)
    assert bw["ce_gbps_big_min"] == pytest.approx(min(expected))
    assert bw["latency_dma_over_nccl"] == {1: pytest.approx(2.0), 4: pytest.approx(0.8)}


def test_goals_mark_met_missed_and_unmeasured():
    goals = {g["goal"].split(",")[0]: g for g in report.goals(RECORDS, BANDWIDTH)}
    assert goals["copy-engine all-gather GB/s per direction"]["met"] is True  # ~383 GB/s
    assert goals["average realized overlap"]["met"] is False  # 0.7 < 0.8
    ratio = goals["copy-engine / NCCL all-gather bandwidth"]
    assert ratio["value"] == pytest.approx(1.0 / 0.7) and ratio["met"] is True  # 1.43 >= 1.35 at 2 ranks
    at_four = {g["goal"].split(",")[0]: g for g in report.goals(RECORDS, BANDWIDTH, world_size=4)}
    assert at_four["copy-engine / NCCL all-gather bandwidth"]["target"] == 1.0  # at least NCCL's
    assert at_four["average realized overlap"]["target"] == 0.6
    assert at_four["average realized overlap"]["met"] is True  # 0.7 >= 0.6 at 4 ranks
    empty = report.goals([], [])
    assert all(g["met"] is None and g["value"] is None for g in empty)


def test_render_markdown_lists_goals_bandwidth_shapes_and_failures():
    text = report.render_markdown(RECORDS, BANDWIDTH, {"title": "test", "reps": 20})
    assert text.startswith("# Executor benchmark: test")
    assert "| 1024 | 4 | 2.8 |" in text
    assert (
        "| ag_gemm | 1 | 64 | 32 | - | 1 | 0.6 | 0.4 | 1.5 | 1.1 | shard/dma | 1.32 | 1.36 | 0.8 | 2/3 |"
        in text
    )
    assert "| ag_gemm | 1 | 64 | 32 | finer/dma/s2/chunk |" in text  # the failed schedule is listed


def test_render_markdown_lays_out_the_copy_matrix_by_source_and_destination():
    pairs = [
        {"src": s, "dst": d, "mbytes": 256, "ms": 1.0, "gbps": gb}
        for (s, d), gb in {
            (0, 1): 300.0,
            (1, 0): 250.0,
            (0, 2): 123.0,
            (2, 0): 1.0,
            (1, 2): 2.0,
            (2, 1): 3.0,
        }.items()
    ]
    push = [{"streams_per_peer": 2, "mbytes": 512, "ms": 2.0, "gbps": 268.0}]
    text = report.render_markdown([], [], {}, {"pairs": pairs, "push_all": push})
    assert "| 0 | - | 300 | 123 |" in text  # row = source 0: to 1, to 2
    assert "| 1 | 250 | - | 2 |" in text
    assert "| 2 | 512 | 2 | 268 |" in text
    assert "Copy engines" not in report.render_markdown([], [], {})
