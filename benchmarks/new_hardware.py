"""A new machine learned in minutes: regret and slow picks against device-minutes, replayed on measured data.

    .venv/bin/python -m benchmarks.new_hardware --jobs 2                    # both targets, 3 seeds (~15 min)
    .venv/bin/python -m benchmarks.new_hardware --targets h200x4 --seeds 1  # one target, one seed
    .venv/bin/python -m benchmarks.new_hardware --render                    # the .md and .png of the JSON

A committed dataset stands in for the new machine: measuring a scenario is looking its rows up, costed at the
dataset's own seconds per scenario (its manifest's sweep seconds over its scenarios). The nine model families
of ``datasets/h200x4`` are split into two fixed halves (sorted by name, alternately; recorded in the JSON);
each half in turn is the pool the sweep measures from and the other is scored, so every scenario of those
families is scored once, by a model that never saw its family. For each device-minute budget the sweep
measures a prefix of its order:

- ``random``: a seeded shuffle of the pool (one order per seed);
- ``current``: ``training.retrain.informative_subset`` of the budget's scenario count (farthest points in
  standardised features; a new machine has no current model);
- ``ordered``: ``training.sweep_order.measurement_order`` from the prior's uncertainty and the spread over the
  pool (what ``ficco retrain --budget-minutes`` measures in).

Each prefix is fitted twice by ``training.priors.fit_with_prior``: on the measured rows alone (priors
``none``; at 0 minutes: always serial/sm) and on top of the prior (``training.priors.build_prior`` from the
other datasets only, never the target's rows: for h200x4 the measured TP=2 datasets and the simulator at TP=4
and TP=2; for h200x2 the measured TP=4 dataset and the simulator). The points of ``ordered`` with the prior
are what ``ficco retrain --budget-minutes`` does (``default: true``). Per point and mode: the geometric-mean
regret (mean, min and max over the seeds) and the picks more than 2% slower than serial/sm (mean); beside the
prior's, its difference from the same budget without the prior and that difference's noise band (the standard
error of a paired bootstrap over the scored scenarios). Single-threaded XGBoost per task, ``--jobs`` tasks at
once."""

from __future__ import annotations

import argparse
import multiprocessing
import pickle
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import REPO, rerender, say, write_results

OUT = REPO / "benchmarks" / "results" / "new-hardware.json"
MINUTES = (0.0, 0.5, 1.0, 2.0, 4.0)
"""Device-minute budgets replayed."""
STRATEGIES = ("random", "current", "ordered")
DEFAULT_STRATEGY = "ordered"
"""What ``ficco retrain --budget-minutes`` measures in (with the prior)."""
SLOW = 1.02
"""A pick more than 2% slower than serial/sm (``training.metrics.WITHIN``)."""
BOOTSTRAP = 200
"""Paired bootstrap resamples of the scored scenarios for a difference's noise band."""
FAMILIES_OF = "datasets/h200x4"
"""The dataset whose nine model families are split into the two fixed halves."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Replay:
    """One new machine replayed: the datasets that stand in for it and those its prior is built from."""

    target: tuple[str, ...]
    measured: tuple[str, ...]
    """Other machines' measured datasets."""
    simulated: tuple[str, ...]
    """The simulator's datasets (of the target machine and of the measured datasets' machines)."""


REPLAYS: dict[str, Replay] = {
    "h200x4": Replay(
        target=("datasets/h200x4",),
        measured=("datasets/h200x2", "datasets/h200x2-moe", "datasets/h200x2-coverage"),
        simulated=("datasets/h200x4-sim", "datasets/h200x2-sim"),
    ),
    "h200x2": Replay(
        target=("datasets/h200x2", "datasets/h200x2-moe"),
        measured=("datasets/h200x4",),
        simulated=("datasets/h200x2-sim", "datasets/h200x4-sim"),
    ),
}


def halves() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The two fixed halves of :data:`FAMILIES_OF`'s model families: sorted by name, alternately."""
    from ficco.features.dataset import load_dataset

    families = sorted(set(load_dataset(REPO / FAMILIES_OF)["family"]))
    return tuple(families[0::2]), tuple(families[1::2])


