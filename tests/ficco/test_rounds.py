"""ficco.rounds.interleaved_rounds: every case once per round, a new order each round, the same orders for the
same seed, and more rounds when the first asks for them."""

import pytest

from ficco.rounds import interleaved_rounds


def _orders(seed, rounds=4, more=None):
    seen: list[list[str]] = []
    done = interleaved_rounds(list("abcde"), seen.append, rounds=rounds, seed=seed, more_rounds=more)
    return done, seen


def test_every_round_runs_every_case_once_in_a_new_order():
    done, seen = _orders(0, rounds=6)
    assert done == 6 and all(sorted(order) == list("abcde") for order in seen)
    assert len({tuple(order) for order in seen}) > 1


def test_the_same_seed_gives_every_rank_the_same_orders():
    assert _orders([3, 10]) == _orders([3, 10])
    assert _orders(1)[1] != _orders(2)[1]


def test_more_rounds_is_asked_once_after_the_first_and_never_cuts_below_rounds():
    asked = []
    done, _ = _orders(0, rounds=3, more=lambda: asked.append(1) or 7)
    assert done == 7 and asked == [1]
    assert _orders(0, rounds=3, more=lambda: 1)[0] == 3


def test_no_cases_run_no_round_and_bad_rounds_are_named():
    assert interleaved_rounds([], lambda order: pytest.fail("ran"), rounds=3, seed=0) == 0
    with pytest.raises(ValueError, match="rounds must be an int >= 1; got 0"):
        interleaved_rounds(["a"], print, rounds=0, seed=0)
