"""The batched layouts' cost model (``executor.layout``): one sequence runs whole, a serial plan PyTorch's own
path, an overlapped one the cheaper layout (few rows per sequence: rank-major, the weight read once; many:
segmented, no copy), a forced layout for measurements and tests, and the extra GPU time the planner
prices."""

from __future__ import annotations

import pytest

from ficco.executor.layout import (
    OVERLAPPED_LAYOUTS,
    Rates,
    batch_extra_us,
    choose,
    forced,
    gemm_us,
    layout_us,
    segment_sizes,
)
from ficco.executor.plan import make_plan
from ficco.features import SERIAL, Schedule, get_hardware

H200 = "NVIDIA H200"
SHARD = make_plan("gather", 2, "shard", 1, "whole")


def test_segments_split_units_at_sequences():
    # shards of 8 rows, 2 sequences of 4: rows [2, 10) lie in (shard 0, seq 0), (0, 1), (1, 0)
    assert segment_sizes(2, 10, 8, 2) == [2, 4, 2]
    assert segment_sizes(0, 16, 8, 1) == [8, 8]


def test_one_sequence_runs_whole_and_a_serial_plan_permuted():
    assert choose(SHARD, 1024, 1, (4096,), 8192, 2, H200) == "whole"
    serial = make_plan("gather", 2, "serial", 1, "whole")
    assert choose(serial, 1024, 2, (4096,), 8192, 2, H200) == "permuted"


def test_few_rows_per_sequence_go_rank_major_and_many_segmented():
    """70B q/k/v at 2 ranks and 2 sequences: 64 tokens are 16 rows per rank and sequence, weight-bound; 32k
    tokens are 8192, compute-bound (a copy of the outputs then costs more than the weight read it saves)."""
    ns, k = (4096, 512, 512), 8192
    assert choose(SHARD, 32, 2, ns, k, 2, H200) == "rank_major"
    assert choose(SHARD, 16384, 2, ns, k, 2, H200) == "segmented"
    rates = Rates.of(get_hardware("h200x2"), 2)
    small = {name: layout_us(name, SHARD, shard_rows=32, batch=2, ns=ns, k=k, itemsize=2, rates=rates)
             for name in OVERLAPPED_LAYOUTS}  # fmt: skip
    assert small["segmented"] > 1.5 * small["rank_major"]  # a weight read per segment


def test_a_forced_layout_wins_until_the_block_ends():
    with forced("segmented"):
        assert choose(SHARD, 32, 2, (4096,), 8192, 2, H200) == "segmented"
        with forced("rank_major"):
            assert choose(SHARD, 16384, 2, (4096,), 8192, 2, H200) == "rank_major"
    assert choose(SHARD, 32, 2, (4096,), 8192, 2, H200) == "rank_major"
    with pytest.raises(ValueError, match="layout must be one of"), forced("permuted"):
        pass


def test_the_extra_gpu_time_of_a_batched_call():
    hw = get_hardware("h200x2")
    shape = {"m": 256, "n": 8192, "k": 4096, "world_size": 2, "itemsize": 2, "hardware": hw}
    assert batch_extra_us("ag_gemm", Schedule.parse("shard/dma"), batch=1, **shape) == 0.0
    serial = batch_extra_us("ag_gemm", SERIAL, batch=2, **shape)
    copy_a = 2 * 256 * 4096 * 2 / Rates.of(hw, 2).bytes_per_us  # PyTorch's copy of the gathered input
    assert serial == pytest.approx(copy_a + Rates.of(hw, 2).floor_us)
    overlapped = batch_extra_us("gemm_rs", Schedule.parse("finer/dma/s4/chunk"), batch=2, **shape)
    assert overlapped > 0
    # the GEMM of a big call is compute-bound: segments cost (almost) nothing beyond their floors
    big = {**shape, "m": 65536}
    extra = batch_extra_us("gemm_rs", Schedule.parse("shard/dma"), batch=2, **big)
    assert extra < 0.02 * gemm_us(65536, 8192, 4096, 2, Rates.of(hw, 2))
