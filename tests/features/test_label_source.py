"""The label version and label source of a dataset, from its manifest (features.label_source)."""

import json
from pathlib import Path

import pytest

from ficco.features.label_source import LABEL_VERSION, LABEL_VERSIONS, label_source, label_version_of

DATASETS = Path(__file__).resolve().parents[2] / "datasets"


def manifest(name: str) -> dict:
    return json.loads((DATASETS / name / "manifest.json").read_text())


@pytest.mark.parametrize(
    ("name", "version"),
    [
        ("h200x2-v2", 1),  # 24 rounds, per-peer copy streams, expert loop
        ("h200x2-moe", 1),
        ("h200x2", 2),  # timing protocol v3 (96 rounds, eager 3x)
        ("h200x2-unseen-v3", 2),
        ("h200x2-coverage", 3),  # copy arrangement and grouped expert GEMMs
        ("h200x4", 3),
    ],
)
def test_committed_datasets_get_their_label_version_from_their_protocol(name, version):
    assert label_version_of(manifest(name)["protocol"]) == version


def test_a_recorded_version_wins_and_every_version_has_a_history_line():
    assert label_version_of({"label_version": 7, "copy_streams": "1"}) == 7
    assert set(LABEL_VERSIONS) == set(range(1, LABEL_VERSION + 1))


def test_sources_differ_by_version_and_name_the_settings_that_moved():
    old = label_source(manifest("h200x2"), host_factor=1.24)
    new = label_source(manifest("h200x2-coverage"), host_factor=1.36)
    assert old.measured and new.measured
    assert old.key() != new.key()
    diffs = old.differences(new)
    assert "label_version 2 vs 3" in diffs
    assert "copy_streams 'per_peer' vs '1'" in diffs
    assert "expert_gemms 'loop' vs 'grouped from 8'" in diffs
    assert label_source(manifest("h200x2-unseen-v3"), 1.0).key() == old.key()


def test_a_simulated_dataset_is_its_own_source():
    sim = label_source(manifest("h200x4-sim"), host_factor=1.0)
    assert not sim.measured
    assert sim.label_version.startswith("sim")
    assert sim.key() != label_source(manifest("h200x4"), host_factor=2.24).key()
    assert "backend 'sim' vs 'gpu'" in sim.differences(label_source(manifest("h200x4"), 2.24))
