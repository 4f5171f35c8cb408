"""The end-to-end runtimes benchmark's arithmetic (``benchmarks/runtimes.py``): each variant against its
like-for-like baseline, the overlap limit, the realized share of it, and the done-when, from a results
JSON's points. No torch: the results page (``ficco results``) renders it from the committed JSON too.

A point (one model, phase and token count) holds ``step_ms[variant]`` (median step time, slowest rank,
None where the variant did not run) for the variants of :data:`VARIANTS` and the eager diagnoses
(``ficco_eager:<restriction>``). Each variant is compared with the baseline that differs from it only in
how the collectives run (:data:`BASELINES`):

- ``ficco_eager`` (and every ``ficco_eager:*``) with ``serial``: PyTorch's eager DTensor styles;
- ``ficco_compile`` and ``async_tp`` with ``serial_compile``: the same model compiled per block without the
  micro-pipeline pass and without ficco's;
- ``no_comm`` is ``serial_compile`` with its collectives removed (``benchmarks/no_comm.py``): the limit
  any overlap can reach. ``serial_compile - no_comm`` is the saving available; a variant's realized share
  is ``(serial_compile - t) / (serial_compile - no_comm)``; the limit share of a point is that saving over
  ``serial_compile``.

Older results (before the compiled baseline and the limit were measured) have only ``serial``,
``async_tp``, ``ficco_eager``, ``ficco_compile`` and ``vllm_rule``: what needs the missing variants shows
``-``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ficco.tables import markdown_table

VARIANTS: tuple[str, ...] = (
    "serial",
    "ficco_eager",
    "serial_compile",
    "async_tp",
    "ficco_compile",
    "no_comm",
    "vllm_rule",
)
"""The ``step_ms`` keys of a point (besides the eager diagnoses)."""
BASELINES: dict[str, str] = {
    "ficco_eager": "serial",
    "async_tp": "serial_compile",
    "ficco_compile": "serial_compile",
    "no_comm": "serial_compile",
    "vllm_rule": "serial_compile",
}
"""Variant -> the variant it is compared with; an eager diagnosis ``ficco_eager:<name>`` has ``serial``."""
LABELS: dict[str, str] = {
    "serial": "eager serial",
    "ficco_eager": "ficco eager",
    "serial_compile": "serial compile",
    "async_tp": "async-TP",
    "ficco_compile": "ficco compile",
    "no_comm": "no communication",
    "vllm_rule": "vLLM's rule",
}
COMM_HEAVY = 0.15
"""The done-when's stricter goals hold over the points whose limit share reaches this."""
GOALS: dict[str, float] = {
    "eager_vs_serial_min": 0.98,
    "compile_vs_serial_compile_min": 0.98,
    "compile_vs_async_tp_min": 1.0,
    "compile_vs_async_tp_heavy": 1.05,
    "realized_share_heavy": 0.5,
}
"""Done when (issue 48): at every point ficco eager >= 0.98x eager serial, ficco compile >= 0.98x serial
compile and >= 1.0x async-TP; over the communication-heavy points ficco compile >= 1.05x async-TP (geomean)
and realizes >= 50% of ``serial_compile - no_comm`` (mean)."""
TOLERANCE = {"fp32": 1e-5, "bf16": 2e-2}
"""Largest relative error of a variant's output and gradients against ``serial``: fp32 as the parallel
styles' tests (``tests/runtime/test_tp.py``), bf16 as the GPU tests of the ops and the compile pass."""
CHECKED: tuple[str, ...] = ("ficco_eager", "ficco_compile")
"""The variants whose outputs and gradients must equal serial's for the done-when."""


def baseline(variant: str) -> str | None:
    """The variant ``variant`` is compared with (:data:`BASELINES`), None for a baseline itself."""
    return BASELINES.get(variant.split(":", 1)[0])


def _ms(point: dict, variant: str) -> float | None:
    value = point["step_ms"].get(variant)
    return value if value else None


def speedup(point: dict, variant: str, over: str | None = None) -> float | None:
    """``t(over) / t(variant)`` at ``point`` (``over``: the variant's baseline); None where one is missing."""
    other = over or baseline(variant)
    mine, theirs = _ms(point, variant), _ms(point, other) if other else None
    return theirs / mine if mine and theirs else None


def limit_ms(point: dict) -> float | None:
    """The saving any overlap could reach, ``serial_compile - no_comm`` (ms); None unless both ran."""
    full, bare = _ms(point, "serial_compile"), _ms(point, "no_comm")
    return full - bare if full and bare else None


def limit_share(point: dict) -> float | None:
    """The limit over the ``serial_compile`` step: how much of the compiled step communication costs."""
    limit = limit_ms(point)
    return None if limit is None else max(0.0, limit) / point["step_ms"]["serial_compile"]


def realized(point: dict, variant: str) -> float | None:
    """The share of the limit ``variant`` realizes, ``(serial_compile - t) / (serial_compile - no_comm)``;
    None where the limit is not measured or not positive."""
    limit, mine = limit_ms(point), _ms(point, variant)
    if limit is None or limit <= 0 or not mine:
        return None
    return (point["step_ms"]["serial_compile"] - mine) / limit


