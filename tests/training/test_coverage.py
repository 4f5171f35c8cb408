"""training.predict.coverage: neighbours counted as defined, stored with a model, answered with every pick."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ficco.features import Scenario, get_hardware
from ficco.training.predict.coverage import COVERAGE_FILE, Coverage, off_map
from ficco.training.predict.registry import load_predictor

REPO = Path(__file__).resolve().parents[2]
H200X2 = get_hardware("h200x2")


def test_a_neighbour_is_the_same_op_mode_world_size_and_dtype_within_2x_in_m_n_and_k():
    training = [
        Scenario(m=1024, n=4096, k=4096),  # itself
        Scenario(m=2048, n=2048, k=8192),  # 2x in each: still a neighbour
        Scenario(m=2050, n=4096, k=4096),  # past 2x in m
        Scenario(op="gemm_rs", m=1024, n=4096, k=4096),  # another op
        Scenario(m=1024, n=4096, k=4096, dtype="fp16"),  # another dtype
    ]
    coverage = Coverage.of(training, ["graph"] * 5)
    probe = Scenario(m=1024, n=4096, k=4096)
    assert coverage.count([probe], "graph").tolist() == [2]
    assert coverage.count([probe], "eager").tolist() == [0]  # measured in graph mode only
    many = [probe, Scenario(m=4096, n=4096, k=4096), Scenario(op="gemm_rs", m=512, n=4096, k=4096)] * 700
    counts = coverage.count(many, "graph")  # the chunked path gives what one scenario at a time gives
    assert counts.tolist() == [int(coverage.count([s], "graph")[0]) for s in many]
    ms = np.array([256, 512, 1024, 2048, 4096])
    by_tokens = coverage.count_tokens("ag_gemm", "graph", 2, "bf16", 4096, 4096, ms)
    assert by_tokens.tolist() == [int(coverage.count([Scenario(m=int(m))], "graph")[0]) for m in ms]


def test_coverage_round_trips_and_a_damaged_file_is_refused(tmp_path):
    coverage = Coverage.of([Scenario(m=64), Scenario(op="gemm_rs", m=128)], ["eager", "graph"])
    coverage.save(tmp_path / COVERAGE_FILE)
    assert np.array_equal(Coverage.load(tmp_path / COVERAGE_FILE).rows, coverage.rows)
    np.save(tmp_path / "bad.npy", np.zeros((3, 2)))
    with pytest.raises(ValueError, match="coverage array is int"):
        Coverage.load(tmp_path / "bad.npy")
    (tmp_path / "text.npy").write_text("not numpy")
    with pytest.raises(ValueError, match="is not a coverage array"):
        Coverage.load(tmp_path / "text.npy")


def test_only_graph_answers_without_a_neighbour_are_off_the_map():
    assert off_map(0, "graph") and not off_map(1, "graph")
    assert not off_map(0, "eager") and not off_map(None, "graph")


@pytest.mark.heavy
def test_the_shipped_models_coverage_is_its_training_datasets_and_answers_carry_it():
    from ficco.training.dataset_table import load_trained_on

    predictor = load_predictor(REPO / "models", "h200x2")
    loaded = load_trained_on(predictor.card["dataset"], REPO)
    assert loaded.hash == predictor.card["dataset"]["hash"]  # the datasets the model was trained on
    expected = Coverage.of(loaded.table.scenarios, loaded.table.modes)
    in_order = lambda rows: rows[np.lexsort(rows.T[::-1])]  # noqa: E731  (rows as a set)
    assert np.array_equal(in_order(predictor.coverage.rows), in_order(expected.rows))
    measured = loaded.table.scenarios[0]
    far = Scenario(op="gemm_rs", m=16, n=256, k=262144, hardware=H200X2)
    near_rec, far_rec = predictor.recommend([measured, far], mode="graph")
    assert near_rec.neighbours >= 1 and far_rec.neighbours == 0
