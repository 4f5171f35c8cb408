"""Priors for a new machine: one merged booster per model, the prior alone before any row, and a prior that
fades when the new machine's rows say it is wrong."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from ficco.features import get_hardware
from ficco.training.dataset_table import build_table
from ficco.training.model import PAIR_FEATURE_NAMES, SERIAL_INDEX, pair_costs
from ficco.training.predict.policy import apply_policy
from ficco.training.priors import (
    PRIOR_POLICY,
    RANKER_CONFIG,
    Prior,
    build_prior,
    fit_with_prior,
    merge_boosters,
    scaled,
)

from .conftest import synthetic_frame

MODE = PAIR_FEATURE_NAMES.index("mode_graph")


@pytest.fixture(scope="module")
def x4():
    """The new machine: the toy times at TP=4."""
    return build_table(synthetic_frame(n_grid=40, seed=3, hardware_id="h200x4"), get_hardware("h200x4"))


@pytest.fixture(scope="module")
def x2():
    """Another machine's measurements: the toy times at TP=2."""
    return build_table(synthetic_frame(n_grid=40, seed=4, hardware_id="h200x2"), get_hardware("h200x2"))


def _inverted(table):
    """``table`` with every schedule's time turned around its serial time: the fastest is now the slowest."""
    times = table.serial_ms[:, None] ** 2 / table.times_ms
    return dataclasses.replace(table, times_ms=times, in_best=times <= np.nanmin(times, axis=1)[:, None])


def _prior(x4, measured, simulated):
    return build_prior("h200x4", measured=measured, simulated=simulated, plan_X=x4.X, plan_modes=x4.modes)


@pytest.fixture(scope="module")
def prior(x4, x2):
    """A prior from the other machine's rows and 'simulated' rows of the new one (its own toy times with
    other noise: the simulator as it would be if it were right)."""
    rows = synthetic_frame(n_grid=40, seed=3, noise=0.02, hardware_id="h200x4")
    sim = build_table(rows, get_hardware("h200x4"))
    return _prior(x4, {"x2": x2}, {"x4-sim": sim})


def _regret(table, fit) -> float:
    cost = pair_costs(fit.scorer, table.X, table.modes, table.host_factor)
    ratio = pair_costs(fit.ratio, table.X, table.modes, table.host_factor)
    t = table.time_of(apply_policy(cost, ratio, fit.policy, table.modes)[0])[0]
    return float(np.expm1(np.mean(np.log(t / table.best_ms))))


def test_merge_boosters_scales_each_mode_on_both_prediction_paths(tmp_path):
    import xgboost as xgb

    from ficco.training.predict.booster import NumpyBooster

    rng = np.random.default_rng(0)
    Z = rng.random((400, len(PAIR_FEATURE_NAMES))).astype(np.float32)
    Z[:, MODE] = rng.integers(0, 2, len(Z))
    y = Z[:, 0] + Z[:, MODE] * Z[:, 1]
    regressor = xgb.train({"max_depth": 3}, xgb.DMatrix(Z, y), 5)
    ranker = xgb.train({"max_depth": 3, "objective": "rank:ndcg"},
                       xgb.DMatrix(Z, (3 * y).astype(int), qid=np.repeat(np.arange(40), 10)), 5)  # fmt: skip
    merged = merge_boosters([(regressor, (2.0, -1.0)), (ranker, 0.5), (regressor, (0.0, 3.0))], "ndcg")
    a, b = regressor.inplace_predict(Z), ranker.inplace_predict(Z)
    expected = np.where(Z[:, MODE] == 1, -a + 0.5 * b + 3.0 * a, 2.0 * a + 0.5 * b)
    np.testing.assert_allclose(merged.inplace_predict(Z), expected, atol=1e-5)
    merged.save_model(tmp_path / "m.ubj")
    np.testing.assert_allclose(NumpyBooster.load(tmp_path / "m.ubj").inplace_predict(Z), expected, atol=1e-5)
    assert json.loads(merged.save_config())["learner"]["objective"]["name"] == "rank:ndcg"
    with pytest.raises(ValueError, match="no part is of objective 'ndcg'"):
        merge_boosters([(regressor, 1.0)], "ndcg")


