"""The dataset card: sections, noise summary, failures, simulator agreement and the per-op plots."""

import numpy as np
import pytest

from ficco.features.dataset import load_dataset, load_noise
from ficco.harness.card import noise_summary, schedule_family, write_card
from ficco.harness.plan import plan_scenarios
from ficco.harness.sim import SimBackend
from ficco.harness.sweep import run_noise, run_sweep

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sim_dataset(tmp_path_factory):
    from ficco.features import get_hardware

    hw = get_hardware("h200x2")
    plan = plan_scenarios([], grid_size=16, hardware=hw, seed=2)
    out = tmp_path_factory.mktemp("card") / "ds"
    run_sweep(plan, SimBackend(hw, noise=0.05), out, progress=False)
    return run_noise(plan, SimBackend(hw, seed=1, noise=0.05), out, 5, progress=False)


def test_write_card_has_every_section_and_a_png_per_op(sim_dataset):
    card = write_card(sim_dataset).read_text()
    for heading in (
        "# Dataset card: h200x2, simulated (backend=sim)",
        "## How it was measured",
        "## Label source",
        "## Fingerprint",
        "## Size and speed",
        "## Failed schedules",
        "## Labels",
        "## Labels with confidence (best sets)",
        "## Run-to-run noise",
        "## Host speed",
        "## Best schedule over the (m, n*k) plane",
    ):
        assert heading in card
    assert "| eager | 5 | 150 |" in card and "| graph | 5 | 150 |" in card  # noise rows per mode
    assert "## Simulator agreement" not in card  # only for measured datasets
    for op in ("ag_gemm", "gemm_rs"):
        for mode in ("eager", "graph"):
            png = sim_dataset / f"best-{op}-{mode}.png"
            assert f"]({png.name})" in card
            data = png.read_bytes()
            assert data.startswith(PNG_MAGIC) and len(data) > 5000


def test_noise_summary_measures_spread_best_sets_and_label_changes(sim_dataset):
    df, noise = load_dataset(sim_dataset), load_noise(sim_dataset)
    df, noise = df[df["mode"] == "graph"], noise[noise["mode"] == "graph"]
    s = noise_summary(df, noise)
    assert s["scenarios"] == 5 and s["pairs"] == 5 * 30
    assert 0.0 < s["rel_diff_median"] < 0.2  # noise=0.05 per round, median of 5 rounds
    assert 0.0 <= s["best_changed"] <= 1.0 and 0.0 <= s["second_best_in_first_set"] <= 1.0
    assert s["best_set_size_median"] >= 1
    same = noise_summary(df, df[df["scenario_id"].isin(noise["scenario_id"])])
    assert same["rel_diff_max"] == 0.0 and same["best_changed"] == 0.0
    assert same["second_best_in_first_set"] == 1.0  # the fastest is always in its own best set


class MeasuredFails(SimBackend):
    """A stand-in for the GPU backend: sim times, backend name gpu, one schedule always failing."""

    name = "gpu"

    def measure(self, scenario, schedules):
        from ficco.harness.backend import Measurement, ScenarioResult

        result = super().measure(scenario, schedules)
        bad = "finer/sm/s8/chunk/hp"
        keep = [
            m
            if m.schedule != bad
            else Measurement(schedule=bad, mode=m.mode, ok=False, error="TimeoutError: x")
            for m in result.measurements
        ]
        return ScenarioResult(measurements=keep, baselines=result.baselines)


def test_card_of_measured_dataset_lists_failures_and_sim_agreement(tmp_path, h200):
    plan = plan_scenarios([], grid_size=8, hardware=h200, seed=4)
    out = run_sweep(plan, MeasuredFails(h200), tmp_path / "ds", progress=False)
    card = write_card(out).read_text()
    assert "# Dataset card: h200x2, measured on GPUs" in card
    assert "16 of 480 rows failed" in card and "TimeoutError: x" in card
    assert "## Simulator agreement" in card and "| default constants | 100% | 100% |" in card


def test_card_states_the_eager_share_of_timed_work_the_dataset_was_measured_with(tmp_path, h200):
    """The protocol paragraph follows the manifest (a dataset from before the factor was recorded: 1x)."""
    import json

    plan = plan_scenarios([], grid_size=2, hardware=h200, seed=4)
    dataset = run_sweep(plan, MeasuredFails(h200), tmp_path / "ds", progress=False)
    manifest_path = dataset / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for factor, expected in ((3.0, "3x that in eager mode"), (None, "1x that in eager mode")):
        manifest["protocol"].pop("eager_timed_factor", None)
        if factor is not None:
            manifest["protocol"]["eager_timed_factor"] = factor
        manifest_path.write_text(json.dumps(manifest))
        assert expected in write_card(dataset).read_text()


