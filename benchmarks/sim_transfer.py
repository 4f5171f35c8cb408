r"""A model trained on simulated rows, scored on measured ones: how much the simulator's errors cost the
picks of a model trained on its dataset (docs/simulator.md).

    python -m benchmarks.sim_transfer --jobs 2        # datasets/h200x4-sim -> datasets/h200x4
    python -m benchmarks.sim_transfer --train datasets/h200x2-sim --test datasets/h200x2 --jobs 2
    python -m benchmarks.sim_transfer --render        # the markdown again from the JSON

The model is trained as ``ficco train`` trains one (``training.train.train_model``: grouped cross-validation
of the configurations and fallback policies, then a fit on every row), on ``--train``; its picks of every
(scenario, mode) of ``--test`` (answered, as ``training.evaluate`` answers, for each row's host factor and
label version) are scored on the measured times with ``training.metrics.score``, per mode and op group, twice:
under the fallback policy the cross-validation chose, and under the one a registered simulated model answers
with (that policy at least the simulator's guard, ``training.train.guard_policy``). Writes
``benchmarks/results/sim-transfer-<test>.{json,md}`` and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks import REPO, rerender
from ficco.files import write_text_atomic
from ficco.tables import markdown_table

GOALS = {"eager": 0.020, "graph": 0.025}
"""Largest geometric-mean regret the transfer aims at per mode (issue 61), with at most ``SLOW_PICKS``
picks over 2% slower than serial/sm."""
SLOW_PICKS = 15
METRICS = ("geomean_regret", "top1", "within_2pct", "n_slower_than_serial_2pct", "n_scenarios")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--train", type=Path, default=REPO / "datasets" / "h200x4-sim", help="Simulated rows")
    parser.add_argument("--test", type=Path, default=REPO / "datasets" / "h200x4", help="Measured dataset")
    parser.add_argument(
        "--out", type=Path, default=None, help="Output path without suffix (default: results)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="XGBoost threads (1-2 on a shared machine)")
    parser.add_argument("--seed", type=int, default=0, help="Training seed")
    parser.add_argument("--render", action="store_true", help="Only write the markdown from the JSON")
    args = parser.parse_args(argv)
    args.out = args.out or REPO / "benchmarks" / "results" / f"sim-transfer-{args.test.name}"
    return args


def _shown(path: Path) -> str:
    """``path`` relative to the checkout when inside it (the committed results name ``datasets/...``)."""
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def run(args: argparse.Namespace) -> dict:
    """Train on ``--train``, score on ``--test``: the JSON written."""
    from ficco.training.dataset_table import load_dataset_table
    from ficco.training.metrics import score
    from ficco.training.model import pair_costs
    from ficco.training.predict.policy import apply_policy
    from ficco.training.train import guard_policy, simulator_fidelity, train_model

    t0 = time.perf_counter()
    train, test = load_dataset_table(args.train), load_dataset_table(args.test)
    trained = train_model(train.table, seed=args.seed, n_jobs=args.jobs, progress=True)
    table = test.table
    answered = (table.X, table.modes, table.host_factors, table.label_versions)  # as training.evaluate asks
    cost = pair_costs(trained.scorer, *answered)
    ratio = cost if trained.ratio is trained.scorer else pair_costs(trained.ratio, *answered)
    fidelity = simulator_fidelity(train, sorted({s.world_size for s in train.table.scenarios}))
    chosen = trained.choice.policy
    policies = {"cross-validated": chosen, "registered": guard_policy(chosen, fidelity)}
    scores: dict = {}
    for name, policy in policies.items():
        picks = apply_policy(cost, ratio, policy, table.modes)[0]
        for mode in sorted(set(table.modes)):
            for group in ("all", *sorted(set(table.op_groups))):
                rows = (table.modes == mode) & ((table.op_groups == group) | (group == "all"))
                metrics = score(table.subset(rows), picks[rows])
                scores.setdefault(name, {}).setdefault(mode, {})[group] = {k: metrics[k] for k in METRICS}
    goals = {
        name: {
            mode: bool(s[mode]["all"]["geomean_regret"] <= GOALS[mode]
                       and s[mode]["all"]["n_slower_than_serial_2pct"] <= SLOW_PICKS)
            for mode in s
        }
        for name, s in scores.items()
    }  # fmt: skip
    return {
        "train": {**train.info, "path": _shown(args.train)},
        "test": {**test.info, "path": _shown(args.test)},
        "sim_fidelity": fidelity,
        "config": trained.choice.config.to_dict(),
        "policies": {name: p.to_dict() for name, p in policies.items()},
        "scores": scores,
        "goals": {"regret": GOALS, "slow_picks": SLOW_PICKS, "met": goals},
        "seed": args.seed,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def render(data: dict) -> str:
    """The markdown report of :func:`run`'s JSON."""
    rows = []
    for name, by_mode in data["scores"].items():
        for mode, groups in by_mode.items():
            for group, m in groups.items():
                rows.append([name, mode, group, f"{100 * m['geomean_regret']:.2f}%", f"{m['top1']:.0%}",
                             f"{m['within_2pct']:.0%}", str(m["n_slower_than_serial_2pct"]),
                             str(m["n_scenarios"])])  # fmt: skip
    return "\n".join(
        [
            f"# A model trained on {data['train']['path']}, scored on {data['test']['path']}",
            "",
            "Written by `python -m benchmarks.sim_transfer` (docs/simulator.md): trained as `ficco train` "
            f"trains (config {data['config']}), its picks scored on the measured times (`training.metrics`). "
            f"Goals: regret <= {data['goals']['regret']}, at most {data['goals']['slow_picks']} picks over "
            f"2% slower than serial/sm per mode; met: {data['goals']['met']}.",
            "",
            f"Policies: {json.dumps(data['policies'])}.",
            "",
            markdown_table(
                ["policy", "mode", "ops", "regret", "top-1", "within 2%", "slower than serial", "scenarios"],
                rows,
            ),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    json_path = args.out.with_suffix(".json")
    if not args.render:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(json_path, json.dumps(run(args), indent=1, default=float) + "\n")
    rerender(json_path, render)
    data = json.loads(json_path.read_text())
    for name, by_mode in data["scores"].items():
        for mode, groups in by_mode.items():
            m, met = groups["all"], data["goals"]["met"][name][mode]
            print(f"{name:16} {mode:5} regret {100 * m['geomean_regret']:5.2f}% slow picks "
                  f"{m['n_slower_than_serial_2pct']:3d} of {m['n_scenarios']} (goal met: {met})")  # fmt: skip
    return data


if __name__ == "__main__":
    main()