def seconds_per_scenario(path: str) -> float:
    """A dataset's own measuring seconds per scenario: its manifest's ``seconds`` over its scenarios."""
    from ficco.features.dataset import read_manifest

    manifest = read_manifest(REPO / path)
    return float(manifest["seconds"]) / len(manifest["finished"])


_STATE: dict[str, Any] = {}
"""Per target: its table, prior, pools and costs; the workers read a pickled copy (:func:`_load_state`)."""


def _load_state(path: str) -> None:
    """A worker's :data:`_STATE`, from the pickle the parent wrote (workers are spawned: XGBoost's OpenMP
    threads do not survive a fork)."""
    import pickle

    _STATE.update(pickle.loads(Path(path).read_bytes()))


def prepare(name: str, replay: Replay, family_halves: tuple[tuple[str, ...], ...]) -> dict[str, Any]:
    """Load ``replay``'s tables, build its prior and each half's pool, costs and order."""
    from ficco.features.dataset import read_manifest
    from ficco.training.dataset_table import load_dataset_table
    from ficco.training.priors import build_prior
    from ficco.training.sweep_order import measurement_order, scenario_uncertainty

    start = time.perf_counter()
    target = load_dataset_table(*(REPO / p for p in replay.target)).table
    rate = {}
    for path in replay.target:
        rate |= dict.fromkeys(read_manifest(REPO / path)["finished"], seconds_per_scenario(path))
    measured = {Path(p).name: load_dataset_table(REPO / p).table for p in replay.measured}
    simulated = {Path(p).name: load_dataset_table(REPO / p).table for p in replay.simulated}
    here = [t for t in simulated.values() if t.scenarios[0].hardware.id == name]
    plan_X = np.concatenate([target.X, *(t.X for t in here)])
    plan_modes = np.concatenate([target.modes, *(t.modes for t in here)])
    prior = build_prior(
        name, measured=measured, simulated=simulated, plan_X=plan_X, plan_modes=plan_modes, n_jobs=1
    )
    say(
        f"{name}: prior of {prior.describe()}: {', '.join(prior.components)} "
        f"({time.perf_counter() - start:.0f} s)"
    )
    pools = []
    for half in family_halves:
        scored = np.isin(target.families, half)
        pool_rows = np.flatnonzero(~scored)
        rows = pool_rows[np.sort(np.unique(target.scenario_ids[pool_rows], return_index=True)[1])]
        X = target.X[rows]
        value = scenario_uncertainty(X, prior, target.host_factor)
        pools.append({
            "scored": scored,
            "ids": target.scenario_ids[rows],
            "families": target.families[rows],
            "scenarios": [target.scenarios[i] for i in rows],
            "cost": np.array([rate[s] for s in target.scenario_ids[rows]]),
            "ordered": measurement_order(X, value),
        })  # fmt: skip
    return {"table": target, "prior": prior, "pools": pools, "rate": rate}


def prefix(order: np.ndarray, cost: np.ndarray, minutes: float) -> np.ndarray:
    """The longest prefix of ``order`` whose summed ``cost`` (seconds) fits in ``minutes``."""
    spent = np.cumsum(cost[order])
    return order[: int(np.searchsorted(spent, minutes * 60.0, side="right"))]