def test_the_prior_alone_picks_before_any_row_and_says_what_it_was_built_from(prior, x4, tmp_path):
    assert prior.components == ("measured elsewhere", "simulated here")  # no simulator of x2: no correction
    fit = fit_with_prior(None, prior)
    assert fit.choice == {"eager": "prior+spread", "graph": "prior+spread"} and fit.policy == PRIOR_POLICY
    log_ratio = prior.log_ratio(x4.X, x4.modes, x4.host_factor)
    cost = pair_costs(fit.scorer, x4.X, x4.modes, x4.host_factor)
    np.testing.assert_allclose(cost[np.isfinite(cost)], log_ratio[np.isfinite(cost)], atol=1e-5)
    ratio = pair_costs(fit.ratio, x4.X, x4.modes, x4.host_factor)
    spread = prior.uncertainty(x4.X, x4.modes, x4.host_factor)
    valid = np.isfinite(cost)
    np.testing.assert_allclose(ratio[valid] - cost[valid], 0.5 * spread[valid], atol=1e-5)
    assert np.mean(spread[valid] > 0) > 0.9  # pessimistic by the sources' disagreement
    recorded = json.loads(fit.scorer.booster_.attr("ficco_prior"))
    assert [s["name"] for s in recorded["prior"]["sources"]] == ["x2", "x4-sim"]
    assert [s["backend"] for s in recorded["prior"]["sources"]] == ["measured", "simulated"]
    assert _regret(x4, fit) < float(np.expm1(np.mean(np.log(x4.serial_ms / x4.best_ms))))
    again = Prior.load(prior.save(tmp_path / "prior"))
    np.testing.assert_array_equal(again.log_ratio(x4.X, x4.modes, x4.host_factor), log_ratio)
    assert again.info() == prior.info()


@pytest.mark.heavy
def test_a_wrong_prior_fades_when_the_new_rows_contradict_it(x4, x2):
    """A prior from inverted times (the fastest schedule predicted slowest) loses to the new rows alone in
    cross-validation, and the fitted model picks as well as the one without the prior."""
    wrong = _prior(x4, {"x2": _inverted(x2)}, {"x4-sim": _inverted(x4)})
    train = x4.subset(np.isin(x4.families, ["toy-small", "toy-large", "grid"]))
    test = x4.subset(np.isin(x4.families, ["toy-mid", "toy-wide"]))
    with_prior = fit_with_prior(train, wrong)
    alone = fit_with_prior(train, None)
    assert set(with_prior.choice.values()) == {"target"}, with_prior.info["cv_loss"]
    assert _regret(test, with_prior) <= _regret(test, alone) + 0.005
    assert _regret(test, fit_with_prior(None, wrong)) > _regret(test, alone) + 0.02  # it was wrong


def test_a_right_prior_keeps_its_weight_with_few_rows(prior, x4):
    few = x4.subset(np.isin(x4.scenario_ids, sorted(set(x4.scenario_ids))[:6]))
    fit = fit_with_prior(few, prior)
    assert all(c != "target" for c in fit.choice.values()), fit.info["cv_loss"]
    assert fit.info["n_target_scenarios"] == 6
    assert fit.info["trees"]["ranker"] == scaled(RANKER_CONFIG, 6).n_estimators == 10
    assert _regret(x4, fit) < 0.05


def test_fit_with_prior_refuses_nothing_to_learn_from_and_rows_of_another_machine(prior, x2):
    with pytest.raises(ValueError, match="needs target rows or a prior"):
        fit_with_prior(None, None)
    with pytest.raises(ValueError, match="the prior is of 'h200x4' and the target rows of 'h200x2'"):
        fit_with_prior(x2, prior)
    with pytest.raises(ValueError, match="must be of other machines than 'h200x2'"):
        build_prior("h200x2", measured={"x2": x2}, simulated={}, plan_X=x2.X, plan_modes=x2.modes)


def test_the_trees_scale_with_the_rows():
    assert [scaled(RANKER_CONFIG, n).n_estimators for n in (0, 5, 25, 100, 400)] == [10, 10, 25, 100, 100]


def test_a_mode_without_rows_keeps_the_prior(prior, x4):
    eager = x4.subset(x4.modes == "eager")
    fit = fit_with_prior(eager, prior)
    assert fit.choice["graph"] == "prior+spread" and fit.policy.graph == PRIOR_POLICY.graph
    serial_only = np.full(len(x4), SERIAL_INDEX)
    assert _regret(x4, fit) < float(np.expm1(np.mean(np.log(x4.time_of(serial_only)[0] / x4.best_ms))))


def test_what_the_prior_does_not_know_orders_the_sweep(prior, x4):
    from ficco.training.sweep_order import measurement_order, scenario_uncertainty

    value = scenario_uncertainty(x4.X, prior, x4.host_factor)
    assert value.shape == (len(x4),) and np.all(value >= 0) and value.max() > 0
    assert measurement_order(x4.X, value)[0] == int(np.argmax(value))
