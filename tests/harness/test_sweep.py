"""The sweep: resume after kill -9, fingerprint refusal, failure recording, noise table, rank 0 writes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ficco.features import candidates, get_hardware
from ficco.features.dataset import dataset_hash, load_dataset, load_noise, read_manifest
from ficco.harness.backend import Measurement, ScenarioResult
from ficco.harness.dataset import label_table
from ficco.harness.plan import plan_scenarios
from ficco.harness.sim import SimBackend
from ficco.harness.sweep import FingerprintMismatch, remeasure_targets, run_noise, run_sweep

REPO_ROOT = Path(__file__).resolve().parents[2]


class CountingSim(SimBackend):
    """The sim backend, remembering which scenarios it measured."""

    def __init__(self, hardware, **kwargs):
        super().__init__(hardware, **kwargs)
        self.measured: list[str] = []

    def measure(self, scenario, schedules):
        self.measured.append(scenario.key())
        return super().measure(scenario, schedules)


def _no_duplicates(df) -> bool:
    return not df.duplicated(["scenario_id", "schedule", "mode"]).any()


def test_sweep_writes_every_candidate_once(tmp_path, small_plan, h200):
    out = run_sweep(small_plan, SimBackend(h200), tmp_path / "ds", progress=False)
    df = load_dataset(out)
    assert len(df) == 2 * sum(len(candidates(s)) for _, s in small_plan) and _no_duplicates(df)
    assert set(df["backend"]) == {"sim"} and df["ok"].all()
    manifest = read_manifest(out)
    assert manifest["rows"] == len(df) and len(manifest["finished"]) == len(small_plan)
    assert json.loads((out / "plan.json").read_text())["settings"]["tp"] == 2


def test_resume_skips_finished_scenarios(tmp_path, small_plan, h200):
    first = CountingSim(h200)
    run_sweep(small_plan[:5], first, tmp_path / "ds", progress=False)
    second = CountingSim(h200)
    run_sweep(small_plan, second, tmp_path / "ds", progress=False)
    assert second.measured == [s.key() for _, s in small_plan[5:]]
    df = load_dataset(tmp_path / "ds")
    assert df["scenario_id"].nunique() == len(small_plan) and _no_duplicates(df)


_KILLED_SWEEP = """
import sys, time
from ficco.features import get_hardware
from ficco.harness.plan import plan_scenarios
from ficco.harness.sim import SimBackend
from ficco.harness.sweep import run_sweep

class Slow(SimBackend):
    def measure(self, scenario, schedules):
        time.sleep(0.03)
        return super().measure(scenario, schedules)

hw = get_hardware("h200x2")
run_sweep(plan_scenarios([], grid_size=60, hardware=hw, seed=11), Slow(hw), sys.argv[1], progress=False,
          flush_seconds=0.0)
