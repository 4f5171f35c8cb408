"""The step-timing settings of the tools that time a point's variants with
``runtime.timing.time_interleaved`` (interleaved rounds of steps): one dataclass, whose fields are the
tools' options (``ficco.dataclass_options``)."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Any

from ficco.dataclass_options import add_arguments, from_arguments, option


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTiming:
    """How ``time_interleaved`` times a point's variants; each tool gives its own defaults."""

    warmup: int = option(3, "untimed steps per variant and point", min=1)
    rounds: int = option(5, "interleaved rounds per point (at least)", min=1)
    reps: int = option(4, "timed steps per variant and round", min=1)
    timed_ms: float = option(
        300.0,
        "short steps get more rounds, until every variant is timed for about this many ms (0: --rounds)",
        min=0.0,
    )
    max_rounds: int = option(40, "the most rounds a point gets", min=1)

    def __post_init__(self) -> None:
        if self.max_rounds < self.rounds:
            raise ValueError(f"StepTiming.max_rounds must be >= rounds={self.rounds}; got {self.max_rounds}")


def add_step_timing(p: argparse.ArgumentParser, **defaults: Any) -> None:
    """Add the :class:`StepTiming` options to ``p`` with these defaults (:func:`timing_settings` reads
    them back)."""
    add_arguments(p, StepTiming, **defaults)


def timing_settings(args: argparse.Namespace, p: argparse.ArgumentParser) -> dict[str, Any]:
    """``time_interleaved``'s settings from the options of :func:`add_step_timing`; a value out of range
    stops through ``p.error``."""
    return asdict(from_arguments(StepTiming, args, p))
