"""benchmarks.studies.gemm_noise's tables: the spread between input draws per shape, two runs side by side."""

from __future__ import annotations

from benchmarks.studies.gemm_noise import SHAPES, by_shape, compare


def _run(scale: float) -> dict:
    medians = {}
    for m, n, k in SHAPES:
        for seed, ms in zip((0, 1), (1.0, 1.01), strict=True):
            medians[f"{m}x{n}x{k}/seed{seed}"] = ms * scale
    return {"seeds": [0, 1], "median_ms": medians}


def test_by_shape_gives_each_draw_and_their_spread():
    rows = by_shape(_run(1.0))
    assert len(rows) == len(SHAPES)
    assert rows[0][1:] == ["1.0000", "1.0100", "1.0100"]


def test_compare_divides_the_second_run_by_the_first_for_each_shape_and_draw():
    first, second = _run(1.0), _run(1.02)
    del second["median_ms"][next(iter(second["median_ms"]))]  # a key only in the first is left out
    rows = compare(first, second)
    assert len(rows) == 2 * len(SHAPES) - 1
    assert {row[-1] for row in rows} == {"1.0200"}
