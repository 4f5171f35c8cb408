"""The world-size report on two small simulated datasets (2 and 4 GPUs): its numbers, the simulated marks,
the files it writes, and the refusal of two datasets of one world size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import world_size_report as report
from ficco.features import SCHEDULE_FAMILIES, get_hardware

pytestmark = pytest.mark.heavy

CONFIGS_DIR = Path(__file__).resolve().parents[2] / "datasets" / "model_configs"


@pytest.fixture(scope="module")
def sim_dataset_w4(tmp_path_factory):
    """The families of ``sim_dataset`` at TP=4 on the simulator (h200x4, 1% noise)."""
    from ficco.features.model_config import load_model_configs
    from ficco.harness.plan import plan_scenarios
    from ficco.harness.sim import SimBackend
    from ficco.harness.sweep import run_sweep

    configs = [
        c for c in load_model_configs(CONFIGS_DIR) if c.name in ("Llama-3.1-8B", "Qwen2.5-7B", "Gemma-2-9B")
    ]
    hardware = get_hardware("h200x4")
    plan = plan_scenarios(configs, tp=4, tokens=(2048, 8192), grid_size=24, seed=0, hardware=hardware)
    return run_sweep(plan, SimBackend(hardware, noise=0.01), tmp_path_factory.mktemp("sim4"), progress=False)


@pytest.fixture(scope="module")
def written(sim_dataset, sim_dataset_w4, tmp_path_factory):
    out = tmp_path_factory.mktemp("world-size")
    summary = report.main([str(sim_dataset), str(sim_dataset_w4), "--out", str(out)])
    return summary, out


def test_every_section_covers_both_world_sizes_and_both_modes(written):
    summary, _ = written
    names = ["2 GPUs (sim)", "4 GPUs (sim)"]
    assert [d["name"] for d in summary["datasets"]] == names and summary["simulated"] == names
    assert [d["world_size"] for d in summary["datasets"]] == [2, 4]
    for name in names:
        for mode in ("eager", "graph"):
            shares = summary["best_schedules"][name][mode]
            assert sum(shares[f] for f in SCHEDULE_FAMILIES) == pytest.approx(1.0)
            overlap = summary["overlap"][name][mode]
            assert overlap["speedup_vs_serial"] >= 1.0  # the fastest schedule is never slower than serial
            assert overlap["realized_overlap_comm_heavy"]["shapes"] > 0
            for test in names:
                cell = summary["transfer"][name][test][mode]
                assert set(cell) == {"model", "size_heuristic"}, (name, test, mode)
                assert cell["model"]["geomean_regret"] >= 0 and 0 <= cell["model"]["in_best_set"] <= 1
    # off the diagonal the model picks for every scenario of the other world size (none is shared)
    n_w4 = summary["datasets"][1]["n_scenarios"]
    assert summary["transfer"]["2 GPUs (sim)"]["4 GPUs (sim)"]["graph"]["model"]["n_scenarios"] == n_w4


def test_the_report_says_simulated_and_writes_its_files(written):
    summary, out = written
    markdown = (out / "report.md").read_text()
    assert markdown.startswith("# World-size report\n\n**Simulated:** 2 GPUs (sim), 4 GPUs (sim) come from")
    assert "| train 2 GPUs (sim) |" in markdown and "| test 4 GPUs (sim) |" in markdown
    assert json.loads((out / "world-size.json").read_text()) == summary
    for plot in ("best-family.png", "speedup-cdf.png", "transfer.png"):
        assert (out / plot).stat().st_size > 10_000, plot


def test_two_datasets_of_one_world_size_are_refused(sim_dataset, tmp_path):
    with pytest.raises(SystemExit, match=r"distinct world sizes; got \[2, 2\]"):
        report.main([str(sim_dataset), str(sim_dataset), "--out", str(tmp_path)])


def test_moves_match_every_model_layer_held_at_both_world_sizes(written, sim_dataset, sim_dataset_w4):
    """The three families at 2 token counts, 4 layer pairs each: 24 layers found at 2 and at 4 GPUs; each
    counted once per mode, from its fastest family at 2 GPUs to its fastest at 4."""
    summary, out = written
    moved = summary["moves"]["2 GPUs (sim) -> 4 GPUs (sim)"]
    assert moved["matched"] == 3 * 2 * 4
    for mode in ("eager", "graph"):
        assert sum(n for row in moved[mode].values() for n in row.values()) == moved["matched"]
        assert set(moved[mode]) <= set(SCHEDULE_FAMILIES)
    assert "## How the best schedule moves" in (out / "report.md").read_text()


def test_serial_dma_by_size_buckets_every_scenario_once(written):
    summary, out = written
    for d in summary["datasets"]:
        for mode, buckets in summary["serial_dma_by_size"][d["name"]].items():
            assert sum(b["scenarios"] for b in buckets) == d["n_scenarios"], (d["name"], mode)
            assert all(0 <= b["best"] <= b["in_best_set"] <= 1 for b in buckets)
    assert (
        "| world size | mode | MiB received | scenarios | fastest | in best set |"
        in (out / "report.md").read_text()
    )
