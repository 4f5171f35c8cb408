"""The step-timing options of the tools that time a point's variants with ``runtime.timing.time_interleaved``
(interleaved rounds of steps), their checks, and the settings they give it."""

from __future__ import annotations

import argparse
from typing import Any


def add_step_timing(
    p: argparse.ArgumentParser, *, warmup: int, rounds: int, reps: int, timed_ms: float, max_rounds: int
) -> None:
    """Add the options of ``runtime.timing.time_interleaved`` (a point's variants timed in interleaved
    rounds of steps) to ``p``, with these defaults; :func:`timing_settings` reads them back."""
    p.add_argument("--warmup", type=int, default=warmup, help="untimed steps per variant and point")
    p.add_argument("--rounds", type=int, default=rounds, help="interleaved rounds per point (at least)")
    p.add_argument("--reps", type=int, default=reps, help="timed steps per variant and round")
    p.add_argument(
        "--timed-ms",
        type=float,
        default=timed_ms,
        help="short steps get more rounds, until every variant is timed for about this many ms (0: --rounds)",
    )
    p.add_argument("--max-rounds", type=int, default=max_rounds, help="the most rounds a point gets")


def check_step_timing(p: argparse.ArgumentParser, args: argparse.Namespace, *at_least_one: str) -> None:
    """Stop through ``p.error`` on step-timing options out of range (and on ``at_least_one``'s other
    options below 1)."""
    for name in ("warmup", "rounds", "reps", *at_least_one):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1; got {getattr(args, name)}")
    if args.max_rounds < args.rounds:
        p.error(f"--max-rounds must be >= --rounds ({args.rounds}); got {args.max_rounds}")
    if args.timed_ms < 0:
        p.error(f"--timed-ms must be >= 0; got {args.timed_ms}")


def timing_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``time_interleaved``'s settings for a point's variants, from the options of :func:`add_step_timing`."""
    return {
        "warmup": args.warmup,
        "rounds": args.rounds,
        "reps": args.reps,
        "timed_ms": args.timed_ms,
        "max_rounds": args.max_rounds,
    }
