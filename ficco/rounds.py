"""Interleaved rounds: the one loop by which ficco times several cases against each other.

Every timing in the project (the harness's sweep, ``ficco host-factor``, ``runtime.verify_plan`` and the
benchmarks) runs its cases in rounds: each round runs every case once, in an order shuffled anew, so that a
drift of the machine's speed and warm-up land on no case in particular. The order comes from a generator
seeded alike on every rank, so collective cases stay matched across ranks; what one run of a case does
(align the ranks, time a block, reduce over ranks) is the caller's ``run_round``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

Case = TypeVar("Case")


def interleaved_rounds(
    cases: Sequence[Case],
    run_round: Callable[[list[Case]], object],
    *,
    rounds: int,
    seed: int | Sequence[int],
    more_rounds: Callable[[], int] | None = None,
) -> int:
    """Run ``rounds`` rounds of ``cases``, each round ``run_round(order)`` with ``order`` the cases in a new
    shuffled order; the number of rounds run.

    Parameters
    ----------
    cases : sequence
        What is timed (names, keys, indices); an empty sequence runs no round.
    run_round : callable
        Runs one round over ``order`` (a list of the cases), e.g. aligning the ranks and timing each case.
    rounds : int
        Rounds to run (>= 1), or the fewest when ``more_rounds`` is given.
    seed : int or sequence of int
        Seed of ``numpy.random.default_rng``: the same seed gives every rank the same orders.
    more_rounds : callable, optional
        Called once after the first round: the rounds wanted in all (e.g. enough for a target time from
        the first round's times); never fewer than ``rounds`` are run.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be an int >= 1; got {rounds}")
    if not cases:
        return 0
    rng = np.random.default_rng(seed)
    wanted, done = rounds, 0
    while done < wanted:
        run_round([cases[i] for i in rng.permutation(len(cases))])
        done += 1
        if done == 1 and more_rounds is not None:
            wanted = max(rounds, more_rounds())
    return done
