"""Model study: do the MoE rows hurt the dense picks, do per-mode fallback margins make picks safer, and
does any change to the model or its fallback generalise better to unseen model families?

    .venv/bin/python -m benchmarks.studies.model_study --dense datasets/h200x2 --moe datasets/h200x2-moe \
        --out reports/model-study-h200x2.json
    .venv/bin/python -m benchmarks.studies.model_study --dense datasets/h200x2 --moe datasets/h200x2-moe \
        --repeat datasets/h200x2-swap-trial --section generalization --jobs 2 \
        --out reports/model-study-generalization-h200x2.json

1. MoE rows (``moe``): the shipped configuration and fallback policy (``--config``, ``--min-gain``) are
   held fixed, and the dense rows are held out in the same folds with and without the MoE rows in
   training: the dense rows keep the folds of grouped cross-validation on the dense dataset alone
   (``training.crossval``), MoE rows of a family the dense data has go with it, the other MoE families
   are spread over the same folds by ``GroupKFold``. The dense rows' held-out metrics of both models per
   mode, and a bootstrap of the paired difference of their mean log regret that resamples whole
   cross-validation groups (model families, grid quartiles: the rows of one are not independent); the
   MoE rows' metrics of the combined model and of one trained on the MoE rows alone.
2. Fallback margins (``fallback``, dense rows): the pick falls back to serial/sm when a signal of its gain
   over serial is below a per-mode margin, chosen on the other folds' held-out picks (mean
   ``training.metrics.pick_loss``), never on the fold it is applied to. Signals: the time-ratio
   regressor's predicted ``log(t_serial / t_pick)`` (what ``training.predict.policy`` uses, there with one
   margin for both modes), and the ranker's score of the pick minus serial/sm's.
3. Generalisation (``generalization``): on the training data of the shipped model (dense and MoE rows,
   ``--repeat`` sweeps pooled), the shipped ranker with its per-mode ``min_gain`` fallback (``current``)
   against candidate changes, each with its own options (margins, widths) chosen per mode on the other
   folds (:func:`select_options`), never on the fold they are applied to:

   - ``uncertainty_fallback_serial``: ``BAGS`` time-ratio regressors beside the shipped one, each fitted
     without a random ``BAG_DROP`` of the training folds' groups (model families, grid quartiles), so that
     their disagreement grows where a family unlike the training ones would move the prediction; the pick
     falls back to serial/sm when the lower bound ``mean - z * std`` of its predicted log speedup over
     serial (over the shipped regressor and the bags) is below the margin;
   - ``uncertainty_fallback_heuristic``: the same rule, falling back to the size heuristic's pick
     (``training.baselines``, fitted on the training rows of the same mode and op group);
   - ``ranker_min_child_weight_5``: the shipped ranker with ``min_child_weight`` 5 (fewer, larger leaves);
   - ``ranker_per_mode``: one shipped ranker per execution mode, each fitted on that mode's rows.

   Scored per mode on the family holdout (grouped cross-validation, ``training.crossval``; dense and MoE
   rows apart) and on the region holdout of ``ficco evaluate`` (trained below the 75th percentile of GEMM
   FLOPs, each candidate under the options chosen on all cross-validation folds), with a family bootstrap
   of each candidate's paired log-regret difference to ``current`` on the dense rows.
4. More families (``families``; ``--families DIR``, repeated, datasets of model families the training data
   lacks): does training on more measured families help on yet other unseen ones? For every ordered pair
   (A, B) of those datasets, the shipped configuration trained on the training data alone and on it plus
   A's scenarios, both scored per mode on B's scenarios that neither training set holds (each dataset's
   pairs at its own host factor, ``training.fit.training_pairs``).

    .venv/bin/python -m benchmarks.studies.model_study --dense datasets/h200x2 --moe datasets/h200x2-moe \
        --section families --families datasets/h200x2-unseen-v3 --families datasets/h200x2-heldout-v3 \
        --families datasets/h200x2-unseen --families datasets/h200x2-heldout \
        --out reports/model-study-families-h200x2.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

BOOTSTRAP = 4000
"""Family bootstrap resamples."""
METRICS = ("geomean_regret", "p95_regret", "max_regret", "n_slower_than_serial_2pct", "in_best_set",
           "n_scenarios")  # fmt: skip
"""The metrics the study reports per mode."""
RATIO_MARGINS = (-np.inf, *np.linspace(-0.05, 0.10, 16))
"""Candidate margins on the predicted log speedup (-inf: never fall back)."""
RANK_MARGINS = (-np.inf, *np.linspace(0.0, 1.5, 16))
"""Candidate margins on the ranker's score difference (-inf: never fall back)."""
BAGS = 5
"""Family-bagged time-ratio regressors per training split (section 3)."""
BAG_DROP = 0.3
"""Share of the training groups each bagged regressor is fitted without."""
LCB_WIDTHS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)
"""Candidate widths ``z`` of the lower bound ``mean - z * std`` of the pick's predicted log speedup."""
MIN_CHILD_WEIGHT = 5.0
"""``min_child_weight`` of the regularised ranker (the shipped one: 1)."""
SECTIONS = ("moe", "fallback", "generalization", "families")
"""The module docstring's sections by name, in order."""
CANDIDATES = ("current", "uncertainty_fallback_serial", "uncertainty_fallback_heuristic",
              "ranker_min_child_weight_5", "ranker_per_mode")  # fmt: skip
