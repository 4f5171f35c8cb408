"""How wide must a best set be for an independent run's fastest schedule to land in it? The label rule's
bootstrap level (``harness.labels.ALPHA``) swept over measured re-runs, per mode (no GPU).

    .venv/bin/python -m benchmarks.studies.best_set_study datasets/h200x2 datasets/h200x2-moe \
        datasets/h200x2-unseen-v3 datasets/h200x2:datasets/h200x2-v2 \
        --out benchmarks/results/best-set-study-h200x2.json

Each argument is a pair of runs: ``DATASET`` (its own re-measure, ``noise.parquet``: another process, the same
session) or ``FIRST:SECOND`` (two sweeps of the same scenarios, e.g. two sessions). For every level of
``--alphas``, the first run's best sets are recomputed from its stored rounds (``harness.labels.relabel``)
and scored as its card scores them (``harness.card.noise_summary``): the share of scenarios whose fastest
schedule in the second run lies in the first run's best set, against the median size of that set. The
issue's goals ask for >= 95% and <= 3 at once; the table shows what each level buys and costs. Prints the
table and writes JSON and markdown.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ficco.features import MODES
from ficco.features.dataset import load_dataset, load_noise
from ficco.files import write_text_atomic
from ficco.harness.card import noise_summary
from ficco.harness.labels import ALPHA, relabel
from ficco.tables import markdown_table, text_table

ALPHAS = (0.01, ALPHA, 0.1, 0.2, 0.35, 0.5)
"""Bootstrap levels tried: a schedule leaves the best set when it is slower than the fastest by more than
the margin in at least ``1 - alpha`` of the resamples (smaller alpha: wider sets)."""
GOAL_COVERAGE, GOAL_SIZE = 0.95, 3
"""Issue #10: the second run's fastest in the first run's best set in >= 95% of scenarios, while the median
best set holds <= 3 schedules."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.studies.best_set_study", description=__doc__.splitlines()[0]
    )
    p.add_argument("pairs", nargs="+", help="DATASET (against its noise.parquet) or FIRST:SECOND")
    p.add_argument("--alphas", default=",".join(map(str, ALPHAS)), help="comma-separated levels in (0, 1)")
    p.add_argument("--out", type=Path, default=None, help="JSON to write (markdown beside it)")
    args = p.parse_args(argv)
    try:
        args.alphas = [float(a) for a in args.alphas.split(",")]
    except ValueError:
        p.error(f"--alphas must be comma-separated numbers in (0, 1); got {args.alphas!r}")
    if not all(0 < a < 1 for a in args.alphas):
        p.error(f"--alphas must lie in (0, 1); got {args.alphas}")
    return args


def study(first, second, alphas: list[float]) -> dict:
    """Per mode and level: ``noise_summary`` of ``second`` against ``first`` relabelled at that level
    (rows of the scenarios in both runs)."""
    common = set(first["scenario_id"]) & set(second["scenario_id"])
    if not common:
        raise SystemExit("the two runs share no scenario_id: nothing to compare")
    first, second = first[first["scenario_id"].isin(common)], second[second["scenario_id"].isin(common)]
    out: dict = {}
    for alpha in alphas:
        labelled = relabel(first, alpha=alpha)
        for mode in MODES:
            a, b = labelled[labelled["mode"] == mode], second[second["mode"] == mode]
            if a.empty or b.empty:
                continue
            s = noise_summary(a, b)
            out.setdefault(mode, []).append(
                {
                    "alpha": alpha,
                    "scenarios": int(s["scenarios"]),
                    "coverage": s["second_best_in_first_set"],
                    "best_set_median": s["best_set_size_median"],
                    "both_goals": s["second_best_in_first_set"] >= GOAL_COVERAGE
                    and s["best_set_size_median"] <= GOAL_SIZE,
                }
            )
    return out


def _runs(pair: str):
    """The two runs of one argument (see the module docstring), and its label."""
    first, _, second = pair.partition(":")
    a = load_dataset(first)
    if second:
        return a, load_dataset(second), f"{first} vs {second}"
    noise = load_noise(first)
    if noise is None:
        raise SystemExit(f"{first} has no noise.parquet (no re-measure); pass FIRST:SECOND instead")
    return a, noise, f"{first} vs its re-measure"


def _rows(results: dict) -> list[list[str]]:
    return [
        [
            name,
            mode,
            f"{r['alpha']:g}",
            str(r["scenarios"]),
            f"{r['coverage']:.1%}",
            f"{r['best_set_median']:.0f}",
            "yes" if r["both_goals"] else "no",
        ]
        for name, modes in results.items()
        for mode, levels in modes.items()
        for r in levels
    ]


HEADER = [
    "runs",
    "mode",
    "alpha",
    "scenarios",
    "2nd fastest in 1st best set",
    "median best set",
    "both goals",
]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    results = {}
    for pair in args.pairs:
        first, second, name = _runs(pair)
        print(f"{name}: best sets at {len(args.alphas)} levels", flush=True)
        results[name] = study(first, second, args.alphas)
    print(text_table(HEADER, _rows(results)))
    if args.out is not None:
        data = {
            "alphas": args.alphas,
            "label_alpha": ALPHA,
            "goals": [GOAL_COVERAGE, GOAL_SIZE],
            "runs": results,
        }
        write_text_atomic(args.out, json.dumps(data, indent=1) + "\n")
        lines = [
            "# Best-set width against coverage",
            "",
            f"The label rule's level is alpha = {ALPHA} (`harness.labels.ALPHA`). Goals: the second run's "
            f"fastest in the first run's best set >= {GOAL_COVERAGE:.0%}, median best set <= {GOAL_SIZE}.",
            "",
            markdown_table(HEADER, _rows(results)),
            "",
        ]
        write_text_atomic(args.out.with_suffix(".md"), "\n".join(lines))
        print(f"wrote {args.out} and {args.out.with_suffix('.md')}")
    return results


if __name__ == "__main__":
    main()
