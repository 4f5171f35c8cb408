"""harness.gaps: what a dataset's plan holds that its measurements lack, priced at its own pace, and the model
card's record of it (the h200x4 dataset's numbers are the ones docs/models.md gives)."""

from __future__ import annotations

import json
from pathlib import Path

from ficco.features import candidates, get_hardware
from ficco.features.model_config import load_model_configs
from ficco.harness.gaps import REMEASURE_SCENARIOS, dataset_gaps, gaps_line
from ficco.harness.plan import plan_scenarios
from ficco.harness.sim import SimBackend
from ficco.harness.sweep import run_sweep

CHECKOUT = Path(__file__).resolve().parents[2]


def test_the_four_gpu_dataset_lacks_the_grid_three_families_a_routing_and_the_remeasure():
    gaps = dataset_gaps(CHECKOUT / "datasets" / "h200x4")
    assert (gaps["planned"], gaps["measured"], gaps["grid"]) == (673, 297, [0, 280])
    assert gaps["families"] == {"Qwen2.5-72B": [23, 39], "Qwen2.5-7B": [0, 40], "Qwen3-30B-A3B": [0, 40]}
    assert gaps["moe_routings"] == {"planned": [[8, 2], [128, 8]], "measured": [[8, 2]]}
    assert gaps["remeasured"] == 0 and gaps["rows_per_minute"] == 1471
    assert gaps["to_measure"] == {"scenarios": 376, "rows": 22560, "device_minutes": 15.3}
    assert gaps["to_remeasure"] == {"scenarios": REMEASURE_SCENARIOS, "device_minutes": 2.6}
    line = gaps_line(gaps)
    assert "grid shapes 0/280" in line and "(128, 8)" in line and "no noise re-measure" in line
    assert "376 scenarios, 15.3 min" in line


def test_a_finished_dataset_lacks_nothing():
    gaps = dataset_gaps(CHECKOUT / "datasets" / "h200x2")
    assert gaps["planned"] == gaps["measured"] == 614 and gaps["to_measure"]["scenarios"] == 0
    assert gaps["families"] == {} and gaps["remeasured"] == 64 and gaps["to_remeasure"] is None
    assert gaps_line(gaps) is None
    assert dataset_gaps(CHECKOUT / "datasets") is None  # no plan: nothing to compare with


def test_a_sweep_stopped_early_lists_what_it_lacks_and_prices_it(tmp_path):
    """A small simulated sweep with its MoE family and grid taken out of the finished list, as a sweep
    stopped before them leaves it: the gaps name them, and the rows to measure are their candidates'."""
    configs = [c for c in load_model_configs(CHECKOUT / "datasets" / "model_configs")
               if c.name in ("Llama-3.1-8B", "Mixtral-8x7B-v0.1")]  # fmt: skip
    plan = plan_scenarios(configs, tp=2, tokens=(2048,), grid_size=4, include_moe=True)
    out = run_sweep(plan, SimBackend(get_hardware("h200x2")), tmp_path / "d", progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    lost = [s for family, s in plan if family == "grid" or s.experts]
    manifest["finished"] = [k for k in manifest["finished"] if k not in {s.key() for s in lost}]
    (out / "manifest.json").write_text(json.dumps(manifest))
    gaps = dataset_gaps(out)
    assert gaps["grid"] == [0, 4] and gaps["moe_routings"] == {"planned": [[8, 2]], "measured": []}
    assert gaps["measured"] == len(plan) - len(lost) and gaps["to_measure"]["scenarios"] == len(lost)
    assert gaps["to_measure"]["rows"] == sum(len(candidates(s)) for s in lost) * 2  # both modes
    assert "Mixtral-8x7B-v0.1" in gaps["families"] and "Llama-3.1-8B" not in gaps["families"]
