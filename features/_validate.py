"""Field checks shared by the vocabulary dataclasses.

Every check raises ``ValueError`` whose message names the owner and field, the bad value and
what is allowed, e.g. ``Scenario.world_size must be an int in [2, 8]; got 12``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any


def check_choice(owner: str, field: str, value: Any, allowed: Collection[Any]) -> None:
    """Raise unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{owner}.{field} must be one of {list(allowed)}; got {value!r}")


def check_int(owner: str, field: str, value: Any, lo: int = 1, hi: int | None = None) -> None:
    """Raise unless ``value`` is an int (not a bool) in ``[lo, hi]`` (``hi=None``: no upper bound)."""
    ok = (
        isinstance(value, int) and not isinstance(value, bool) and value >= lo and (hi is None or value <= hi)
    )
    if not ok:
        if hi is None:
            what = "a positive int" if lo == 1 else f"an int >= {lo}"
        else:
            what = f"an int in [{lo}, {hi}]"
        raise ValueError(f"{owner}.{field} must be {what}; got {value!r}")


def check_float(owner: str, field: str, value: Any, lo: float, hi: float | None = None) -> None:
    """Raise unless ``value`` is a finite real number in ``[lo, hi]``."""
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and value == value  # not NaN
        and value >= lo
        and (hi is None or value <= hi)
    )
    if not ok:
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{owner}.{field} must be a number {rng}; got {value!r}")


def check_keys(owner: str, data: dict, allowed: Iterable[str]) -> None:
    """Raise if ``data`` (a parsed JSON object) holds a key that ``owner`` does not have."""
    allowed = sorted(allowed)
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ValueError(f"{owner} has no field(s) {unknown}; allowed fields are {allowed}")