def test_card_states_the_label_source_its_version_history_and_the_settings_that_move_labels(tmp_path, h200):
    """A dataset from before the label version and the copy arrangement were recorded gets both from its
    settings (marked not recorded); one that records them says so; a simulated one names its model."""
    import json

    from ficco.features.label_source import LABEL_VERSIONS

    plan = plan_scenarios([], grid_size=2, hardware=h200, seed=4)
    dataset = run_sweep(plan, MeasuredFails(h200), tmp_path / "ds", progress=False)
    card = write_card(dataset).read_text()
    section = card.split("## Label source\n\n")[1].split("\n## ")[0]
    assert section.startswith("`gpu v1 on NVIDIA H200 x2, host factor ")
    assert f"Label version **1** (derived from its protocol settings): {LABEL_VERSIONS[1]}." in section
    assert "| copy_streams | `per_peer` (not recorded: measured before it was a setting) |" in section
    assert "| expert_gemms | `loop` (not recorded" in section and "modes" not in section
    manifest_path = dataset / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["protocol"] |= {"label_version": 3, "copy_streams": "1", "expert_gemms": "grouped from 8"}
    manifest_path.write_text(json.dumps(manifest))
    section = write_card(dataset).read_text().split("## Label source\n\n")[1].split("\n## ")[0]
    assert f"Label version **3** (recorded by the sweep): {LABEL_VERSIONS[3]}." in section
    assert "| copy_streams | `1` |" in section and "| expert_gemms | `grouped from 8` |" in section


def test_a_simulated_card_names_the_simulator_as_its_label_source(sim_dataset):
    section = write_card(sim_dataset).read_text().split("## Label source\n\n")[1].split("\n## ")[0]
    assert section.startswith("`sim sim") and "Simulated: the model `sim" in section
    assert "Label version" not in section


def test_write_card_outside_a_dataset_raises(tmp_path):
    with pytest.raises(ValueError, match="is not a ficco dataset"):
        write_card(tmp_path)


@pytest.mark.parametrize(
    ("schedule", "family"),
    [("serial/sm", "serial/sm"), ("shard/dma/hp", "shard/dma"), ("finer/sm/s8/shard/hp", "finer/sm")],
)
def test_schedule_family(schedule, family):
    assert schedule_family(schedule) == family


def test_card_counts_scenarios_per_family(sim_dataset):
    assert "| grid | 16 |" in write_card(sim_dataset).read_text()


def test_noise_by_size_buckets_by_serial_time_and_takes_out_each_scenarios_shift():
    import pandas as pd

    from ficco.harness.card import noise_by_size

    def rows(scale_small: float, scale_large: float, jitter: float) -> pd.DataFrame:
        out = []
        for sid, serial, scale in (("small", 0.05, scale_small), ("large", 5.0, scale_large)):
            for i, schedule in enumerate(("serial/sm", "shard/dma", "shard/sm")):
                t = serial * (1 + 0.1 * i) * scale * (1 + (jitter if i == 2 else 0.0))
                row = {"scenario_id": sid, "schedule": schedule, "mode": "graph", "ok": True}
                out.append(row | {"median_ms": t, "p10_ms": 0.5 * t})  # graph mode's time: the median
        return pd.DataFrame(out)

    # second run: the small scenario 20% slower as a whole (+5% on one schedule), the large one equal
    buckets = noise_by_size(rows(1.0, 1.0, 0.0), rows(1.2, 1.0, 0.05))
    assert [b["size"] for b in buckets] == [0, 4]  # < 0.1 ms and >= 3 ms
    small, large = buckets
    assert small["rel_median"] == pytest.approx(0.2) and small["shifted_median"] == pytest.approx(0.0)
    assert small["shift_median"] == pytest.approx(1.2) and large["shift_median"] == pytest.approx(1.0)
    assert small["shifted_p90"] == pytest.approx(0.04, abs=1e-9)  # 0.8 of the one 5% difference
    assert large["rel_median"] == 0.0 and large["scenarios"] == 1


def test_host_factor_of_a_dataset_reads_its_host_bound_eager_times():
    """Eager times 1.4x the executor's host price where the graph replay is far faster give 1.4; a large
    scenario's GPU-bound times do not count; a dataset without host-bound times has none."""
    import pandas as pd

    from ficco.features import Schedule
    from ficco.features.dataset import host_factor_of
    from ficco.features.launch_cost import host_us

    rows = []
    for sid, op, bound in (("small", "ag_gemm", True), ("large", "gemm_rs", False)):
        for schedule in ("serial/sm", "shard/dma", "finer/dma/s2/chunk"):
            price_ms = host_us(op, 2, Schedule.parse(schedule)) * 1e-3
            eager = 1.4 * price_ms if bound else 5.0
            for mode, t in (("eager", eager), ("graph", 0.1 * eager if bound else 4.9)):
                rows.append({"scenario_id": sid, "op": op, "world_size": 2, "experts": 1, "ok": True,
                             "schedule": schedule, "mode": mode, "median_ms": t, "p10_ms": t})  # fmt: skip
    df = pd.DataFrame(rows)
    assert host_factor_of(df) == pytest.approx(1.4)
    assert np.isnan(host_factor_of(df[df["scenario_id"] == "large"]))