"""


def _finished(out: Path) -> int:
    try:
        return len(read_manifest(out)["finished"])
    except (ValueError, TypeError, FileNotFoundError):
        return 0


@pytest.mark.heavy
def test_resume_after_kill_9_loses_and_duplicates_nothing(tmp_path, h200):
    plan = plan_scenarios([], grid_size=60, hardware=h200, seed=11)
    out = tmp_path / "killed"
    script = tmp_path / "sweep.py"
    script.write_text(_KILLED_SWEEP)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, str(script), str(out)], env=env)
    try:
        deadline = time.monotonic() + 120
        while _finished(out) < 8 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the sweep finished before it could be killed"
    done_before = read_manifest(out)["finished"]
    assert 8 <= len(done_before) < len(plan)

    resumed = CountingSim(h200)
    run_sweep(plan, resumed, out, progress=False)
    assert not set(resumed.measured) & set(done_before)  # finished scenarios not redone
    assert len(resumed.measured) == len(plan) - len(done_before)
    df = load_dataset(out)
    assert _no_duplicates(df) and df["scenario_id"].nunique() == len(plan)  # nothing duplicated or lost
    reference = run_sweep(plan, SimBackend(h200), tmp_path / "uninterrupted", progress=False)
    assert dataset_hash(out) == dataset_hash(reference)


def test_part_written_but_not_in_manifest_is_overwritten(tmp_path, small_plan, h200):
    out = run_sweep(small_plan[:3], SimBackend(h200), tmp_path / "ds", progress=False)
    manifest = read_manifest(out)
    orphan = out / "parts" / f"part-{len(manifest['parts']):05d}.parquet"
    orphan.write_bytes(b"half a parquet file from a crashed run")
    run_sweep(small_plan, SimBackend(h200), out, progress=False)
    assert orphan.name in {Path(p["file"]).name for p in read_manifest(out)["parts"]}
    assert load_dataset(out)["scenario_id"].nunique() == len(small_plan)


def test_resume_on_another_fingerprint_is_refused_naming_keys(tmp_path, small_plan, h200):
    run_sweep(small_plan[:2], SimBackend(h200, seed=0), tmp_path / "ds", progress=False)
    with pytest.raises(
        FingerprintMismatch, match=r"(?s)different fingerprint.*seed: 0 in the dataset vs 7 here"
    ):
        run_sweep(small_plan, SimBackend(h200, seed=7), tmp_path / "ds", progress=False)


class ProtocolSim(SimBackend):
    """The sim backend, claiming more protocol settings (as ``TorchBackend`` records them: ``pin``,
    ``expert_gemms``, ``copy_streams``)."""

    def __init__(self, hardware, settings, **kwargs):
        super().__init__(hardware, **kwargs)
        self.settings = settings

    def protocol(self):
        return super().protocol() | self.settings


def test_resume_of_a_dataset_from_before_the_pin_setting_counts_it_as_share(tmp_path, small_plan, h200):
    out = run_sweep(small_plan[:2], SimBackend(h200), tmp_path / "ds", progress=False)
    assert "pin" not in read_manifest(out)["protocol"]  # as every dataset measured before the setting
    run_sweep(small_plan[:3], ProtocolSim(h200, {"pin": "share"}), out, progress=False)
    with pytest.raises(FingerprintMismatch, match="protocol pin: dataset 'share', now 'core'"):
        run_sweep(small_plan, ProtocolSim(h200, {"pin": "core"}), out, progress=False)


def test_a_dataset_from_before_grouped_expert_gemms_is_not_resumed_with_them(tmp_path, small_plan, h200):
    out = run_sweep(small_plan[:2], SimBackend(h200), tmp_path / "ds", progress=False)
    run_sweep(small_plan[:3], ProtocolSim(h200, {"expert_gemms": "loop"}), out, progress=False)
    with pytest.raises(
        FingerprintMismatch, match="protocol expert_gemms: dataset 'loop', now 'grouped from 8'"
    ):
        run_sweep(small_plan, ProtocolSim(h200, {"expert_gemms": "grouped from 8"}), out, progress=False)


def test_a_dataset_of_one_copy_arrangement_is_not_resumed_under_another(tmp_path, small_plan, h200):
    out = run_sweep(small_plan[:2], SimBackend(h200), tmp_path / "ds", progress=False)
    run_sweep(small_plan[:3], ProtocolSim(h200, {"copy_streams": "per_peer"}), out, progress=False)
    with pytest.raises(FingerprintMismatch, match="protocol copy_streams: dataset 'per_peer', now '1'"):
        run_sweep(small_plan, ProtocolSim(h200, {"copy_streams": "1"}), out, progress=False)


def test_resume_with_another_hardware_profile_is_refused(tmp_path, h200):
    run_sweep(
        plan_scenarios([], grid_size=2, hardware=h200), SimBackend(h200), tmp_path / "ds", progress=False
    )
    h100 = get_hardware("h100x2")

    class SameFingerprint(SimBackend):
        def fingerprint(self):
            return SimBackend(h200).fingerprint()

    with pytest.raises(ValueError, match="it holds hardware 'h200x2', the plan targets 'h100x2'"):
        run_sweep(plan_scenarios([], grid_size=2, hardware=h100), SameFingerprint(h100), tmp_path / "ds")


class FailsFastest(SimBackend):
    """Reports the schedule the sim finds fastest as failed (a wrong result, say)."""

    def measure(self, scenario, schedules):
        result = super().measure(scenario, schedules)
        best = min(result.measurements, key=lambda m: m.median_ms).schedule
        measurements = [
            Measurement(
                schedule=m.schedule, mode=m.mode, ok=False, error="AssertionError: result differs from serial"
            )
            if m.schedule == best
            else m
            for m in result.measurements
        ]
        return ScenarioResult(measurements=measurements, baselines=result.baselines)


def test_failed_schedule_is_recorded_and_never_best(tmp_path, small_plan, h200):
    out = run_sweep(small_plan, FailsFastest(h200), tmp_path / "ds", progress=False)
    df = load_dataset(out)
    failed = df[~df["ok"]]
    assert len(failed) == 2 * len(small_plan) and failed["median_ms"].isna().all()
    assert set(failed["error"]) == {"AssertionError: result differs from serial"}
    assert (
        not failed["in_best_set"].any()
        and df[df["ok"]].groupby(["scenario_id", "mode"])["in_best_set"].any().all()
    )
    labels = label_table(df).set_index(["scenario_id", "mode"])
    for row in failed.itertuples():
        assert labels.at[(row.scenario_id, row.mode), "best_schedule"] != row.schedule


class RaisesOn(SimBackend):
    def __init__(self, hardware, bad: set[str]):
        super().__init__(hardware)
        self.bad = bad

    def measure(self, scenario, schedules):
        if scenario.key() in self.bad:
            raise RuntimeError("CUDA error: out of memory")
        return super().measure(scenario, schedules)


def test_backend_exception_marks_the_scenario_failed_and_continues(tmp_path, small_plan, h200):
    bad = small_plan[3][1].key()
    df = load_dataset(run_sweep(small_plan, RaisesOn(h200, {bad}), tmp_path / "ds", progress=False))
    rows = df[df["scenario_id"] == bad]
    assert len(rows) == 60 and not rows["ok"].any()
    assert set(rows["error"]) == {"RuntimeError: CUDA error: out of memory"}
    assert df[df["scenario_id"] != bad]["ok"].all()


def test_broken_backend_stops_the_sweep(tmp_path, small_plan, h200):
    everything = {s.key() for _, s in small_plan}
    with pytest.raises(RuntimeError, match="failed every schedule of the first 3 scenarios"):
        run_sweep(small_plan, RaisesOn(h200, everything), tmp_path / "ds", progress=False)


def test_run_noise_writes_noise_table_once_in_a_shuffled_order(tmp_path, small_plan, h200):
    out = run_sweep(small_plan, SimBackend(h200, noise=0.05), tmp_path / "ds", progress=False)
    first = CountingSim(h200, noise=0.05, seed=1)
    run_noise(small_plan, first, out, 8, progress=False)
    noise = load_noise(out)
    assert noise["scenario_id"].nunique() == 8 and len(noise) == 8 * 30 * 2  # both modes
    targets = remeasure_targets([s.key() for _, s in small_plan], {s.key() for _, s in small_plan}, 8)
    assert sorted(first.measured) == sorted(targets) and first.measured != targets  # shuffled
    again = CountingSim(h200, noise=0.05, seed=1)
    run_noise(small_plan, again, out, 10, progress=False)
    assert len(again.measured) == 2 and load_noise(out)["scenario_id"].nunique() == 10
    assert load_dataset(out)["scenario_id"].nunique() == len(small_plan)


def test_run_noise_needs_a_sweep(tmp_path, small_plan, h200):
    with pytest.raises(ValueError, match="holds no sweep to re-measure"):
        run_noise(small_plan, SimBackend(h200), tmp_path / "none", 4, progress=False)


def test_remeasure_targets_spread_over_the_plan():
    ids = [f"s{i}" for i in range(10)]
    assert remeasure_targets(ids, set(ids), 5) == ["s0", "s2", "s4", "s6", "s8"]
    assert remeasure_targets(ids, {"s1", "s3"}, 5) == ["s1", "s3"]


def test_only_rank_0_writes(tmp_path, small_plan, h200):
    class Rank1(CountingSim):
        rank = 1

    backend = Rank1(h200)
    run_sweep(small_plan, backend, tmp_path / "ds", progress=False)
    assert len(backend.measured) == len(small_plan)  # it still takes part in every measurement
    assert not (tmp_path / "ds").exists()


def test_deadline_stops_before_the_next_scenario_and_resume_completes(tmp_path, small_plan, h200):
    out = run_sweep(small_plan, SimBackend(h200), tmp_path / "ds", progress=False, deadline=time.time() - 1)
    assert read_manifest(out)["finished"] == []
    run_sweep(small_plan, SimBackend(h200), out, progress=False)
    assert len(read_manifest(out)["finished"]) == len(small_plan)


def test_bench_time_budget_leaves_the_remeasure_for_a_resume(tmp_path, tiny_configs):
    import typer
    from typer.testing import CliRunner

    from ficco.harness.commands import register

    app = typer.Typer()
    register(app)
    args = ["bench", "--backend", "sim", "--configs", tiny_configs, "--tokens", "1024", "--grid", "3"]
    args += ["--out", tmp_path / "ds", "--remeasure", "2", "--time-budget", "0.000001"]
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    assert "time budget reached after 0 of 7 scenarios" in result.output
    assert not (tmp_path / "ds" / "noise.parquet").exists()


@pytest.mark.parametrize(
    ("gpu_name", "hardware_id", "fits"),
    [
        ("NVIDIA H100 80GB HBM3", "h200x2", "h100x2"),
        ("NVIDIA H200", "h100x4", "h200x4"),
        ("NVIDIA B200", "h200x2", "b200x2"),
    ],
)
def test_a_gpu_sweep_refuses_a_profile_of_another_gpu_model(tmp_path, gpu_name, hardware_id, fits):
    """Measuring on one GPU model under another's profile would file the rows under the wrong id."""
    hardware = get_hardware(hardware_id)

    class OnGpu(SimBackend):
        def fingerprint(self):
            return {"backend": "gpu", "gpu_name": gpu_name, "world_size": hardware.gpu_count}

    plan = plan_scenarios([], grid_size=2, hardware=hardware)
    with pytest.raises(ValueError, match=f"GPUs, not of this machine's {gpu_name}: use hardware {fits} "):
        run_sweep(plan, OnGpu(hardware), tmp_path / "ds", progress=False)
    assert not (tmp_path / "ds" / "parts").exists()


def test_a_gpu_sweep_runs_under_its_own_models_profile_whatever_the_cards_full_name(tmp_path):
    hardware = get_hardware("h100x2")

    class OnGpu(SimBackend):
        def fingerprint(self):
            return {"backend": "gpu", "gpu_name": "NVIDIA H100 80GB HBM3", "world_size": 2}

    out = run_sweep(
        plan_scenarios([], grid_size=2, hardware=hardware), OnGpu(hardware), tmp_path / "ds", progress=False
    )
    assert read_manifest(out)["hardware"]["id"] == "h100x2"
