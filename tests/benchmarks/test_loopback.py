"""benchmarks.support.loopback on the CPU: one process as rank 0 of a pretend world; the copy-engine schedules
see peers that hold zeros, and a second world cannot start inside the first
(``tests/gpu/test_gpu_loopback.py`` runs every schedule on a GPU)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.support.loopback import loopback_world
from ficco import executor


def test_copy_engine_schedules_see_zero_peers_and_the_world_ends_with_the_block():
    gen = torch.Generator().manual_seed(0)
    shard, full, b = (torch.randn(*shape, generator=gen) for shape in ((16, 8), (64, 8), (8, 8)))
    with loopback_world(4, "cpu"):
        for schedule in ("serial/dma", "finer/dma/s4/chunk/hp"):
            gathered = torch.cat([shard, torch.zeros(48, 8)])
            torch.testing.assert_close(executor.all_gather_matmul(shard, b, schedule), gathered @ b)
            torch.testing.assert_close(executor.matmul_reduce_scatter(full, b, schedule), (full @ b)[:16])
        assert executor.all_gather_matmul(shard, b, "shard/sm/hp").shape == (64, 8)
        with pytest.raises(ValueError, match="needs no process group initialised"), loopback_world(2, "cpu"):
            pass
    assert not torch.distributed.is_initialized()
