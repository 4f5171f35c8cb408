"""benchmarks/studies/compare_sweeps.py: two sweeps of one plan compared with the card's noise arithmetic."""

import json
import shutil

import pytest

from benchmarks.studies import compare_sweeps
from ficco.features import get_hardware
from ficco.harness.plan import plan_scenarios
from ficco.harness.sim import SimBackend
from ficco.harness.sweep import run_sweep


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """Three simulated sweeps: two of one plan with different noise draws, one of another plan."""
    hw = get_hardware("h200x2")
    plan = plan_scenarios([], grid_size=12, hardware=hw, seed=3)
    other = plan_scenarios([], grid_size=4, hardware=hw, seed=99)
    root = tmp_path_factory.mktemp("sweeps")
    for name, p, seed in (("a", plan, 0), ("b", plan, 1), ("c", other, 0)):
        run_sweep(p, SimBackend(hw, seed=seed, noise=0.05), root / name, progress=False)
    return root


def test_a_sweep_against_itself_agrees_exactly(sweeps):
    result = compare_sweeps.compare(sweeps / "a", sweeps / "a")
    for part in result["modes"].values():
        s = part["summary"]
        assert s["rel_diff_max"] == 0 and s["best_changed"] == 0 and s["second_best_in_first_set"] == 1


def test_an_independent_sweep_differs_and_is_written(sweeps, tmp_path, capsys):
    out = tmp_path / "compare.json"
    compare_sweeps.main([str(sweeps / "a"), str(sweeps / "b"), "--out", str(out)])
    result = json.loads(out.read_text())
    summary = result["modes"]["eager"]["summary"]
    assert summary["scenarios"] == 12 and 0 < summary["rel_diff_median"] < 0.2
    assert sum(b["scenarios"] for b in result["modes"]["eager"]["by_size"]) == 12
    assert "2nd fastest in 1st set" in capsys.readouterr().out


def test_sweeps_without_a_common_scenario_are_refused(sweeps):
    with pytest.raises(SystemExit, match="share no scenario_id"):
        compare_sweeps.compare(sweeps / "a", sweeps / "c")


def test_a_sweep_under_another_pin_policy_is_named(sweeps, tmp_path, capsys):
    seek = tmp_path / "b-seek"
    shutil.copytree(sweeps / "b", seek)
    manifest = json.loads((seek / "manifest.json").read_text())
    manifest["protocol"]["pin"] = "seek"
    (seek / "manifest.json").write_text(json.dumps(manifest))
    result = compare_sweeps.compare(sweeps / "a", seek)
    assert result["protocols"]["first"]["pin"] == "share"  # a manifest without it: the protocol before
    assert compare_sweeps.protocol_changes(result) == ["pin: share -> seek"]
    assert "protocols differ (pin: share -> seek)" in compare_sweeps.render(result)
    assert compare_sweeps.protocol_changes(compare_sweeps.compare(sweeps / "a", sweeps / "b")) == []
