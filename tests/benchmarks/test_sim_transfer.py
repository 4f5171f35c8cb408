"""benchmarks.sim_transfer: a model trained on simulated rows, scored on other rows, per policy, mode and op
group, with the goals judged from the numbers and the markdown remade from the JSON."""

from __future__ import annotations

import json

from benchmarks import sim_transfer as bench
from ficco.harness.sim import SIM_MODEL_VERSION


def test_transfer_scores_both_policies_and_judges_the_goals(sim_dataset, tmp_path):
    out = tmp_path / "transfer"
    data = bench.main(["--train", str(sim_dataset), "--test", str(sim_dataset), "--out", str(out)])
    assert set(data["scores"]) == {"cross-validated", "registered"}
    fidelity = data["sim_fidelity"]
    assert fidelity["sim_model"] == SIM_MODEL_VERSION and fidelity["measured_world_sizes"] == [2, 4]
    for mode, guard in fidelity["guard_min_gain"].items():  # the registered policy is at least the guard
        if guard is not None:
            assert data["policies"]["registered"][mode]["min_gain"] >= guard
    for name, by_mode in data["scores"].items():
        assert set(by_mode) == {"eager", "graph"}
        for mode, groups in by_mode.items():
            m = groups["all"]
            assert m["n_scenarios"] == groups["dense"]["n_scenarios"] > 0  # a dense-only dataset
            assert 0 <= m["geomean_regret"] < 0.05  # in-sample picks of a 1%-noise sweep
            slow = m["n_slower_than_serial_2pct"]
            met = bool(m["geomean_regret"] <= bench.GOALS[mode] and slow <= bench.SLOW_PICKS)
            assert data["goals"]["met"][name][mode] == met
    written = json.loads(out.with_suffix(".json").read_text())
    assert written["scores"] == json.loads(json.dumps(data["scores"], default=float))
    text = out.with_suffix(".md").read_text()
    assert "| cross-validated | eager | all |" in text and "| registered | graph | dense |" in text
    out.with_suffix(".md").unlink()
    bench.main(["--render", "--out", str(out)])  # the markdown again from the JSON alone
    assert out.with_suffix(".md").read_text() == text