def gmean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _present(values: list[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def heavy(points: list[dict]) -> list[dict]:
    """The points whose limit share reaches :data:`COMM_HEAVY`."""
    return [p for p in points if (limit_share(p) or 0.0) >= COMM_HEAVY]


def summarize(points: list[dict], dtype_name: str, *, loopback: bool = False) -> dict[str, Any]:
    """The done-when numbers (:data:`GOALS`) and whether each is met (None where nothing measured it, and
    on a loopback world), the worst speedup of each variant over its baseline, and whether every checked
    variant gave serial's outputs and gradients."""
    comm = heavy(points)

    def worst(variant: str, over: str | None = None) -> float | None:
        return min(_present([speedup(p, variant, over) for p in points]), default=None)

    goals = {
        "eager_vs_serial_min": worst("ficco_eager"),
        "compile_vs_serial_compile_min": worst("ficco_compile"),
        "compile_vs_async_tp_min": worst("ficco_compile", "async_tp"),
        "compile_vs_async_tp_heavy": gmean(_present([speedup(p, "ficco_compile", "async_tp") for p in comm])),
        "realized_share_heavy": mean(_present([realized(p, "ficco_compile") for p in comm])),
    }
    checked = [p["rel_err"].get(v) for p in points for v in CHECKED]
    failed = sum(1 for p in points for v in CHECKED if v in p["errors"])
    errs = _present(checked)
    grads_ok = None if loopback or not errs else all(e <= TOLERANCE[dtype_name] for e in errs) and not failed
    met = {k: None if loopback or goals[k] is None else goals[k] >= target for k, target in GOALS.items()}
    variants = sorted({v for p in points for v in p["step_ms"] if baseline(v)})
    return {
        "points": len(points),
        "comm_heavy_points": len(comm),
        "goals": goals,
        "goals_met": {**met, "gradients": grads_ok},
        "worst_vs_baseline": {v: worst(v) for v in variants},
        "max_rel_err": {
            v: max(_present([p["rel_err"].get(v) for p in points]), default=None)
            for v in sorted({v for p in points for v in p["rel_err"]})
        },
        "tolerance": TOLERANCE[dtype_name],
        "failed_runs": sum(len(p["errors"]) for p in points),
    }


def jobs(points: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """The points of each (model, phase), by token count, in the order the models and phases first come."""
    out: dict[tuple[str, str], list[dict]] = {}
    for p in points:
        out.setdefault((p["model"], p["phase"]), []).append(p)
    return {key: sorted(pts, key=lambda p: p["tokens"]) for key, pts in out.items()}


def ratio_text(value: float | None) -> str:
    """``1.02x``; ``-`` for None."""
    return "-" if value is None else f"{value:.2f}x"


def share_text(value: float | None) -> str:
    """``37%``; ``-`` for None."""
    return "-" if value is None else f"{value:.0%}"


def _span(values: list[float], fmt: Callable[[float | None], str], center: Callable) -> str:
    """``fmt(center(values))`` and the range, ``1.02x (0.97x-1.08x)``; one value alone; ``-`` for none."""
    if len(values) < 2:
        return fmt(values[0] if values else None)
    return f"{fmt(center(values))} ({fmt(min(values))}-{fmt(max(values))})"


def job_table(points: list[dict]) -> str:
    """Per model and phase: the token counts, the limit share, each compared variant's speedup over its
    baseline and ficco compile's over async-TP (geomean, range), and the realized share of the limit (mean,
    range)."""
    header = ["model", "phase", "tokens", "limit share", "ficco eager / eager serial",
              "ficco compile / serial compile", "async-TP / serial compile", "ficco compile / async-TP",
              "realized: ficco compile", "realized: async-TP"]  # fmt: skip
    rows = []
    for (model, phase), pts in jobs(points).items():
        tokens = [p["tokens"] for p in pts]

        def each(f: Callable[[dict], float | None], pts: list[dict] = pts) -> list[float]:
            return _present([f(p) for p in pts])

        rows.append(
            [
                model,
                phase,
                f"{min(tokens)}-{max(tokens)}" if len(tokens) > 1 else str(tokens[0]),
                _span(each(limit_share), share_text, mean),
                *(
                    _span(each(lambda p, v=v: speedup(p, v)), ratio_text, gmean)
                    for v in ("ficco_eager", "ficco_compile", "async_tp")
                ),
                _span(each(lambda p: speedup(p, "ficco_compile", "async_tp")), ratio_text, gmean),
                _span(each(lambda p: realized(p, "ficco_compile")), share_text, mean),
                _span(each(lambda p: realized(p, "async_tp")), share_text, mean),
            ]
        )
    return markdown_table(header, rows)


def goal_lines(summary: dict[str, Any]) -> list[str]:
    """The done-when as markdown bullets: each goal's value, target and whether it is met."""
    words = {
        "eager_vs_serial_min": "ficco eager over eager serial, worst point",
        "compile_vs_serial_compile_min": "ficco compile over serial compile, worst point",
        "compile_vs_async_tp_min": "ficco compile over async-TP, worst point",
        "compile_vs_async_tp_heavy": f"ficco compile over async-TP, geomean where the limit share >= "
        f"{COMM_HEAVY:.0%} ({summary['comm_heavy_points']} points)",
        "realized_share_heavy": "realized share of the limit by ficco compile, mean over those points",
    }
    lines = []
    for key, target in GOALS.items():
        value, met = summary["goals"][key], summary["goals_met"][key]
        shown = share_text(value) if key.startswith("realized") else ratio_text(value)
        goal = f"{target:.0%}" if key.startswith("realized") else f"{target}x"
        lines.append(f"- {words[key]}: {shown} (goal >= {goal}; met: {'-' if met is None else met})")
    lines.append(
        f"- outputs and gradients equal serial's (relative error <= {summary['tolerance']}): "
        f"{'-' if summary['goals_met']['gradients'] is None else summary['goals_met']['gradients']}"
    )
    return lines
