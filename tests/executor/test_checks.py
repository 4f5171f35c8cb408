"""Argument checks: each bad input gives a ValueError naming the tensor, its shape and what was expected."""

from __future__ import annotations

import pytest
import torch

from ficco.executor.checks import (
    as_schedule,
    call_key,
    check_all_gather_matmul,
    check_matmul_reduce_scatter,
    check_matrix,
)
from ficco.features import Routing, Schedule

FINER = Schedule.parse("finer/dma/s4/chunk")


def test_as_schedule_accepts_objects_and_strings():
    assert as_schedule(FINER) is FINER
    assert as_schedule("shard/sm/hp") == Schedule(granularity="shard", executor="sm", priority="high")


def test_as_schedule_rejects_other_types_and_bad_strings():
    with pytest.raises(ValueError, match="got int"):
        as_schedule(3)
    with pytest.raises(ValueError, match="finer/dma/s5/chunk"):
        as_schedule("finer/dma/s5/chunk")


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        ([[1.0]], "a_shard must be a torch.Tensor of shape [m/world_size, k]; got list"),
        (torch.zeros(2, 3, 4), "a_shard has shape [2, 3, 4]; expected a 2-D tensor [m/world_size, k]"),
        (torch.zeros(2, 3, dtype=torch.int32), "a_shard has dtype torch.int32; expected one of"),
    ],
)
def test_check_matrix_names_the_tensor_and_shape(tensor, message):
    with pytest.raises(ValueError) as err:
        check_matrix("a_shard", tensor, "[m/world_size, k]")
    assert message in str(err.value)


def test_check_all_gather_matmul_accepts_matching_inputs():
    check_all_gather_matmul(torch.zeros(8, 4), torch.zeros(4, 6), FINER, 2, torch.zeros(16, 6))


@pytest.mark.parametrize(
    ("a_shard", "b", "out", "world_size", "message"),
    [
        (torch.zeros(8, 4), torch.zeros(5, 6), None, 2, "b has shape [5, 6]; expected [k, n] = [4, n]"),
        (
            torch.zeros(6, 4),
            torch.zeros(4, 6),
            None,
            2,
            "a_shard has shape [6, 4]; schedule finer/dma/s4/chunk",
        ),
        (
            torch.zeros(8, 4),
            torch.zeros(4, 6),
            torch.zeros(8, 6),
            2,
            "out has shape [8, 6]; expected [m, n] = [16, 6]",
        ),
        (torch.zeros(8, 4), torch.zeros(4, 6, dtype=torch.float16), None, 2, "b has dtype torch.float16"),
        (torch.zeros(8, 4), torch.zeros(4, 6), None, 1, "at least 2 ranks; got world_size=1"),
    ],
)
def test_check_all_gather_matmul_rejects_mismatches(a_shard, b, out, world_size, message):
    with pytest.raises(ValueError) as err:
        check_all_gather_matmul(a_shard, b, FINER, world_size, out)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("a", "out", "message"),
    [
        (
            torch.zeros(12, 4),
            None,
            "a has shape [12, 4]; schedule finer/dma/s4/chunk needs [m, k] with m a positive",
        ),
        (
            torch.zeros(16, 4),
            torch.zeros(16, 6),
            "out has shape [16, 6]; expected [m/world_size, n] = [8, 6]",
        ),
        (torch.zeros(0, 4), None, "a has shape [0, 4]"),
    ],
)
def test_check_matmul_reduce_scatter_rejects_mismatches(a, out, message):
    with pytest.raises(ValueError) as err:
        check_matmul_reduce_scatter(a, torch.zeros(4, 6), FINER, 2, out)
    assert message in str(err.value)


def test_a_calls_key_holds_a_moe_ops_routing_and_none_stands_for_what_only_the_checks_explain():
    x, b = torch.ones(4, 2), torch.ones(1, 2, 3)
    routing = Routing([[[1], [1]], [[1], [1]]])
    serial = as_schedule("serial/sm")
    dense = call_key("ag_gemm", x, torch.ones(2, 3), None, serial, None)
    assert dense is not None and call_key("ag_gemm", x, torch.ones(2, 3), None, serial, None) == dense
    routed = call_key("a2a_gemm", x, b, None, serial, None, routing)
    assert routed[-1] is routing and routed != call_key(
        "a2a_gemm", x, b, None, serial, None, Routing([[[2], [0]], [[1], [1]]])
    )
    assert call_key("a2a_gemm", x, b, None, serial, None, [[[1], [1]], [[1], [1]]]) is None  # not a Routing
    assert call_key("ag_gemm", [[1.0]], b, None, serial, None) is None
