"""Estimator plumbing in the scikit-learn manner: declared parameter constraints and the fitted check.

Each estimator declares ``_parameter_constraints`` once, ``{name: [constraint, ...]}``; a value is valid
when any constraint accepts it, and the error message is generated from the declaration, e.g.
``The 'max_depth' parameter of ScheduleClassifier must be an int in the range [1, 16]. Got 0 instead.``
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, Literal


class NotFittedError(ValueError, AttributeError):
    """Raised when an estimator is used before ``fit`` (a ValueError and an AttributeError, as in sklearn)."""


@dataclass(frozen=True, slots=True)
class Interval:
    """Numbers of one kind (``int`` or ``float``) between ``lo`` and ``hi`` (``None``: unbounded)."""

    kind: Literal["int", "float"]
    lo: float | None
    hi: float | None
    closed: Literal["both", "left", "right", "neither"] = "both"

    def accepts(self, value: Any) -> bool:
        if isinstance(value, bool):
            return False
        if self.kind == "int" and not isinstance(value, Integral):
            return False
        if not isinstance(value, Real) or math.isnan(value):
            return False
        lo_ok = self.lo is None or (value >= self.lo if self.closed in ("both", "left") else value > self.lo)
        hi_ok = self.hi is None or (value <= self.hi if self.closed in ("both", "right") else value < self.hi)
        return lo_ok and hi_ok

    def __str__(self) -> str:
        left = "[" if self.closed in ("both", "left") and self.lo is not None else "("
        right = "]" if self.closed in ("both", "right") and self.hi is not None else ")"
        lo = "-inf" if self.lo is None else f"{self.lo:g}"
        hi = "inf" if self.hi is None else f"{self.hi:g}"
        return f"{'an int' if self.kind == 'int' else 'a float'} in the range {left}{lo}, {hi}{right}"


@dataclass(frozen=True, slots=True)
class Options:
    """One of a closed set of values."""

    values: tuple[Any, ...]

    def accepts(self, value: Any) -> bool:
        return value in self.values

    def __str__(self) -> str:
        return f"one of {list(self.values)}"


def validate_params(estimator: Any) -> None:
    """Raise ``ValueError`` for the first parameter of ``estimator`` that no declared constraint accepts."""
    for name, constraints in type(estimator)._parameter_constraints.items():
        value = getattr(estimator, name)
        if not any(c.accepts(value) for c in constraints):
            allowed = " or ".join(str(c) for c in constraints)
            raise ValueError(
                f"The {name!r} parameter of {type(estimator).__name__} must be {allowed}. "
                f"Got {value!r} instead."
            )


def check_is_fitted(estimator: Any) -> None:
    """Raise :class:`NotFittedError` unless ``estimator`` holds learned state (``booster_``)."""
    if getattr(estimator, "booster_", None) is None:
        raise NotFittedError(
            f"This {type(estimator).__name__} instance is not fitted yet. Call 'fit' with appropriate "
            "arguments before using this estimator."
        )
