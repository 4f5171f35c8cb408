"""The op table and the MoE routing: one spec per op, shapes that follow the scenario's conventions, and
routings whose totals and imbalance are what the scenario says."""

from __future__ import annotations

import pytest

from ficco.features import MOE_OPS, OP_SPECS, OPS, Routing, Scenario, get_hardware


def _moe(op: str, **kw) -> Scenario:
    base = {"m": 24, "n": 16, "k": 8, "world_size": 4, "experts": 8, "top_k": 2}
    return Scenario(op=op, hardware=get_hardware("h200x8"), **(base | kw))


def test_every_op_has_one_spec_in_scenario_order():
    assert tuple(OP_SPECS) == OPS
    assert all(name == spec.name for name, spec in OP_SPECS.items())
    assert tuple(name for name, spec in OP_SPECS.items() if spec.moe) == MOE_OPS


@pytest.mark.parametrize("op", OPS)
def test_comm_width_is_the_gemm_input_when_the_collective_comes_first(op):
    spec = OP_SPECS[op]
    assert spec.comm_width(3, 5) == (3 if spec.comm_first else 5)
    assert spec.direction == ("gather" if spec.comm_first else "scatter")


def test_dense_shapes_follow_the_scenario_docstring():
    s = Scenario(op="ag_gemm", m=64, n=16, k=8, world_size=4, hardware=get_hardware("h200x8"))
    shapes = OP_SPECS["ag_gemm"].shapes(s)
    assert (shapes.a, shapes.b, shapes.out, shapes.comm) == ((16, 8), (8, 16), (64, 16), (16, 8))
    rs = OP_SPECS["gemm_rs"].shapes(
        Scenario(op="gemm_rs", m=64, n=16, k=8, world_size=4, hardware=s.hardware)
    )
    assert (rs.a, rs.b, rs.out, rs.comm) == ((64, 8), (8, 16), (16, 16), (64, 16))


def test_moe_shapes_are_the_routed_rows_of_the_rank():
    s = _moe("a2a_gemm", imbalance=2.0)
    routing = Routing.for_scenario(s)
    for rank in range(4):
        dispatch = OP_SPECS["a2a_gemm"].shapes(s, rank)
        combine = OP_SPECS["gemm_a2a"].shapes(_moe("gemm_a2a", imbalance=2.0), rank)
        assert dispatch.a == (48, 8) and dispatch.b == (2, 8, 16)
        assert dispatch.out == (sum(routing.received(rank)), 16) == (combine.a[0], 16)
        assert combine.out == (48, 16) and combine.comm == (combine.a[0], 16)
    assert OP_SPECS["a2a_gemm"].shapes(s, 0).out[0] == 2 * 48  # rank 0 takes imbalance x the mean


@pytest.mark.parametrize("imbalance", [1.0, 1.5, 2.5, 4.0])
def test_synthetic_routing_keeps_every_row_and_loads_rank_0_by_the_imbalance(imbalance):
    s = _moe("a2a_gemm", imbalance=imbalance)
    r = Routing.for_scenario(s)
    assert r.world_size == 4 and r.local_experts == 2
    assert all(sum(r.sent(q)) == s.m * s.top_k for q in range(4))
    assert sum(r.received(0)) == pytest.approx(imbalance * s.m * s.top_k, abs=4)
    assert sum(sum(r.expert_rows(q)) for q in range(4)) == 4 * s.m * s.top_k
    loads = [sum(r.received(q)) for q in range(4)]
    assert max(loads) == loads[0] and max(loads[1:]) - min(loads[1:]) <= 4


def test_balanced_routing_sends_equal_blocks():
    r = Routing.synthetic(tokens=24, top_k=2, experts=8, world_size=4)
    assert r.counts == (((6, 6),) * 4,) * 4
    assert r.received(2) == (12, 12, 12, 12) and r.expert_rows(1) == (24, 24)


def test_routing_is_hashable_by_value_and_converts_lists():
    a = Routing([[[1, 2], [3, 0]], [[0, 0], [5, 1]]])
    b = Routing((((1, 2), (3, 0)), ((0, 0), (5, 1))))
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert a.moved == ((3, 3), (0, 6)) and a.sent(1) == (0, 6) and a.received(1) == (3, 6)


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        ([[[1], [1]]], r"shape \[w, w, experts/w\]"),
        ([[[1, 2], [1]], [[1, 1], [1, 1]]], r"shape \[w, w, experts/w\]"),
        ([[[1], [-1]], [[1], [1]]], r"counts\[0\]\[1\]\[0\] must be an int >= 0 \(rows\); got -1"),
        ([[[1], [1.5]], [[1], [1]]], r"got 1.5"),
        (3, r"nested sequence"),
    ],
)
def test_bad_routing_counts_name_what_is_wrong(counts, message):
    with pytest.raises(ValueError, match=message):
        Routing(counts)


def test_synthetic_routing_rejects_impossible_arguments():
    with pytest.raises(ValueError, match=r"imbalance in \[1, 2\]; got 3"):
        Routing.synthetic(tokens=4, top_k=1, experts=2, world_size=2, imbalance=3)
    with pytest.raises(ValueError, match="experts a positive multiple of world_size"):
        Routing.synthetic(tokens=4, top_k=1, experts=3, world_size=2)
