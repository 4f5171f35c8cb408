"""Schedule: canonical strings, validation, candidates (example-based and property-based)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ficco.features import (
    SCHEDULE_FAMILIES,
    SERIAL,
    Scenario,
    Schedule,
    all_schedules,
    candidates,
    get_hardware,
)
from ficco.features.schedule import FINER_SPLITS


def test_all_schedules_are_distinct_and_serial_first():
    names = [str(s) for s in all_schedules()]
    assert len(names) == len(set(names)) == 30
    assert names[:2] == ["serial/sm", "serial/dma"]


@pytest.mark.parametrize(
    "text",
    [
        "serial/sm",
        "serial/dma",
        "shard/dma",
        "shard/sm/hp",
        "finer/dma/s4/chunk/hp",
        "finer/sm/s8/shard",
    ],
)
def test_parse_prints_back_exactly(text):
    assert str(Schedule.parse(text)) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ring/sm", "Schedule.granularity must be one of ['serial', 'shard', 'finer']; got 'ring'"),
        ("shard/tma", "Schedule.executor must be one of ['sm', 'dma']; got 'tma'"),
        ("finer/dma/s3/chunk", "Schedule.splits must be one of [2, 4, 8]; got 3"),
        ("finer/dma/s4/whole", "Schedule.grain must be one of ['chunk', 'shard']; got 'whole'"),
        ("serial/sm/hp", "Schedule.priority must be 'normal' for granularity 'serial'"),
        ("shard/dma/s2", "unexpected fields ['s2']"),
        ("finer/dma/x4/chunk", "bad splits field 'x4'"),
        ("finer/dma", "not enough values"),
        ("", "not enough values"),
        ("finer/dma/s04/chunk", "not canonical, write 'finer/dma/s4/chunk'"),
        ("shard/sm/cta8", "unexpected fields ['cta8']"),  # the resource knobs were measured and left
        ("finer/dma/s4/chunk/carve16/hp", "too many values"),
        ("shard/sm/hp/hp", "unexpected fields ['hp']"),
    ],
)
def test_parse_rejects_unknown_schedule_with_allowed_forms(text, message):
    with pytest.raises(ValueError) as err:
        Schedule.parse(text)
    assert message in str(err.value)
    assert f"unknown schedule {text!r}" in str(err.value)


def test_parse_rejects_non_string():
    with pytest.raises(ValueError, match="a schedule must be a string"):
        Schedule.parse(4)


def test_direct_construction_errors_name_field():
    with pytest.raises(ValueError, match=r"Schedule\.splits must be 1 for granularity 'shard'"):
        Schedule(granularity="shard", splits=2)
    with pytest.raises(
        ValueError, match=r"Schedule\.priority must be one of \['normal', 'high'\]; got 'max'"
    ):
        Schedule(granularity="shard", priority="max")


def test_default_grain_follows_granularity():
    assert Schedule().grain == "whole"
    assert Schedule(granularity="shard").grain == "shard"
    assert Schedule(granularity="finer", splits=2).grain == "chunk"


def test_json_round_trip():
    for s in all_schedules():
        assert Schedule.from_json(s.to_json()) == s


def test_candidates_respect_divisibility():
    # 2 ranks x 4 splits divide 8 rows; 2 x 8 = 16 do not.
    names = {str(s) for s in candidates(Scenario(m=8, n=64, k=64))}
    assert "finer/dma/s4/chunk" in names
    assert not any("/s8/" in n for n in names)
    # m/world_size odd: no finer schedule at all, but serial and shard stay.
    names = {str(s) for s in candidates(Scenario(m=6, n=64, k=64))}
    assert names == {"serial/sm", "serial/dma", "shard/sm", "shard/sm/hp", "shard/dma", "shard/dma/hp"}


def test_check_names_schedule_scenario_and_divisor():
    with pytest.raises(ValueError, match=r"finer/dma/s8/chunk needs the split rows \(12\) .* = 16"):
        Schedule.parse("finer/dma/s8/chunk").check(Scenario(m=12, n=64, k=64))


_schedule = st.sampled_from(all_schedules())


@given(_schedule)
def test_property_string_round_trip(schedule):
    assert Schedule.parse(str(schedule)) == schedule


@given(st.text(alphabet="serialhdfnmpcuktv/0123456789", max_size=32))
def test_property_parse_either_round_trips_or_raises_value_error(text):
    try:
        schedule = Schedule.parse(text)
    except ValueError:
        return
    assert str(schedule) == text


@st.composite
def scenarios(draw):
    op = draw(st.sampled_from(["ag_gemm", "gemm_rs", "a2a_gemm", "gemm_a2a"]))
    world = draw(st.sampled_from([2, 4, 8]))
    hw = get_hardware(f"h200x{world}")
    if op in ("a2a_gemm", "gemm_a2a"):
        experts = world * draw(st.integers(1, 8))
        top_k = draw(st.integers(1, experts))
        m = world * draw(st.integers(1, 512))
        extra = {"experts": experts, "top_k": top_k, "imbalance": draw(st.floats(1.0, float(world)))}
    else:
        m, extra = world * draw(st.integers(1, 4096)), {}
    n, k = draw(st.integers(1, 8192)), draw(st.integers(1, 8192))
    return Scenario(op=op, m=m, n=n, k=k, world_size=world, hardware=hw, **extra)


@given(scenarios())
def test_property_candidates_are_exactly_the_runnable_schedules(scenario):
    got = candidates(scenario)
    assert got[0] == SERIAL
    for schedule in all_schedules():
        pieces = scenario.world_size * schedule.splits
        runnable = scenario.rows % pieces == 0
        assert (schedule in got) == runnable
        if runnable:
            schedule.check(scenario)
    # serial and shard-level always run: the scenario itself guarantees rows % world_size == 0.
    assert sum(s.granularity != "finer" for s in got) == 6
    assert all(s.splits in (1, *FINER_SPLITS) for s in got)


def test_family_is_granularity_and_executor_and_every_family_is_listed():
    assert Schedule.parse("finer/dma/s4/chunk/hp").family == "finer/dma"
    assert SCHEDULE_FAMILIES == ("serial/sm", "serial/dma", "shard/sm", "shard/dma", "finer/sm", "finer/dma")
    assert {s.family for s in all_schedules()} == set(SCHEDULE_FAMILIES)
