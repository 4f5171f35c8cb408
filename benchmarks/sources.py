"""What adding a dataset of another label source does to the target's held-out picks.

    .venv/bin/python -m benchmarks.sources --out benchmarks/results/sources-h200x2.json

The target (``--target``, the shipped model's datasets) fixes the rows, grid groups and folds of every line
(``training.crossval``). Each line trains one recipe per fold and scores its held-out picks of the target
rows, per mode, against two label sets: the target's own sweep, and the pooled labels (the target's times
pooled with its repeat sweeps ``--repeat``, the steadier estimate). Lines:

- ``pooled learner``: every row at one host factor and one label version, as models before fv4 learned;
- ``target alone``: the source-aware learner (``ficco train --learner sources``) on the target;
- ``+ <dataset>``: one more measured dataset as ``--extra`` rows, each alone, then ``+ all`` together;
- ``repeats pooled``: the repeats pooled into the target's labels (``--repeat``), then with the coverage
  sweep as extra rows.

The noise band is the largest change of the target-alone line's regret over refits with 5% of the scenarios
left out (``training.promotion.refit_band``). Prints a table and writes the JSON and a markdown table beside
it. One configuration (``--config``, the shipped model's) keeps it to minutes; the extra weight is chosen by
cross-validation as ``ficco train`` chooses it. Each finished line is kept in ``<out>.lines.json`` at once,
and the same command again skips the lines kept there under the same arguments (a stopped run resumes);
``--recipes`` computes only the lines named, ``--parallel N`` computes N lines at once (each in its own
process, XGBoost on ``--jobs`` threads: on a machine of many cores). The table is written once every line is
kept.

    .venv/bin/python -m benchmarks.sources --parallel 4 --jobs 4                 # 16 cores
    .venv/bin/python -m benchmarks.sources --recipes "+ all" --jobs 16           # the largest line alone
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from benchmarks import REPO, write_results
from ficco.files import write_text_atomic

TARGET = ("datasets/h200x2", "datasets/h200x2-moe")
REPEATS = ("datasets/h200x2-v2", "datasets/h200x2-swap-trial", "datasets/h200x2-protocol-v3")
ADDED = (
    "datasets/h200x2-coverage", "datasets/h200x2-v2", "datasets/h200x2-swap-trial",
    "datasets/h200x2-protocol-v3", "datasets/h200x2-heldout", "datasets/h200x2-heldout-v3",
    "datasets/h200x2-unseen", "datasets/h200x2-unseen-v3",
)  # fmt: skip
SHIPPED_CONFIG = "ndcg,6,100,0.15"


def parse_config(text: str):
    """``objective,depth,trees,rate`` as a ``training.fit.TrainConfig``."""
    from ficco.training.fit import TrainConfig

    objective, depth, trees, rate = text.split(",")
    return TrainConfig(objective=objective, max_depth=int(depth), n_estimators=int(trees),
                       learning_rate=float(rate))  # fmt: skip


def held_out(loaded, config, *, seed: int, jobs: int) -> tuple[np.ndarray, dict]:
    """The held-out picks of ``loaded``'s target rows (``[n_target]``) and the chosen configuration."""
    from ficco.training.crossval import cross_validate

    cv = cross_validate(loaded.table, configs=(config,), seed=seed, n_jobs=jobs)
    return cv.final[loaded.table.is_target], {"config": cv.choice.config.key(), **cv.choice.policy.to_dict()}


def line_of(name: str, loaded, labels: dict, config, *, seed: int, jobs: int) -> dict:
    """One recipe's line: its held-out picks of the target rows scored against each of ``labels`` (per mode,
    :func:`scored`), the configuration chosen and the seconds it took."""
    start = time.time()
    picks, choice = held_out(loaded, config, seed=seed, jobs=jobs)
    rows = loaded.table.subset(loaded.table.is_target)
    scores = {k: scored(picks, rows, t) for k, t in labels.items()}
    return {"recipe": name, "choice": choice, **scores, "seconds": round(time.time() - start, 1)}


def computed(todo: dict, labels: dict, config, *, seed: int, jobs: int, parallel: int) -> Iterator[dict]:
    """The lines of ``todo`` (recipe name -> loaded tables) as they finish, the largest tables first;
    ``parallel`` > 1: that many at once, each in a spawned process (XGBoost's threads do not survive a
    fork)."""
    order = sorted(todo, key=lambda name: -len(todo[name].table))
    if parallel <= 1:
        for name in order:
            yield line_of(name, todo[name], labels, config, seed=seed, jobs=jobs)
        return
    with ProcessPoolExecutor(parallel, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(line_of, n, todo[n], labels, config, seed=seed, jobs=jobs) for n in order]
        for future in as_completed(futures):
            yield future.result()