def chosen(pool: dict[str, Any], strategy: str, seed: int, minutes: float) -> np.ndarray:
    """Indices into ``pool`` of what ``strategy`` measures in ``minutes``."""
    from ficco.harness.plan import Plan
    from ficco.training.retrain import informative_subset

    if strategy == "random":
        return prefix(np.random.default_rng(seed).permutation(len(pool["ids"])), pool["cost"], minutes)
    if strategy == "ordered":
        return prefix(pool["ordered"], pool["cost"], minutes)
    count = int(minutes * 60.0 // float(np.mean(pool["cost"])))
    plan = Plan(entries=tuple(zip(pool["families"], pool["scenarios"], strict=True)))
    keys = {s.key() for _, s in informative_subset(plan, count, None)} if count else set()
    return np.flatnonzero([s.key() in keys for s in pool["scenarios"]])[:count]


def run_task(task: tuple[str, int, str, int, float, bool]) -> dict[str, Any]:
    """Fit one prefix, with or without the prior, and pick on the scored half: the picks and the choice."""
    from ficco.training.model import SERIAL_INDEX, pair_costs
    from ficco.training.predict.policy import apply_policy
    from ficco.training.priors import fit_with_prior

    target, half, strategy, seed, minutes, with_prior = task
    state = _STATE[target]
    table, pool = state["table"], state["pools"][half]
    picked = chosen(pool, strategy, seed, minutes)
    scored = table.subset(pool["scored"])
    train = table.subset(np.isin(table.scenario_ids, pool["ids"][picked]))
    prior = state["prior"] if with_prior else None
    if not len(picked) and prior is None:
        final, choice = np.full(len(scored), SERIAL_INDEX), "serial"
    else:
        fit = fit_with_prior(train if len(picked) else None, prior, seed=seed, n_jobs=1)
        cost = pair_costs(fit.scorer, scored.X, scored.modes, scored.host_factor)
        ratio = pair_costs(fit.ratio, scored.X, scored.modes, scored.host_factor)
        final, choice = apply_policy(cost, ratio, fit.policy, scored.modes)[0], fit.label
    return {"task": task, "final": final, "choice": choice, "n": len(picked),
            "seconds": float(pool["cost"][picked].sum())}  # fmt: skip


def tasks(
    targets: Sequence[str], seeds: int, minutes: Sequence[float], strategies: Sequence[str] = STRATEGIES
) -> list[tuple]:
    """Every (target, half, strategy, seed, minutes, with prior) to fit; deterministic strategies and the
    0-minute budget once (seed 0, under the first strategy)."""
    out = []
    for target in targets:
        for half in (0, 1):
            for strategy in strategies:
                for seed in range(seeds if strategy == "random" else 1):
                    for m in minutes:
                        for with_prior in (False, True):
                            if m == 0 and (strategy != strategies[0] or seed):
                                continue
                            out.append((target, half, strategy, seed, m, with_prior))
    return out


def _mode_scores(table, final: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per mode: log regret of each row and the slow picks."""
    t = table.time_of(final)[0]
    out = {}
    for mode in sorted(set(table.modes.tolist())):
        on = table.modes == mode
        log_regret = np.log(t[on] / table.best_ms[on])
        out[mode] = {"log_regret": log_regret, "slow": int(np.sum(t[on] > SLOW * table.serial_ms[on]))}
    return out


def _bootstrap_band(a: np.ndarray, b: np.ndarray, seed: int = 0) -> float:
    """Standard error of ``geomean regret(a) - geomean regret(b)`` from log regrets of the same rows, by a
    paired bootstrap over the rows."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(a), size=(BOOTSTRAP, len(a)))
    diff = np.expm1(a[draws].mean(axis=1)) - np.expm1(b[draws].mean(axis=1))
    return float(diff.std())


def aggregate(results: list[dict[str, Any]], minutes: Sequence[float]) -> list[dict[str, Any]]:
    """The ``points`` of the JSON from every task's picks: both halves joined, then over the seeds."""
    runs: dict[tuple, dict[int, np.ndarray]] = {}
    info: dict[tuple, dict[str, Any]] = {}
    for r in results:
        target, half, strategy, seed, m, with_prior = r["task"]
        key = (target, strategy, seed, m, with_prior)
        table = _STATE[target]["table"]
        final = runs.setdefault(key, {}).setdefault(-1, np.zeros(len(table), dtype=np.int64))
        final[_STATE[target]["pools"][half]["scored"]] = r["final"]
        entry = info.setdefault(key, {"n": 0, "seconds": 0.0, "choices": []})
        entry["n"] += r["n"] / 2
        entry["seconds"] += r["seconds"] / 2
        entry["choices"].append(r["choice"])
    scores = {}
    for key, v in runs.items():  # the rows of the nine families (a target may hold others: never scored)
        state = _STATE[key[0]]
        scored = np.logical_or.reduce([pool["scored"] for pool in state["pools"]])
        scores[key] = _mode_scores(state["table"].subset(scored), v[-1][scored])
    points = []
    for target in sorted({k[0] for k in runs}):
        for strategy in STRATEGIES:
            for m in minutes:
                for with_prior in (False, True):
                    source = strategy if m else next((k[1] for k in runs if k[0] == target and not k[3]), "")
                    keys = [k for k in runs if k[:2] == (target, source) and k[3:] == (m, with_prior)]
                    if not keys:
                        continue
                    prior_name = "+".join(_STATE[target]["prior"].components) if with_prior else "none"
                    for mode in scores[keys[0]]:
                        regret = [float(np.expm1(scores[k][mode]["log_regret"].mean())) for k in keys]
                        point = {
                            "target": target, "strategy": strategy, "priors": prior_name, "minutes": m,
                            "mode": mode, "regret_mean": float(np.mean(regret)), "regret_min": min(regret),
                            "regret_max": max(regret), "slow_mean": float(np.mean([scores[k][mode]["slow"]
                                                                                  for k in keys])),
                            "seeds": len(keys),
                            "scenarios_mean": float(np.mean([info[k]["n"] for k in keys])),
                            "device_minutes_mean": float(np.mean([info[k]["seconds"] for k in keys])) / 60.0,
                            "choices": sorted(set(c for k in keys for c in info[k]["choices"])),
                        }  # fmt: skip
                        if with_prior:
                            base = [(target, source, k[2], m, False) for k in keys]
                            deltas = [regret[i] - float(np.expm1(scores[b][mode]["log_regret"].mean()))
                                      for i, b in enumerate(base)]  # fmt: skip
                            bands = [_bootstrap_band(scores[k][mode]["log_regret"],
                                                     scores[b][mode]["log_regret"])
                                     for k, b in zip(keys, base, strict=True)]  # fmt: skip
                            point |= {"delta_vs_none": float(np.mean(deltas)),
                                      "noise_band": float(np.mean(bands))}  # fmt: skip
                            if strategy == DEFAULT_STRATEGY:
                                point["default"] = True
                        points.append(point)
    return points


def render(result: dict[str, Any]) -> str:
    """The markdown table of the results: per target and mode, regret % (slow picks) by strategy and
    minutes."""
    lines = [
        "# A new machine learned in minutes (replay)",
        "",
        f"Written by `python -m benchmarks.new_hardware`; halves {result['halves']}; {result['seeds']} seeds "
        "(random order); regret = geometric-mean regret on the held-out half's families, mean [min-max over "
        "seeds] (slow picks > 2% behind serial/sm, mean); Δ = with the prior minus without, ± its noise band "
        "(paired bootstrap standard error). **bold**: what `ficco retrain --budget-minutes` does.",
        "",
    ]
    points = result["points"]
    for target in sorted({p["target"] for p in points}):
        minutes = sorted({p["minutes"] for p in points if p["target"] == target})
        lines += [f"## {target}", "", "prior: " + result["targets"][target]["prior"]["describe"], ""]
        for mode in ("eager", "graph"):
            head = ["strategy", "priors", *[f"{m:g} min" for m in minutes]]
            lines += [f"### {mode}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            for strategy in STRATEGIES:
                for priors in ("none", "prior"):
                    row = [strategy, priors]
                    for m in minutes:
                        p = next((q for q in points if q["target"] == target and q["strategy"] == strategy
                                  and q["mode"] == mode and q["minutes"] == m
                                  and (q["priors"] == "none") == (priors == "none")), None)  # fmt: skip
                        row.append(_cell(p))
                    lines.append("| " + " | ".join(row) + " |")
            lines.append("")
    return "\n".join(lines) + "\n"


def _cell(p: dict[str, Any] | None) -> str:
    if p is None:
        return ""
    text = f"{100 * p['regret_mean']:.2f}%"
    if p["regret_max"] > p["regret_min"]:
        text += f" [{100 * p['regret_min']:.2f}-{100 * p['regret_max']:.2f}]"
    text += f" ({p['slow_mean']:.0f})"
    if "delta_vs_none" in p:
        text += f" Δ{100 * p['delta_vs_none']:+.2f}±{100 * p['noise_band']:.2f}"
    return f"**{text}**" if p.get("default") else text


def plot(result: dict[str, Any], path: Path) -> None:
    """Regret against device-minutes, one panel per (target, mode), one line per (strategy, priors)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = result["points"]
    targets = sorted({p["target"] for p in points})
    fig, axes = plt.subplots(len(targets), 2, figsize=(11, 4 * len(targets)), squeeze=False)
    for row, target in enumerate(targets):
        for col, mode in enumerate(("eager", "graph")):
            ax = axes[row][col]
            for strategy in STRATEGIES:
                for priors in ("none", "prior"):
                    ps = sorted((p for p in points if p["target"] == target and p["mode"] == mode
                                 and p["strategy"] == strategy
                                 and (p["priors"] == "none") == (priors == "none")),
                                key=lambda p: p["minutes"])  # fmt: skip
                    if not ps:
                        continue
                    x = [p["minutes"] for p in ps]
                    y = [100 * p["regret_mean"] for p in ps]
                    default = ps[-1].get("default", False)
                    ax.plot(x, y, marker="o", lw=3 if default else 1.2, ls="-" if priors == "prior" else "--",
                            label=f"{strategy}, {priors}" + (" (retrain)" if default else ""))  # fmt: skip
                    if strategy == "random":
                        lo = [100 * p["regret_min"] for p in ps]
                        hi = [100 * p["regret_max"] for p in ps]
                        ax.fill_between(x, lo, hi, alpha=0.15)
            ax.set_title(f"{target}, {mode}: held-out families")
            ax.set_xlabel("device-minutes measured")
            ax.set_ylabel("geomean regret (%)")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--targets", default=",".join(REPLAYS), help=f"comma-separated, of {list(REPLAYS)}")
    parser.add_argument("--seeds", type=int, default=3, help="seeds of the random order")
    parser.add_argument(
        "--minutes", default=",".join(f"{m:g}" for m in MINUTES), help="device-minute budgets"
    )
    parser.add_argument(
        "--strategies", default=",".join(STRATEGIES), help=f"comma-separated, of {STRATEGIES}"
    )
    parser.add_argument("--jobs", type=int, default=2, help="tasks fitted at once (one XGBoost thread each)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--render", action="store_true", help="only write the .md and .png of --out")
    args = parser.parse_args()
    if args.render:
        rerender(args.out, render, plot)
        return
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = sorted(set(targets) - set(REPLAYS))
    if unknown:
        parser.error(f"--targets: {unknown} are not of {list(REPLAYS)}")
    minutes = sorted({float(m) for m in args.minutes.split(",")})
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if not strategies or set(strategies) - set(STRATEGIES):
        parser.error(f"--strategies: give some of {list(STRATEGIES)}; got {args.strategies!r}")
    start = time.perf_counter()
    family_halves = halves()
    for target in targets:
        _STATE[target] = prepare(target, REPLAYS[target], family_halves)
    todo = tasks(targets, args.seeds, minutes, strategies)
    say(f"{len(todo)} fits on {args.jobs} processes")
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state.pickle"
        state.write_bytes(pickle.dumps(_STATE))
        spawn = multiprocessing.get_context("spawn")
        with spawn.Pool(args.jobs, initializer=_load_state, initargs=(str(state),)) as pool:
            results = []
            for i, r in enumerate(pool.imap_unordered(run_task, todo, chunksize=1), 1):
                results.append(r)
                if i % 20 == 0 or i == len(todo):
                    say(f"  {i}/{len(todo)} fits ({time.perf_counter() - start:.0f} s)")
    result = {
        "benchmark": "new_hardware",
        "units": "regret: geometric-mean t_pick / t_best - 1 (fraction); slow: picks > 2% slower than "
        "serial/sm",
        "halves": [list(h) for h in family_halves],
        "seeds": args.seeds,
        "minutes": minutes,
        "targets": {
            t: {
                "datasets": list(REPLAYS[t].target),
                "seconds_per_scenario": {p: round(seconds_per_scenario(p), 3) for p in REPLAYS[t].target},
                "prior": {**_STATE[t]["prior"].info(), "describe": _STATE[t]["prior"].describe()},
                "measured_prior": list(REPLAYS[t].measured),
                "simulated_prior": list(REPLAYS[t].simulated),
            }
            for t in targets
        },
        "points": aggregate(results, minutes),
        "seconds": round(time.perf_counter() - start, 1),
    }
    write_results(result, args.out, render, plot)
    print(render(result))
    say(f"wrote {args.out} ({result['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
