"""The candidate fixes for eager overlap (``benchmarks/restricted_planner.py``): each restriction's
schedule for a pick, and a planner that switches between them from one call to the next."""

from __future__ import annotations

import pytest

from benchmarks.restricted_planner import RESTRICTIONS, RestrictedPlanner, Restriction
from ficco.features import SERIAL, Schedule
from ficco.runtime import FixedSource
from ficco.runtime.overlap import request_pair

PICK = Schedule.parse("finer/dma/s4/shard/hp")


@pytest.mark.parametrize(
    ("restriction", "direction", "predicted", "want"),
    [
        (Restriction(), "bwd-input", 1.2, "finer/dma/s4/shard/hp"),
        (Restriction(all_serial=True), "fwd", 1.5, "serial/sm"),
        (Restriction(backward="serial"), "fwd", 1.2, "finer/dma/s4/shard/hp"),
        (Restriction(backward="serial"), "bwd-input", 1.2, "serial/sm"),
        (Restriction(transport="sm"), "fwd", 1.2, "finer/sm/s4/shard/hp"),
        (Restriction(min_gain=0.05), "fwd", 1.04, "serial/sm"),
        (Restriction(min_gain=0.05), "fwd", None, "serial/sm"),
        (Restriction(min_gain=0.05), "fwd", 1.06, "finer/dma/s4/shard/hp"),
    ],
)
def test_each_restriction_maps_a_pick(restriction, direction, predicted, want):
    assert str(restriction.apply(direction, PICK, predicted)) == want
    assert restriction.apply(direction, SERIAL, predicted) == SERIAL


def test_the_planner_switches_restriction_between_calls():
    planner = RestrictedPlanner(FixedSource("shard/dma"))
    fwd, bwd = request_pair("ag_gemm", m=4096, n=512, k=1024, dtype="bf16", world_size=2, layer="l")
    planner.prepare([fwd, bwd])
    assert [str(planner.schedule(r)) for r in (fwd, bwd)] == ["shard/dma", "shard/dma"]
    planner.use("bwd_serial")
    assert [str(planner.schedule(r)) for r in (fwd, bwd)] == ["shard/dma", "serial/sm"]
    planner.use("sm_only")
    assert [str(planner.schedule(r)) for r in (fwd, bwd)] == ["shard/sm", "shard/sm"]
    planner.use("planned")
    assert str(planner.schedule(bwd)) == "shard/dma"
    planner.override({planner.key(fwd): SERIAL})  # runtime.verify's trials still apply
    assert planner.schedule(fwd) == SERIAL
    with pytest.raises(ValueError, match="restriction must be one of"):
        planner.use("nope")
    assert set(RESTRICTIONS) == {"planned", "all_serial", "bwd_serial", "sm_only", "min_gain_5"}