def scored(picks: np.ndarray, rows, labels) -> dict:
    """Per mode: regret and slow picks of ``picks`` (columns, on ``rows``' (scenario, mode) order) against
    ``labels``' times of the same rows."""
    from ficco.training.evaluate import aligned_rows
    from ficco.training.metrics import score

    mine, theirs = aligned_rows(rows, labels)
    out = {}
    for mode in ("eager", "graph"):
        on = rows.modes[mine] == mode
        s = score(labels.subset(theirs[on]), picks[mine[on]])
        out[mode] = {"regret": round(s["geomean_regret"], 6), "slow": s["n_slower_than_serial_2pct"],
                     "rows": s["n_scenarios"]}  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", nargs="+", default=list(TARGET))
    parser.add_argument("--repeat", nargs="*", default=list(REPEATS))
    parser.add_argument("--added", nargs="*", default=list(ADDED))
    parser.add_argument("--config", default=SHIPPED_CONFIG, help="objective,depth,trees,rate")
    parser.add_argument("--refits", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="XGBoost threads of each line")
    parser.add_argument("--parallel", type=int, default=1, help="lines computed at once, one process each")
    parser.add_argument("--recipes", nargs="*", default=[], help="compute only these lines (default: all)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/sources-h200x2.json")
    args = parser.parse_args()

    from ficco.training.crossval import Choice
    from ficco.training.dataset_table import load_dataset_table
    from ficco.training.predict.policy import ModePolicy
    from ficco.training.promotion import pooled, refit_band

    config = parse_config(args.config)
    own = load_dataset_table(*args.target)
    steady = load_dataset_table(*args.target, repeats=args.repeat)
    labels = {"own": own.table, "pooled": steady.table}
    load = functools.partial(load_dataset_table, *args.target)
    recipes = {  # name -> its tables, loaded only for the lines this run computes
        "pooled learner": lambda: pooled(own, check=False),
        "target alone": lambda: own,
        **{f"+ {Path(p).name}": functools.partial(load, extra=[p]) for p in args.added},
        "+ all": functools.partial(load, extra=args.added),
        "repeats pooled": lambda: steady,
        "repeats pooled + coverage": functools.partial(
            load, repeats=args.repeat, extra=["datasets/h200x2-coverage"]
        ),
    }
    settings = {"target": list(args.target), "repeats": list(args.repeat), "added": list(args.added),
                "config": args.config, "seed": args.seed}  # fmt: skip
    unknown = sorted(set(args.recipes) - set(recipes))
    if unknown:
        parser.error(f"--recipes: unknown {unknown}; the lines are {list(recipes)}")
    kept = args.out.with_suffix(".lines.json")
    kept.parent.mkdir(parents=True, exist_ok=True)
    done = kept_lines(kept, settings)
    for name in recipes:
        if name in done:
            print(f"{name:32s}   kept  {done[name]['own']}", flush=True)
    todo = {n: t() for n, t in recipes.items() if n not in done and (not args.recipes or n in args.recipes)}
    for line in computed(todo, labels, config, seed=args.seed, jobs=args.jobs, parallel=args.parallel):
        done[line["recipe"]] = line
        ordered = [done[n] for n in recipes if n in done]
        write_text_atomic(kept, json.dumps({"settings": settings, "lines": ordered}, indent=1) + "\n")
        print(f"{line['recipe']:32s} {line['seconds']:6.0f} s  {line['own']}  pooled labels {line['pooled']}",
              flush=True)  # fmt: skip
    left = [n for n in recipes if n not in done]
    if left:
        print(f"{len(left)} lines left ({', '.join(left)}): the same command again computes them", flush=True)
        return
    lines = [done[n] for n in recipes]
    band = refit_band(own.table, Choice(config=config, policy=ModePolicy()), refits=args.refits,
                      seed=args.seed, n_jobs=args.jobs)  # fmt: skip
    results = {
        "target": list(args.target), "repeats": list(args.repeat), "config": args.config,
        "n_target_rows": int(own.table.is_target.sum()), "noise_band": band, "lines": lines,
    }  # fmt: skip
    write_results(results, args.out, markdown, plot)
    kept.unlink()
    print(markdown(results))


def kept_lines(path: Path, settings: dict) -> dict[str, dict]:
    """The lines a stopped run kept in ``path`` under the same ``settings``, by recipe name (none when the
    file is missing or its settings differ: those lines answer another question)."""
    if not path.exists():
        return {}
    kept = json.loads(path.read_text())
    if kept.get("settings") != settings:
        print(f"{path}: kept under other arguments ({kept.get('settings')}); starting over", flush=True)
        return {}
    return {line["recipe"]: line for line in kept["lines"]}


def markdown(results: dict) -> str:
    """The lines as a table: per label set and mode, regret (slow picks)."""
    columns = [
        "recipe",
        "extra weight",
        *(f"{k} labels {m}" for k in ("own", "pooled") for m in ("eager", "graph")),
    ]
    rows = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    for line in results["lines"]:
        weight = line["choice"]["config"].rsplit(",x", 1)[1] if ",x" in line["choice"]["config"] else "1"
        cells = [f"{line[k][m]['regret']:.2%} ({line[k][m]['slow']})" for k in ("own", "pooled")
                 for m in ("eager", "graph")]  # fmt: skip
        rows.append(f"| {line['recipe']} | {weight} | " + " | ".join(cells) + " |")
    band = results["noise_band"]
    return "\n".join([
        f"Target {' + '.join(results['target'])} ({results['n_target_rows']} rows), the shipped model's "
        f"folds; regret (picks > 2% slower than serial). Noise band of refits: eager +-{band['eager']:.2%}, "
        f"graph +-{band['graph']:.2%}.", "", *rows, "",
    ])  # fmt: skip


def plot(results: dict, path: Path) -> None:
    """Regret of each recipe per mode against the target's own labels, the target-alone line and its noise
    band marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [line["recipe"] for line in results["lines"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.35 * len(names) + 1.5), sharey=True)
    for ax, mode in zip(axes, ("eager", "graph"), strict=True):
        regret = [100 * line["own"][mode]["regret"] for line in results["lines"]]
        alone = 100 * next(
            line["own"][mode]["regret"] for line in results["lines"] if line["recipe"] == "target alone"
        )
        band = 100 * results["noise_band"][mode]
        ax.axvspan(alone - band, alone + band, color="0.85", label="target alone +- noise band")
        ax.barh(names, regret, color="tab:blue")
        ax.set_title(f"{mode}: held-out geomean regret, %")
        ax.invert_yaxis()
    axes[0].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
