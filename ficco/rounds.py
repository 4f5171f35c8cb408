"""Interleaved rounds: the one loop by which ficco times several cases against each other.

Each round runs every case once in an order shuffled anew (alike on every rank), so that drift and warm-up
land on no case in particular (docs/protocol.md); what one run of a case does is the caller's ``run_round``.
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
    """Run ``rounds`` (>= 1) rounds of ``cases``, each ``run_round(order)`` with ``order`` a list of the cases
    in a new shuffled order (``numpy.random.default_rng(seed)``: the same seed, the same orders on every
    rank); return the number run (0 for no cases). ``more_rounds``, called once after the first round, gives
    the rounds wanted in all (never fewer than ``rounds``)."""
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