"""Section 3's pickers, ``current`` (what ships) first."""


def aligned_folds(groups: np.ndarray, reference: dict[str, int]) -> np.ndarray:
    """Fold of each row ``[n]``: ``reference[group]`` where the group has one, else ``GroupKFold`` over the
    other groups into as many folds as ``reference`` uses."""
    from sklearn.model_selection import GroupKFold

    folds = np.array([reference.get(g, -1) for g in groups])
    rest = np.flatnonzero(folds < 0)
    if len(rest):
        n_splits = min(len(set(reference.values())), len(set(groups[rest])))
        for fold, (_, test) in enumerate(GroupKFold(n_splits=n_splits).split(rest, groups=groups[rest])):
            folds[rest[test]] = fold
    return folds


def family_bootstrap(groups: np.ndarray, diff: np.ndarray, *, n: int = BOOTSTRAP, seed: int = 0) -> dict:
    """Mean of ``diff`` ``[n_rows]`` and its 95% interval, resampling whole ``groups`` with replacement."""
    names = sorted(set(groups))
    sums = np.array([diff[groups == g].sum() for g in names])
    counts = np.array([np.sum(groups == g) for g in names])
    draw = np.random.default_rng(seed).integers(0, len(names), size=(n, len(names)))
    means = sums[draw].sum(axis=1) / counts[draw].sum(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {"mean": float(diff.mean()), "ci95": [float(low), float(high)]}


def mode_metrics(table, picks: np.ndarray) -> dict:
    """:data:`METRICS` of ``picks`` on ``table`` per mode."""
    from ficco.training.metrics import score

    out = {}
    for mode in sorted(set(table.modes)):
        on = table.modes == mode
        metrics = score(table.subset(on), picks[on])
        out[mode] = {k: round(metrics[k], 4) for k in METRICS}
    return out


def log_regret(table, picks: np.ndarray) -> np.ndarray:
    """``log(t_pick / t_best)`` of each row ``[n]``."""
    return np.log(table.time_of(picks)[0] / table.best_ms)


def held_out_picks(table, folds: np.ndarray, config, policy, *, n_jobs: int) -> np.ndarray:
    """Held-out recommended columns ``[n]`` of ``config`` under ``policy`` (``training.crossval``)."""
    from ficco.training.crossval import held_out_costs
    from ficco.training.predict.policy import ModePolicy, apply_policy

    cost, ratio = held_out_costs(table, folds, (config,), seed=0, n_jobs=n_jobs, progress=False)
    return apply_policy(cost[0], ratio, ModePolicy.uniform(policy), table.modes)[0]


def paired(table, groups: np.ndarray, new: np.ndarray, old: np.ndarray) -> dict:
    """Per mode, :func:`family_bootstrap` of the log regret of picks ``new`` minus ``old``."""
    diff = log_regret(table, new) - log_regret(table, old)
    return {
        m: family_bootstrap(groups[table.modes == m], diff[table.modes == m])
        for m in sorted(set(table.modes))
    }


def moe_study(dense, both, config, policy, *, n_jobs: int) -> dict:
    """Section 1 of the module docstring."""
    from ficco.training.crossval import cv_folds, cv_groups

    groups = cv_groups(dense)
    folds = cv_folds(groups)
    both_folds = aligned_folds(cv_groups(both), dict(zip(groups.tolist(), folds.tolist(), strict=True)))
    on_dense = both.op_groups == "dense"
    if not np.array_equal(both.scenario_ids[on_dense], dense.scenario_ids):
        raise ValueError("the dense rows of the combined datasets differ from the dense dataset's")
    alone = held_out_picks(dense, folds, config, policy, n_jobs=n_jobs)
    joint = held_out_picks(both, both_folds, config, policy, n_jobs=n_jobs)
    moe = both.subset(~on_dense)
    moe_alone = held_out_picks(moe, both_folds[~on_dense], config, policy, n_jobs=n_jobs)
    return {
        "dense": {
            "dense_only": mode_metrics(dense, alone),
            "dense_and_moe": mode_metrics(dense, joint[on_dense]),
            "log_regret_difference": paired(dense, groups, joint[on_dense], alone),
        },
        "moe": {
            "moe_only": mode_metrics(moe, moe_alone),
            "dense_and_moe": mode_metrics(moe, joint[~on_dense]),
        },
        "moe_folds": {
            g: int(f) for g, f in sorted(set(zip(cv_groups(moe), both_folds[~on_dense], strict=True)))
        },
    }


def margin_options(raw: np.ndarray, signal: np.ndarray, target: np.ndarray, margins) -> np.ndarray:
    """``raw`` with ``target`` where ``signal < margin``, one row per margin: ``[len(margins), n]``."""
    margins = np.asarray(margins, dtype=np.float64)
    return np.where(signal[None, :] < margins[:, None], target[None, :], raw[None, :])


def select_options(table, folds: np.ndarray, options: np.ndarray) -> tuple[np.ndarray, dict]:
    """Each fold's rows of each mode from the option (a row of ``options`` ``[n_options, n]``) of lowest
    mean ``training.metrics.pick_loss`` on that mode's rows of the other folds: picks ``[n]``, and per mode
    the option index chosen for each fold in turn and on all folds (``all``)."""
    from ficco.training.metrics import pick_loss

    loss = np.stack([pick_loss(table.time_of(p)[0], table.best_ms, table.serial_ms) for p in options])
    final = options[0].copy()
    chosen: dict[str, dict] = {}
    for mode in sorted(set(table.modes)):
        on = table.modes == mode
        per_fold = []
        for fold in sorted(set(folds.tolist())):
            best = int(np.argmin(loss[:, on & (folds != fold)].mean(axis=1)))
            final[on & (folds == fold)] = options[best, on & (folds == fold)]
            per_fold.append(best)
        chosen[mode] = {"folds": per_fold, "all": int(np.argmin(loss[:, on].mean(axis=1)))}
    return final, chosen


def margin_picks(table, folds: np.ndarray, raw: np.ndarray, signal: np.ndarray, margins) -> np.ndarray:
    """``raw`` with serial/sm where ``signal < margin``, the margin chosen per mode on the other folds."""
    from ficco.training.model import SERIAL_INDEX

    serial = np.full(len(table), SERIAL_INDEX)
    return select_options(table, folds, margin_options(raw, signal, serial, margins))[0]


def fallback_study(dense, config, *, n_jobs: int) -> dict:
    """Section 2 of the module docstring."""
    from ficco.training.crossval import cv_folds, cv_groups, held_out_costs
    from ficco.training.model import SERIAL_INDEX

    groups = cv_groups(dense)
    folds = cv_folds(groups)
    cost, ratio = held_out_costs(dense, folds, (config,), seed=0, n_jobs=n_jobs, progress=False)
    rows = np.arange(len(dense))
    raw = cost[0].argmin(axis=1)
    signals = {
        "ratio_regressor": (-ratio[rows, raw], RATIO_MARGINS),
        "rank_score_difference": (cost[0][rows, SERIAL_INDEX] - cost[0][rows, raw], RANK_MARGINS),
    }
    out = {"no_fallback": mode_metrics(dense, raw)}
    for name, (signal, margins) in signals.items():
        picks = margin_picks(dense, folds, raw, signal, margins)
        out[name] = {**mode_metrics(dense, picks), "against_no_fallback": paired(dense, groups, picks, raw)}
    return out


def fit_ranker(table, *, n_jobs: int, seed: int = 0, **params):
    """A ``training.model.PairModel`` of ``params`` fitted on every measured pair of ``table`` (the ranker
    needs ``objective="rank"`` among them)."""
    from ficco.training.fit import training_pairs
    from ficco.training.model import PairModel

    Z, y, qid = training_pairs(table)
    return PairModel(random_state=seed, n_jobs=n_jobs, **params).fit(Z, y, qid=qid)


def fit_on(tables, config, *, n_jobs: int, seed: int = 0):
    """``config``'s ``training.model.PairModel`` fitted on every measured pair of all ``tables``, each
    table's pairs at its own host factor (``training.fit.training_pairs``), one query per table row."""
    from ficco.training.fit import training_pairs

    parts = [training_pairs(table) for table in tables]
    offsets = np.cumsum([0, *(len(table) for table in tables[:-1])])
    return config.estimator(seed=seed, n_jobs=n_jobs).fit(
        np.concatenate([Z for Z, _, _ in parts]),
        np.concatenate([y for _, y, _ in parts]),
        qid=np.concatenate([q + o for (_, _, q), o in zip(parts, offsets, strict=True)]),
    )


def families_study(base, extra: dict[str, object], config, *, n_jobs: int) -> dict:
    """Section 4: ``extra`` maps a dataset name to its table; per ordered pair (added, tested), the metrics
    of the model trained on ``base`` alone and on ``base`` plus ``added``'s fresh scenarios, on ``tested``'s
    scenarios that neither holds (``skipped`` where none is left: the same families measured twice)."""
    from ficco.training.evaluate import unseen
    from ficco.training.model import pair_costs

    def fresh(table, *others):
        for other in others:
            table = unseen(table, other)[0]
        return table

    def metrics(model, test) -> dict:
        picks = np.argmin(pair_costs(model, test.X, test.modes, test.host_factors), axis=1)
        return mode_metrics(test, picks)

    alone = fit_on([base], config, n_jobs=n_jobs)
    out = {}
    for added, table in extra.items():
        added_rows = fresh(table, base)
        model = fit_on([base, added_rows], config, n_jobs=n_jobs)
        for tested, other in extra.items():
            if tested == added:
                continue
            pair = f"+{added} -> {tested}"
            try:
                test = fresh(other, base, added_rows)
            except ValueError as err:  # the same families measured twice: nothing unseen is left
                out[pair] = {"skipped": str(err)}
                continue
            out[pair] = {"base": metrics(alone, test), "base_plus_added": metrics(model, test)}
    return out


def split_predictions(train, test, config, *, n_jobs: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Every model of section 3 fitted on ``train`` and evaluated on ``test`` (``n`` rows, ``S`` schedules):
    ``rank`` (the shipped ranker's cost ``[n, S]``), ``log_ratio`` (the time-ratio regressor's
    ``log(t / t_serial)`` ``[n, S]``), ``bags`` (the family-bagged regressors' ``[BAGS, n, S]``),
    ``regularised`` and ``per_mode`` (the candidate rankers' costs ``[n, S]``), ``heuristic`` (the size
    heuristic's pick ``[n]``) and ``modes`` (the test rows' ``[n]``)."""
    from ficco.training.crossval import cv_groups
    from ficco.training.evaluate import split_baselines
    from ficco.training.fit import RATIO_CONFIG, fit_pair_model
    from ficco.training.model import pair_costs

    def costs(model, rows=None):
        held = test if rows is None else test.subset(rows)
        return pair_costs(model, held.X, held.modes, held.host_factors)

    ranker = {"objective": config.objective, "max_depth": config.max_depth,
              "n_estimators": config.n_estimators, "learning_rate": config.learning_rate}  # fmt: skip
    groups = cv_groups(train)
    names = np.array(sorted(set(groups)), dtype=object)
    rng = np.random.default_rng(seed)
    bags = []
    for b in range(BAGS):
        kept = names[rng.random(len(names)) >= BAG_DROP]
        bag = train.subset(np.isin(groups, kept if len(kept) >= 2 else names[:2]))
        bags.append(costs(fit_pair_model(bag, RATIO_CONFIG, seed=seed + 1 + b, n_jobs=n_jobs)))
    out = {
        "rank": costs(fit_ranker(train, n_jobs=n_jobs, **ranker)),
        "log_ratio": costs(fit_pair_model(train, RATIO_CONFIG, seed=seed, n_jobs=n_jobs)),
        "bags": np.stack(bags),
        "regularised": costs(fit_ranker(train, n_jobs=n_jobs, min_child_weight=MIN_CHILD_WEIGHT, **ranker)),
        "per_mode": np.zeros(test.times_ms.shape),
        "heuristic": np.zeros(len(test), dtype=np.int64),
        "modes": test.modes,
    }
    for mode in sorted(set(test.modes)):
        on = test.modes == mode
        alone = fit_ranker(train.subset(train.modes == mode), n_jobs=n_jobs, **ranker)
        out["per_mode"][on] = costs(alone, on)
        out["heuristic"][on] = split_baselines(train, test.subset(on))["size_heuristic"]
    return out


def candidate_options(pred: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, list[str]]]:
    """Each of :data:`CANDIDATES`' picks under every option, from :func:`split_predictions`: name ->
    (picks ``[n_options, n]``, a label per option)."""
    from ficco.training.model import SERIAL_INDEX
    from ficco.training.predict.policy import POLICY_GRID, ModePolicy, apply_policy

    gains = [p.min_gain for p in POLICY_GRID]
    margins = [-np.inf if g is None else np.log1p(g) for g in gains]
    rows = np.arange(len(pred["heuristic"]))
    serial = np.full(len(rows), SERIAL_INDEX)

    def fallback(cost: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """``training.predict.policy``'s rule under every policy of its grid: the guard against schedules
        predicted slower than serial, then serial/sm below ``min_gain`` of the regressor's predicted
        speedup."""
        picks = [
            apply_policy(cost, pred["log_ratio"], ModePolicy.uniform(p), pred["modes"]).final
            for p in POLICY_GRID
        ]
        return np.stack(picks), [f"min_gain={g}" for g in gains]

    raw = pred["rank"].argmin(axis=1)
    ensemble = -np.concatenate([pred["log_ratio"][None], pred["bags"]])[:, rows, raw]  # [1 + BAGS, n]
    mean, std = ensemble.mean(axis=0), ensemble.std(axis=0)
    labels = [f"z={z},min_gain={g}" for z in LCB_WIDTHS for g in gains]

    def bounded(target: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """Falls back to ``target`` where ``mean - z * std`` is below the margin, for every (z, margin)."""
        picks = [margin_options(raw, mean - z * std, target, margins) for z in LCB_WIDTHS]
        return np.concatenate(picks), labels

    return {
        "current": fallback(pred["rank"]),
        "uncertainty_fallback_serial": bounded(serial),
        "uncertainty_fallback_heuristic": bounded(pred["heuristic"]),
        "ranker_min_child_weight_5": fallback(pred["regularised"]),
        "ranker_per_mode": fallback(pred["per_mode"]),
    }


def generalization_study(table, config, *, n_jobs: int) -> dict:
    """Section 3 of the module docstring."""
    from ficco.training.crossval import cv_folds, cv_groups, region_holdout

    groups = cv_groups(table)
    folds = cv_folds(groups)
    options: dict[str, np.ndarray] = {}
    for fold in sorted(set(folds.tolist())):
        test = folds == fold
        pred = split_predictions(table.subset(~test), table.subset(test), config, n_jobs=n_jobs)
        for name, (picks, _) in candidate_options(pred).items():
            options.setdefault(name, np.zeros((len(picks), len(table)), dtype=np.int64))[:, test] = picks
    region = region_holdout(table)
    held = table.subset(region)
    region_options = candidate_options(split_predictions(table.subset(~region), held, config, n_jobs=n_jobs))
    dense = table.op_groups == "dense"
    out: dict[str, dict] = {"family_holdout": {}, "region_holdout": {}, "against_current": {}, "chosen": {}}
    picks: dict[str, np.ndarray] = {}
    for name in CANDIDATES:
        region_picks, labels = region_options[name]
        picks[name], chosen = select_options(table, folds, options[name])
        out["family_holdout"][name] = {
            group: mode_metrics(table.subset(on), picks[name][on])
            for group, on in (("dense", dense), ("moe", ~dense))
            if on.any()
        }
        on_all = np.zeros(len(held), dtype=np.int64)
        for mode, choice in chosen.items():
            on_all[held.modes == mode] = region_picks[choice["all"], held.modes == mode]
        out["region_holdout"][name] = mode_metrics(held, on_all)
        out["chosen"][name] = {
            mode: {"folds": [labels[i] for i in c["folds"]], "all": labels[c["all"]]}
            for mode, c in chosen.items()
        }
        if name != "current":
            out["against_current"][name] = paired(
                table.subset(dense), groups[dense], picks[name][dense], picks["current"][dense]
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dense", type=Path, required=True, help="dense dataset directory")
    parser.add_argument("--moe", type=Path, required=True, help="MoE dataset directory (same hardware)")
    parser.add_argument(
        "--repeat", type=Path, action="append", default=[], help="repeat sweep pooled into section 3's labels"
    )
    parser.add_argument(
        "--section", action="append", choices=SECTIONS, help="repeat it (default: moe, fallback)"
    )
    parser.add_argument(
        "--families", type=Path, action="append", default=[], help="section 4: a dataset of other families"
    )
    parser.add_argument("--config", default=None, help="a TrainConfig.key of CONFIG_GRID (default: its last)")
    parser.add_argument("--min-gain", type=float, default=None, help="fallback threshold (default: none)")
    parser.add_argument("--jobs", type=int, default=1, help="XGBoost threads")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from ficco.training.dataset_table import load_dataset_table
    from ficco.training.fit import CONFIG_GRID
    from ficco.training.predict.policy import DecisionPolicy

    configs = {c.key(): c for c in CONFIG_GRID}
    if args.config is not None and args.config not in configs:
        parser.error(f"--config must be one of {list(configs)}; got {args.config!r}")
    config = configs[args.config or CONFIG_GRID[-1].key()]
    policy = DecisionPolicy(min_gain=args.min_gain)
    sections = args.section or SECTIONS[:2]
    result = {"config": config.to_dict(), "policy": policy.to_dict()}
    if {"moe", "fallback"} & set(sections):
        dense = load_dataset_table(args.dense).table
    if "moe" in sections:
        both = load_dataset_table(args.dense, args.moe).table
        result["moe"] = moe_study(dense, both, config, policy, n_jobs=args.jobs)
    if "fallback" in sections:
        result["fallback"] = fallback_study(dense, config, n_jobs=args.jobs)
    if "generalization" in sections:
        data = load_dataset_table(args.dense, args.moe, repeats=args.repeat)
        info = {k: data.info[k] for k in ("path", "repeats", "hash", "n_rows_by_mode") if k in data.info}
        result["generalization"] = {
            "data": info, "bags": BAGS, "bag_drop": BAG_DROP, "lcb_widths": list(LCB_WIDTHS),
            **generalization_study(data.table, config, n_jobs=args.jobs),
        }  # fmt: skip
    if "families" in sections:
        if len(args.families) < 2:
            parser.error(f"--section families needs --families at least twice; got {len(args.families)}")
        base = load_dataset_table(args.dense, args.moe).table
        extra = {path.name: load_dataset_table(path).table for path in args.families}
        result["families"] = families_study(base, extra, config, n_jobs=args.jobs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
