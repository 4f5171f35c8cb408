"""Safe picks: can a decision rule keep every pick within 2% of serial without losing regret elsewhere?

    .venv/bin/python -m benchmarks.studies.safe_picks --out reports/safe-picks-h200x2.json

Two questions, both scored the way ``ficco evaluate`` scores (held-out picks of the training data under
``training.crossval``'s folds, their rescore against the independent sweep ``datasets/h200x2-v2``, and a
model fitted on all the training data scored on the four unseen-family sets):

1. **The pick model.** Rules on top of the shipped ranker (``benchmarks.studies.graph_study``'s fits), each
   applied to graph-mode picks, or to both modes (``+eager``):

   - ``fallback_<g>``: serial/sm where the time-ratio regressor predicts the pick less than ``g`` faster
     than serial (``training.predict.policy``'s fallback);
   - ``veto_classifier``: a classifier of "more than 2% slower than serial" over the pair features (XGBoost
     ``binary:logistic``, depth 6, 100 trees); the best-ranked schedule whose probability is at most a
     threshold is picked (serial/sm is never vetoed), the threshold chosen per fold on the other folds'
     held-out graph regret (``training.crossval``'s way of choosing a fallback);
   - ``veto_neighbours``: the data's own verdict: a schedule is vetoed where, among the training rows of
     the same op, mode and world size within a factor 2**0.6 in each of rows, n and k, at least half
     measured it more than 2% slower than serial.

2. **The serial-or-async-TP drop-in** (``training.baselines.AsyncTPModel``) at each gain it asks of
   async-TP before leaving serial, against vLLM's rule (``training.peer_rules``) and the per-scenario
   best of the two: is there a threshold with no more slower-than-serial picks than vLLM's rule on every
   set and within 1 point of the best of the two?

Prints both tables and writes the JSON (``--out``). Single-threaded XGBoost; the fits are deterministic.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks import REPO, study_main
from benchmarks.studies import graph_study as gs

FALLBACK_GAINS = (0.0, 0.02, 0.05)
"""Gains ``g`` of the fallback candidates."""
VETO_THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7, 1.01)
"""Classifier probabilities above which a schedule is vetoed (1.01: never), chosen per fold."""
NEIGHBOUR_RADIUS = 0.6
"""``log2`` distance (each of rows, n, k) within which a training row is a neighbour."""
NEIGHBOUR_SHARE = 0.5
"""Share of neighbours measuring a schedule slow that vetoes it."""
ASYNC_TP_GAINS = (0.0, 0.02, 0.05, 0.08, 0.1, 0.15)
"""Gains the serial-or-async-TP drop-in asks of async-TP, beyond its cross-validated choice."""
SLOW = 1.02
"""A pick more than 2% slower than serial/sm (``training.metrics``' ``WITHIN``)."""


def classifier(table):
    """XGBoost classifier of ``t / t_serial > SLOW`` over every measured pair of ``table``: a Booster."""
    import xgboost as xgb

    Z, rows, cols = gs.pairs(table, np.isfinite(table.times_ms), None)
    y = (table.times_ms[rows, cols] / table.serial_ms[rows] > SLOW).astype(np.float64)
    model = xgb.XGBClassifier(
        n_estimators=100, max_depth=6, learning_rate=0.2, n_jobs=1, tree_method="hist", random_state=0
    )
    model.fit(Z, y)
    return model.get_booster()


def slow_probability(booster, table) -> np.ndarray:
    """The classifier's probability of each valid (row, schedule) being slow, ``[n, S]`` (0: serial/sm or
    invalid)."""
    from ficco.training.predict.pairs import SERIAL_INDEX, valid_mask

    Z, rows, cols = gs.pairs(table, valid_mask(table.X), None)
    out = np.zeros(table.times_ms.shape)
    out[rows, cols] = booster.inplace_predict(Z)
    out[:, SERIAL_INDEX] = 0.0
    return out


def neighbour_veto(train, test) -> np.ndarray:
    """Where ``train``'s neighbours of each ``test`` row measured a schedule slow, bool ``[n_test, S]``
    (module docstring)."""
    from ficco.training.predict.pairs import SERIAL_INDEX

    def shape(t):
        return np.log2([[s.rows, s.n, s.k] for s in t.scenarios]), [(s.op, s.world_size) for s in t.scenarios]

    (f_train, k_train), (f_test, k_test) = shape(train), shape(test)
    measured = np.isfinite(train.times_ms)
    with np.errstate(invalid="ignore"):
        slow = train.times_ms / train.serial_ms[:, None] > SLOW
    out = np.zeros(test.times_ms.shape, dtype=bool)
    for i in range(len(test)):
        same = np.array([k == k_test[i] for k in k_train]) & (train.modes == test.modes[i])
        near = same & (np.abs(f_train - f_test[i]).max(axis=1) <= NEIGHBOUR_RADIUS)
        n_measured = measured[near].sum(axis=0)
        out[i] = (n_measured > 0) & (slow[near].sum(axis=0) >= NEIGHBOUR_SHARE * np.maximum(n_measured, 1))
    out[:, SERIAL_INDEX] = False
    return out


def apply(cost: np.ndarray, veto: np.ndarray, on: np.ndarray) -> np.ndarray:
    """The best-ranked schedule not vetoed on rows ``on`` (the plain pick elsewhere), ``[n]``."""
    return np.where(on[:, None] & veto, np.inf, cost).argmin(axis=1)


def fallback(cost: np.ndarray, ratio: np.ndarray, modes: np.ndarray, gain: float, both: bool) -> np.ndarray:
    """The picks under ``training.predict.policy``'s fallback at ``gain`` in graph mode (and eager mode when
    ``both``): serial/sm where the regressor's predicted speedup of the pick is below ``1 + gain``."""
    from ficco.training.predict.policy import DecisionPolicy, ModePolicy, apply_policy

    on, off = DecisionPolicy(min_gain=gain), DecisionPolicy()
    return apply_policy(cost, ratio, ModePolicy(eager=on if both else off, graph=on), modes)[0]


def graph_log_regret(table, picks: np.ndarray, on: np.ndarray) -> float:
    """Mean log regret of ``picks`` over ``table``'s graph rows selected by ``on``."""
    n = np.arange(len(picks))
    return float(np.mean(np.log(table.times_ms[n, picks] / table.best_ms)[on & (table.modes == "graph")]))


def pick_model_rules(table, noise, v2, tests: dict, folds: np.ndarray) -> dict:
    """Question 1: every rule's CV, v2 and unseen-set scores per mode."""
    held = {k: np.zeros(table.times_ms.shape) for k in ("rank", "ratio", "slow", "near")}
    for fold in sorted(set(folds.tolist())):
        test = folds == fold
        train, sub = table.subset(~test), table.subset(test)
        held["rank"][test] = gs.costs(gs.fit(train, None), sub, None)
        held["ratio"][test] = gs.costs(gs.fit(train, None, objective="ratio"), sub, None, objective="ratio")
        held["slow"][test] = slow_probability(classifier(train), sub)
        held["near"][test] = neighbour_veto(train, sub)
    rank, ratio, clf = gs.fit(table, None), gs.fit(table, None, objective="ratio"), classifier(table)
    full = {
        name: {
            "rank": gs.costs(rank, t, None),
            "ratio": gs.costs(ratio, t, None, objective="ratio"),
            "slow": slow_probability(clf, t),
            "near": neighbour_veto(table, t),
        }
        for name, t in tests.items()
    }
    graph = table.modes == "graph"
    chosen = []
    veto_cv = np.zeros(len(table), dtype=int)
    for fold in sorted(set(folds.tolist())):
        test = folds == fold
        th = min(VETO_THRESHOLDS, key=lambda p: graph_log_regret(
            table, apply(held["rank"], held["slow"] > p, graph), ~test))  # fmt: skip
        chosen.append(th)
        veto_cv[test] = apply(held["rank"], held["slow"] > th, graph)[test]
    th_all = min(VETO_THRESHOLDS, key=lambda p: graph_log_regret(
        table, apply(held["rank"], held["slow"] > p, graph), np.ones(len(table), dtype=bool)))  # fmt: skip

    def rules(h: dict, modes: np.ndarray, both: bool, cv_veto: np.ndarray | None) -> dict[str, np.ndarray]:
        on = np.ones(len(modes), dtype=bool) if both else modes == "graph"
        out = {f"fallback_{g:g}": fallback(h["rank"], h["ratio"], modes, g, both) for g in FALLBACK_GAINS}
        out["veto_classifier"] = cv_veto if cv_veto is not None else apply(h["rank"], h["slow"] > th_all, on)
        out["veto_neighbours"] = apply(h["rank"], h["near"] > 0, on)
        return out

    results = {"current": score_all(table, noise, v2, tests, held["rank"].argmin(axis=1),
                                    {t: full[t]["rank"].argmin(axis=1) for t in tests})}  # fmt: skip
    for both in (False, True):
        # in both modes the classifier's threshold is the one chosen on all graph rows (not per fold)
        cv = rules(held, table.modes, both, None if both else veto_cv)
        by_set = {t: rules(full[t], tests[t].modes, both, None) for t in tests}
        for name, picks in cv.items():
            key = name + ("+eager" if both else "")
            results[key] = score_all(table, noise, v2, tests, picks, {t: by_set[t][name] for t in tests})
    results["veto_classifier"]["thresholds_per_fold"] = chosen
    results["veto_classifier"]["threshold_full_fit"] = th_all
    return results


def score_all(table, noise, v2, tests: dict, cv_picks: np.ndarray, unseen_picks: dict) -> dict:
    """CV (with the ceiling rows and v2) and per-unseen-set scores of one rule's picks."""
    by_set = {t: gs.mode_scores(tests[t], unseen_picks[t]) for t in tests}
    return {
        "cv": gs.mode_scores(table, cv_picks, noise, v2),
        "unseen": by_set,
        "unseen_mean": {
            m: float(np.mean([s[m]["geomean_regret"] for s in by_set.values()])) for m in ("eager", "graph")
        },
    }


def async_tp_tradeoff(table, tests: dict, folds: np.ndarray) -> dict:
    """Question 2: per gain, per set and mode, the drop-in's regret and slow picks beside vLLM's rule's slow
    picks and the best of serial or async-TP (rows that measured async-TP)."""
    from ficco.training.baselines import AsyncTPModel
    from ficco.training.peer_rules import vllm_sp_rule

    log_ratio = np.zeros(len(table))
    for fold in sorted(set(folds.tolist())):
        test = folds == fold
        model = AsyncTPModel().fit(table.subset(~test))
        log_ratio[test] = model.predict_log_ratio(table.X[test], table.modes[test], table.host_factors[test])
    model = AsyncTPModel().fit(table)
    sets = {"family holdout": (table, log_ratio)}
    sets |= {t: (s, model.predict_log_ratio(s.X, s.modes, s.host_factors)) for t, s in tests.items()}
    out = {"cv_chosen": model.min_gain_, "gains": {}}
    for gain in ASYNC_TP_GAINS:
        cells = {}
        for name, (t, lr) in sets.items():
            has = np.isfinite(t.async_tp_ms)
            fused, vllm = (-lr >= np.log1p(gain))[has], vllm_sp_rule(t.scenarios)[has]
            serial, atp, best = t.serial_ms[has], t.async_tp_ms[has], t.best_ms[has]
            for mode in ("eager", "graph"):
                on = t.modes[has] == mode
                ours = np.where(fused, atp, serial)[on]
                theirs = np.where(vllm, atp, serial)[on]
                cells[f"{name}/{mode}"] = {
                    "regret": float(np.expm1(np.mean(np.log(ours / best[on])))),
                    "slow": int(np.sum(ours > SLOW * serial[on])),
                    "oracle_regret": float(np.expm1(np.mean(np.log(np.minimum(atp, serial)[on] / best[on])))),
                    "vllm_slow": int(np.sum(theirs > SLOW * serial[on])),
                }
        out["gains"][f"{gain:g}"] = cells
    return out


def study() -> dict:
    """Both questions' results (module docstring)."""
    from ficco.training.crossval import cv_folds, cv_groups
    from ficco.training.dataset_table import load_dataset_table
    from ficco.training.evaluate import unseen

    loaded = load_dataset_table(*(REPO / p for p in gs.TRAINING))
    table, noise = loaded.table, loaded.noise
    v2 = load_dataset_table(REPO / "datasets/h200x2-v2").table
    tests = {Path(p).name: unseen(load_dataset_table(REPO / p).table, table)[0] for p in gs.UNSEEN}
    folds = cv_folds(cv_groups(table))
    return {
        "pick_model": pick_model_rules(table, noise, v2, tests, folds),
        "async_tp_drop_in": async_tp_tradeoff(table, tests, folds),
    }


def pick_model_table(results: dict) -> str:
    """Question 1 as a text table: CV (and v2) regret and slow picks, unseen-set means and slow picks."""
    from ficco.tables import text_table

    def slow(cell: dict, prefix: str = "") -> str:
        return str(cell[f"{prefix}n_slower_than_serial_2pct"])

    rows = []
    for name, r in results.items():
        e, g = r["cv"]["eager"], r["cv"]["graph"]
        per_set = {m: ",".join(slow(r["unseen"][t][m]) for t in r["unseen"]) for m in ("eager", "graph")}
        rows.append([
            name, f"{e['geomean_regret']:.2%}", slow(e), f"{g['geomean_regret']:.2%}", slow(g),
            f"{g['v2_geomean_regret']:.2%}", slow(g, "v2_"),
            f"{r['unseen_mean']['eager']:.3%}", per_set["eager"],
            f"{r['unseen_mean']['graph']:.3%}", per_set["graph"],
        ])  # fmt: skip
    header = ["rule", "CV eager", "slow", "CV graph", "slow", "v2 graph", "slow",
              "unseen eager", "slow per set", "unseen graph", "slow per set"]  # fmt: skip
    return text_table(header, rows, align="<" + ">" * (len(header) - 1))


def async_tp_table(trade: dict) -> str:
    """Question 2 as a text table: per gain and mode, each set's regret (slow picks), the best of serial or
    async-TP and vLLM's rule's slow picks."""
    from ficco.tables import text_table

    sets = list(dict.fromkeys(key.split("/")[0] for key in next(iter(trade["gains"].values()))))
    rows = []
    for gain, cells in trade["gains"].items():
        for mode in ("eager", "graph"):
            row = [cells[f"{s}/{mode}"] for s in sets]
            rows.append([gain, mode, *(f"{c['regret']:.2%} ({c['slow']}); {c['oracle_regret']:.2%}; "
                                       f"({c['vllm_slow']})" for c in row)])  # fmt: skip
    title = (f"serial-or-async-TP drop-in (cross-validated gain {trade['cv_chosen']}): regret (slow picks); "
             "best of serial or async-TP; (vLLM's rule's slow picks)")  # fmt: skip
    return title + "\n" + text_table(["gain", "mode", *sets], rows, align="<<" + ">" * len(sets))


def main() -> None:
    tables = (lambda r: pick_model_table(r["pick_model"]), lambda r: async_tp_table(r["async_tp_drop_in"]))
    study_main(__doc__, REPO / "reports" / "safe-picks-h200x2.json", study, *tables)


if __name__ == "__main__":
    main()
