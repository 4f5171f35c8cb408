"""How regret and slow picks fall as coverage scenarios are added to the training data.

    .venv/bin/python -m benchmarks.studies.coverage_curve --out benchmarks/results/coverage-curve-h200x2.json
    .venv/bin/python -m benchmarks.studies.coverage_curve --base datasets/h200x2-sim \\
        --coverage /tmp/cov-sim --out /tmp/curve.json                   # a simulated run of the same steps

The coverage dataset (``benchmarks/coverage_plan.py measure``) is taken in its plan's order, the order it
was chosen in (fewest measured neighbours first). Every fifth of its scenarios is held out as a fixed test
set; the first ``k`` of the others (``--steps``) join the base datasets' rows (``--base``, the shipped
model's training data), and the shipped configuration and fallback policy (the current model's card) is
fitted and scored, per mode, on:

- ``family_holdout``: the base rows, each ``ficco evaluate`` fold (``training.crossval``'s groups of the
  base rows) picked by a model fitted on the other folds and the ``k`` coverage scenarios (which are never
  held out: they are what is being added);
- ``coverage_test``: the held-out coverage scenarios (shapes off the map of the base data), by a model
  fitted on the base rows and the ``k`` scenarios;
- ``unseen``: the unseen-family sets (``--unseen``, their scenarios the training rows lack), by the same
  model.

Each cell: geometric-mean regret and picks more than 2% slower than serial/sm. Writes the JSON, a markdown
table beside it and the plot (``.png``: regret and slow picks against scenarios added), so the next
machine knows how many to measure. Single-threaded XGBoost; deterministic.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks import REPO, write_results

BASE = ("datasets/h200x2", "datasets/h200x2-moe")
UNSEEN = ("datasets/h200x2-unseen", "datasets/h200x2-unseen-v3", "datasets/h200x2-heldout",
          "datasets/h200x2-heldout-v3")  # fmt: skip
TEST_EVERY = 5
"""Every this-many-th coverage scenario (in plan order) is held out as the fixed test set."""
SLOW = 1.02
"""A pick more than 2% slower than serial/sm."""


def _shown(path: Path) -> str:
    """``path`` relative to the checkout where it lies inside it (results name no machine's folders)."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def scores(table, picks: np.ndarray) -> dict:
    """Per mode: rows, geometric-mean regret and slow picks of ``picks`` on ``table``."""
    times = table.time_of(picks)[0]
    out = {}
    for mode in sorted(set(table.modes.tolist())):
        on = table.modes == mode
        t, best, serial = times[on], table.best_ms[on], table.serial_ms[on]
        out[mode] = {
            "rows": int(on.sum()),
            "geomean_regret": float(np.expm1(np.mean(np.log(t / best)))),
            "slow": int(np.sum(t > SLOW * serial)),
        }
    return out


def coverage_split(coverage, plan_ids: list[str]) -> tuple[list, object]:
    """The coverage table's scenarios in plan order as (the tables of the trainable ones, one per scenario
    in order; the held-out test table: every :data:`TEST_EVERY`-th)."""
    measured = set(coverage.scenario_ids.tolist())
    order = [sid for sid in plan_ids if sid in measured]
    test = {sid for i, sid in enumerate(order) if i % TEST_EVERY == TEST_EVERY - 1}
    train = [sid for sid in order if sid not in test]
    return train, coverage.subset(np.isin(coverage.scenario_ids, list(test)))


def step(base, coverage, train_ids: list[str], k: int, test, unseen: dict, choice, folds, seed: int) -> dict:
    """The scores of one step: the first ``k`` of ``train_ids`` added (module docstring)."""
    from ficco.training.dataset_table import concat_tables
    from ficco.training.evaluate import fit_and_pick

    added = coverage.subset(np.isin(coverage.scenario_ids, train_ids[:k]))
    picks = np.zeros(len(base), dtype=np.int64)
    for fold in sorted(set(folds.tolist())):
        held = folds == fold
        train = concat_tables(base.subset(~held), added)
        (picks[held],) = fit_and_pick(train, base.subset(held), choice, seed=seed, n_jobs=1)
    whole = concat_tables(base, added)
    out = {"added": k, "family_holdout": scores(base, picks)}
    for name, table in {"coverage_test": test, **unseen}.items():
        if len(table):
            (p,) = fit_and_pick(whole, table, choice, seed=seed, n_jobs=1)
            out[name] = scores(table, p)
    print(f"{k} scenarios added: {out}", flush=True)
    return out


def study(args: argparse.Namespace) -> dict:
    """Every step's scores (module docstring)."""
    from ficco.harness.plan import Plan
    from ficco.training.crossval import Choice, cv_folds, cv_groups
    from ficco.training.dataset_table import concat_tables, load_dataset_table
    from ficco.training.evaluate import unseen
    from ficco.training.fit import TrainConfig
    from ficco.training.predict.policy import ModePolicy
    from ficco.training.predict.registry import load_predictor

    card = load_predictor(args.models, args.hardware).card
    choice = Choice(config=TrainConfig(**card["config"]), policy=ModePolicy.from_dict(card["policy"]))
    base = load_dataset_table(*args.base).table
    coverage = load_dataset_table(args.coverage).table
    plan_ids = [s.key() for _, s in Plan.from_json((args.coverage / "plan.json").read_text())]
    train_ids, test = coverage_split(coverage, plan_ids)
    both = concat_tables(base, coverage)
    sets = {Path(p).name: unseen(load_dataset_table(p).table, both)[0] for p in args.unseen}
    folds = cv_folds(cv_groups(base), args.max_folds)
    steps = sorted({min(k, len(train_ids)) for k in args.steps} | {len(train_ids)})
    return {
        "model_config": card["config"], "policy": card["policy"],
        "base": [_shown(p) for p in args.base], "coverage": _shown(args.coverage),
        "coverage_scenarios": {"trainable": len(train_ids), "test": len(set(test.scenario_ids))},
        "steps": [step(base, coverage, train_ids, k, test, sets, choice, folds, args.seed) for k in steps],
    }  # fmt: skip


def render(result: dict) -> str:
    """The steps as a markdown table: per set and mode, regret (slow picks)."""
    from ficco.tables import markdown_table

    names = [n for n in result["steps"][0] if n != "added"]
    header = ["added", *(f"{n} {m}" for n in names for m in ("eager", "graph"))]
    rows = [
        [s["added"], *(f"{s[n][m]['geomean_regret']:.2%} ({s[n][m]['slow']})" if m in s.get(n, {}) else "-"
                       for n in names for m in ("eager", "graph"))]
        for s in result["steps"]
    ]  # fmt: skip
    return (
        "# Regret and slow picks against coverage scenarios added\n\n"
        f"Base {', '.join(result['base'])}; coverage {result['coverage']} "
        f"({result['coverage_scenarios']['trainable']} added in plan order, "
        f"{result['coverage_scenarios']['test']} held out). Cells: geomean regret (picks > 2% slower than "
        "serial).\n\n" + markdown_table(header, rows) + "\n"
    )


def plot(result: dict, path: Path) -> None:
    """Regret (left) and slow picks (right) against scenarios added, a line per set and mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = result["steps"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [n for n in steps[0] if n != "added"]
    for i, name in enumerate(names):
        for mode, style in (("eager", "--"), ("graph", "-")):
            xs = [s["added"] for s in steps if mode in s.get(name, {})]
            if not xs:
                continue
            cells = [s[name][mode] for s in steps if mode in s.get(name, {})]
            label = f"{name} {mode}"
            left.plot(
                xs, [100 * c["geomean_regret"] for c in cells], style, color=f"C{i}", marker="o", label=label
            )
            right.plot(xs, [c["slow"] for c in cells], style, color=f"C{i}", marker="o", label=label)
    left.set_ylabel("geomean regret (%)")
    right.set_ylabel("picks > 2% slower than serial")
    for ax in (left, right):
        ax.set_xlabel("coverage scenarios added")
        ax.grid(alpha=0.3)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", type=Path, nargs="+", default=[REPO / p for p in BASE])
    parser.add_argument("--coverage", type=Path, default=REPO / "datasets" / "h200x2-coverage")
    parser.add_argument("--unseen", type=Path, nargs="*", default=[REPO / p for p in UNSEEN])
    parser.add_argument("--steps", type=int, nargs="+", default=[0, 64, 128, 192])
    parser.add_argument("--models", type=Path, default=REPO / "models")
    parser.add_argument("--hardware", default="h200x2")
    parser.add_argument("--max-folds", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results" / "coverage-curve-h200x2.json"
    )
    args = parser.parse_args()
    result = study(args)
    write_results(result, args.out, render, plot)
    print(render(result))
    print(f"wrote {args.out} (and .md, .png)")


if __name__ == "__main__":
    main()
