"""features.ScheduleTable: the token-range tables the ficco ops take as their schedule."""

from __future__ import annotations

import pytest

from ficco.features import Schedule, ScheduleTable, parse_schedule_table


def test_table_picks_the_entry_of_each_row_count():
    table = parse_schedule_table("0:serial/sm;1024:shard/dma;8192:finer/dma/s4/chunk")
    assert [str(table.at(m)) for m in (0, 1023, 1024, 8191, 8192, 10**7)] == [
        "serial/sm",
        "serial/sm",
        "shard/dma",
        "shard/dma",
        "finer/dma/s4/chunk",
        "finer/dma/s4/chunk",
    ]
    assert str(table) == "0:serial/sm;1024:shard/dma;8192:finer/dma/s4/chunk"


def test_a_plain_schedule_is_a_table_of_one_entry():
    table = parse_schedule_table("shard/sm/hp")
    assert table == ScheduleTable(bounds=(0,), schedules=(Schedule.parse("shard/sm/hp"),))
    assert str(table) == "shard/sm/hp" and str(table.at(12345)) == "shard/sm/hp"
    assert parse_schedule_table("shard/sm/hp") is table  # parsed once


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("16:serial/sm", r"bounds must start at 0 and increase strictly; got \[16\]"),
        ("0:serial/sm;64:shard/sm;64:shard/dma", r"got \[0, 64, 64\]"),
        ("0:serial/sm;x:shard/sm", "bad entry 'x:shard/sm'"),
        ("0:serial/sm;64:shard/nccl", "unknown schedule 'shard/nccl'"),
        ("", "must be a non-empty string"),
    ],
)
def test_bad_tables_are_refused_naming_the_entry(text, message):
    with pytest.raises(ValueError, match=message):
        parse_schedule_table(text)


def test_one_breakpoint_rule_for_every_token_range_table():
    from ficco.features.schedule import range_starts

    points, picks = [64, 128, 256, 512, 1024], ["a", "a", "b", "b", "a"]
    firsts, starts = range_starts(points, picks)
    assert firsts == [0, 2, 4] and starts == [64, 181, 724]  # geometric means of 128, 256 and 512, 1024
    assert range_starts([2, 3], ["a", "b"]) == ([0, 1], [2, 3])  # always above the point before
    for m, pick in zip(points, picks, strict=True):  # every decided point keeps its own pick
        assert picks[firsts[max(i for i, s in enumerate(starts) if s <= m)]] == pick


def test_max_splits_is_the_largest_finer_split_that_divides_the_rows():
    from ficco.features.schedule import max_splits

    assert [max_splits(rows, 2) for rows in (2, 4, 8, 16, 32, 48, 6)] == [1, 2, 4, 8, 8, 8, 1]
    assert max_splits(24, 3) == 8 and max_splits(12, 3) == 4
