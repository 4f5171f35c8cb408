"""Linux cpulists, read and written (``ficco.cpulists``)."""

import pytest

from ficco.cpulists import format_cpulist, parse_cpulist


def test_parse_cpulist_ranges_and_singles():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("5") == [5]


@pytest.mark.parametrize("text", ["a-3", "4-2", "1-x"])
def test_parse_cpulist_names_the_bad_entry(text):
    with pytest.raises(ValueError, match="cpulist"):
        parse_cpulist(text)


def test_format_cpulist_writes_runs_as_ranges_and_reads_back():
    cpus = [0, 1, 2, 3, 8, 10, 11]
    assert format_cpulist(cpus) == "0-3,8,10-11" and parse_cpulist(format_cpulist(cpus)) == cpus
    assert format_cpulist({5}) == "5" and format_cpulist([]) == ""
