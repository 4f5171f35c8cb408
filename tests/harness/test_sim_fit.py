"""Fitting the simulator: which measured rows it keeps, that a fit recovers the constants that made a
dataset, held-out families, scoring its picks, the guard, and the fidelity it records."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ficco.features import Scenario, candidates, get_hardware
from ficco.features.dataset import rows_frame
from ficco.harness.dataset import result_rows
from ficco.harness.sim import DEFAULT_CONSTANTS, MEASURED_FIDELITY, SimBackend, sim_fidelity
from ficco.harness.sim_fit import (
    agreement,
    calibrate,
    choose_guard,
    cross_validate,
    current_rows,
    family_folds,
    fit,
    frame_observations,
    pick_table,
    regret_summary,
    term_errors,
)

REPO = Path(__file__).resolve().parents[2]


def _frame(backend: SimBackend, scenarios: list[tuple[str, Scenario]]) -> pd.DataFrame:
    rows = []
    for family, s in scenarios:
        rows += result_rows(family, s, backend.measure(s, candidates(s)), "sim")
    return rows_frame(rows)


def _scenarios(hw, families=("a", "b", "c")) -> list[tuple[str, Scenario]]:
    shapes = [(op, m, n, k) for op in ("ag_gemm", "gemm_rs") for m in (512, 8192, 32768)
              for n, k in ((2048, 4096), (14336, 4096))]  # fmt: skip
    return [(families[i % len(families)], Scenario(op=op, m=m, n=n, k=k, hardware=hw))
            for i, (op, m, n, k) in enumerate(shapes)]  # fmt: skip


def test_an_earlier_executor_keeps_only_the_rows_it_measured_alike():
    df = pd.DataFrame(
        {"op": ["ag_gemm", "ag_gemm", "a2a_gemm", "gemm_rs"],
         "schedule": ["serial/dma", "shard/dma", "shard/dma", "serial/sm"]}
    )  # fmt: skip
    assert current_rows(df, 2)["schedule"].tolist() == ["shard/dma", "serial/sm"]
    assert len(current_rows(df, 3)) == 4


def test_fit_recovers_the_constants_that_made_the_rows(h200):
    true = dataclasses.replace(DEFAULT_CONSTANTS, nccl_bw_frac=0.35, ce_latency_us=25.0, host_factor=1.5)
    obs = frame_observations(_frame(SimBackend(h200, constants=true), _scenarios(h200)), h200)
    start = dataclasses.replace(true, nccl_bw_frac=0.5, ce_latency_us=10.0)
    fitted = fit([obs], start=start, free=("nccl_bw_frac", "ce_latency_us"), lsq_iterations=30,
                 regret_iterations=0)  # fmt: skip
    assert fitted.constants.nccl_bw_frac == pytest.approx(0.35, rel=0.03)
    assert fitted.constants.ce_latency_us == pytest.approx(25.0, rel=0.05)
    assert fitted.per_dataset["dataset"]["host_factor"] == pytest.approx(1.5, rel=0.05)
    picks = pick_table(obs, fitted.for_dataset(obs))
    summary = regret_summary(picks, ("mode",))
    assert [r["geomean_regret"] for r in summary] == pytest.approx([0.0, 0.0], abs=1e-3)


def test_fit_recovers_the_send_receive_price_at_four_ranks():
    """sim6's price of each send and receive of NCCL's groups, fitted from rows made at 4 ranks with a known
    value, starting off by 2x (its host factor fitted beside it)."""
    h4 = get_hardware("h200x4")
    true = dataclasses.replace(DEFAULT_CONSTANTS, host_p2p_op_us=12.0)
    scenarios = [(f, dataclasses.replace(s, world_size=4, hardware=h4)) for f, s in _scenarios(h4)]
    obs = frame_observations(_frame(SimBackend(h4, constants=true), scenarios), h4)
    start = dataclasses.replace(true, host_p2p_op_us=6.0)
    fitted = fit([obs], start=start, free=("host_p2p_op_us",), lsq_iterations=30, regret_iterations=0,
                 prior_weight=0.0)  # fmt: skip
    assert fitted.constants.host_p2p_op_us == pytest.approx(12.0, rel=0.03)
    assert fitted.per_dataset["dataset"]["host_factor"] == pytest.approx(true.host_factor, rel=0.03)


def test_own_constants_pick_the_measured_best_and_terms_are_exact(h200):
    obs = frame_observations(_frame(SimBackend(h200), _scenarios(h200)), h200)
    constants = DEFAULT_CONSTANTS  # the constants that made the rows
    picks = pick_table(obs, constants)
    assert (picks["regret"] == 0).all()
    assert agreement(_frame(SimBackend(h200), _scenarios(h200)), h200, constants) == 1.0
    terms = {(r["term"], r["mode"]): r for r in term_errors(obs, constants) if r["op"] == "ag_gemm"}
    assert terms["gemm_alone", "graph"]["median_abs"] == pytest.approx(0.0, abs=1e-6)
    assert terms["shard/dma", "eager"]["n"] > 0


def test_family_folds_hold_each_family_out_once_at_every_world_size(h200):
    h4 = dataclasses.replace(h200, id="h200x4", gpu_count=4)
    two = frame_observations(_frame(SimBackend(h200), _scenarios(h200, "abcd")), h200, name="two")
    four_scenarios = [
        (f, dataclasses.replace(s, world_size=4, hardware=h4)) for f, s in _scenarios(h200, "abcd")
    ]
    four = frame_observations(_frame(SimBackend(h4), four_scenarios), h4, name="four")
    folds = family_folds([two, four], 2)
    assert sorted(f for fold in folds for f in fold) == list("abcd") and len(folds) == 2
    held, fits = cross_validate([two, four], folds, lsq_iterations=1, regret_iterations=0,
                                free=("ce_latency_us",))  # fmt: skip
    assert len(fits) == 2
    per = held.groupby(["dataset", "mode"])["scenario_id"].agg(["count", "nunique"])
    assert (per["count"] == per["nunique"]).all()  # every scenario scored once, by the fold that held it out
    assert set(held["world_size"]) == {2, 4} and held.groupby("dataset").size().tolist() == [24, 24]


def test_the_guard_falls_back_where_the_simulator_predicts_little_and_loses():
    picks = pd.DataFrame(
        {"mode": ["graph"] * 4, "pick": ["shard/dma"] * 4, "sim_gain": [0.005, 0.004, 0.3, 0.2],
         "regret": [0.2, 0.15, 0.0, 0.0], "serial_regret": [0.0, 0.0, 0.4, 0.3],
         "slower_than_serial": [True, True, False, False]}
    )  # fmt: skip
    assert choose_guard(picks) == {"graph": 0.01}
    safe = picks.assign(regret=0.0, slower_than_serial=False)
    assert choose_guard(safe) == {"graph": None}


def test_calibrate_answers_for_the_dataset_machine(h200):
    true = dataclasses.replace(DEFAULT_CONSTANTS, host_factor=2.0)
    fitted = calibrate(_frame(SimBackend(h200, constants=true), _scenarios(h200)), h200)
    assert fitted.host_factor == pytest.approx(2.0, rel=0.2)
    with pytest.raises(ValueError, match="no row the current executor measures alike"):
        calibrate(_frame(SimBackend(h200), _scenarios(h200)).iloc[:0], h200)


def test_recorded_fidelity_is_the_fidelity_report():
    """``harness.sim.MEASURED_FIDELITY`` (what simulated models carry) is the committed report's."""
    report = json.loads((REPO / "benchmarks" / "results" / "sim-fidelity.json").read_text())
    held = {str(r["world_size"]): {} for r in report["held_out"]}
    for r in report["held_out"]:
        held[str(r["world_size"])][r["mode"]] = r["geomean_regret"]
    assert MEASURED_FIDELITY["held_out_regret"] == held
    assert MEASURED_FIDELITY["from_two_ranks_at_four"] == {
        r["mode"]: r["geomean_regret"] for r in report["from_two_ranks_at_four"]
    }
    assert MEASURED_FIDELITY["guard_min_gain"] == report["guard_min_gain"]
    assert report["sim_model"] == sim_fidelity(2)["sim_model"]
    assert report["shipped_constants"] == DEFAULT_CONSTANTS.to_dict()


def test_a_model_world_size_beyond_the_measured_ones_says_it_extrapolates():
    eight, two = sim_fidelity(8), sim_fidelity(2)
    assert eight["measured_world_sizes"] == [2, 4] and "extrapolated" in eight["world_size_note"]
    assert "fitted and scored" in two["world_size_note"]
    old = sim_fidelity(8, "sim4")
    assert old["held_out_regret"] == {} and "never scored" in old["world_size_note"]
    assert np.isfinite(list(eight["held_out_regret"]["4"].values())).all()
