"""The retraining job: budget selection, and the whole job on the simulator (as CI runs it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ficco.cli import app
from ficco.harness.sim import SIM_MODEL_VERSION
from ficco.training.predict.registry import current_version, list_models
from ficco.training.retrain import compare, decision_margin, farthest_points, informative_subset

runner = CliRunner()


def test_farthest_points_spreads_and_stops_at_duplicates():
    Z = np.array([[0.0], [0.1], [10.0], [5.0], [10.0]])
    assert farthest_points(Z, 3, []) == [0, 2, 3]
    assert farthest_points(Z, 2, [2]) == [0, 3]
    assert len(farthest_points(np.zeros((4, 2)), 3, [])) == 1


def test_informative_subset_takes_the_least_sure_and_a_spread(trained, table):
    from ficco.harness.plan import Plan
    from ficco.training.predict.predictor import Predictor

    eager = table.subset(table.modes == "eager")
    plan = Plan(entries=tuple(zip(eager.families, eager.scenarios, strict=True)), settings={"tp": 2})
    predictor = Predictor(
        scorer=trained.scorer,
        ratio=trained.ratio,
        policy=trained.choice.policy,
        card={},
        version="v",
        hardware_id="h200x2",
    )
    subset = informative_subset(plan, 20, predictor)
    assert len(subset) == 20 and subset.settings["budget"] == 20
    keys = [s.key() for _, s in subset]
    margin = np.min([decision_margin(predictor, eager.X, mode) for mode in ("eager", "graph")], axis=0)
    least_sure = np.argsort(margin, kind="stable")[:10]
    assert {eager.scenario_ids[i] for i in least_sure} <= set(keys)
    assert {s.op for _, s in subset} == {"ag_gemm", "gemm_rs"}
    assert informative_subset(plan, 0, predictor) is plan


@pytest.mark.heavy
def test_retrain_end_to_end_on_the_simulator(tmp_path):
    registry = tmp_path / "models"
    args = ["retrain", "--backend", "sim", "--hardware", "h100x8", "--budget", "30", "--grid", "40",
            "--tokens", "2048,8192", "--model-root", str(registry)]  # fmt: skip
    first = runner.invoke(app, [*args, "--out", str(tmp_path / "d1")])
    assert first.exit_code == 0, first.output
    assert "(simulated model): promoted to current (no usable current model)" in first.output
    assert "fingerprint" in first.output and '"backend": "sim"' in first.output
    v1 = current_version(registry, "h100x8-sim")
    assert v1 is not None and current_version(registry, "h100x8") is None

    second = runner.invoke(app, [*args, "--out", str(tmp_path / "d2"), "--seed", "1"])
    assert second.exit_code == 0, second.output
    versions = [c["version"] for c in list_models(registry)["h100x8-sim"]]
    assert len(versions) == 2 and v1 in versions
    v2 = next(v for v in versions if v != v1)
    assert "held-out loss" in second.output and "current model's" in second.output
    if "promoted to current" in second.output:
        assert current_version(registry, "h100x8-sim") == v2
    else:
        assert "not promoted" in second.output and current_version(registry, "h100x8-sim") == v1


def test_retrain_gpu_measure_launches_the_sweep_worker_on_every_gpu(tmp_path, monkeypatch):
    import subprocess

    from ficco.features import get_hardware
    from ficco.harness.plan import plan_scenarios
    from ficco.training.commands import _measure_gpu

    launched = []
    monkeypatch.setattr("ficco.harness.launch.gpu_names", lambda: ["NVIDIA H200"] * 2)
    monkeypatch.setattr(subprocess, "run", lambda command, **kw: launched.append(command) or _Done())
    plan = plan_scenarios([], grid_size=2, hardware=get_hardware("h200x2"))
    _measure_gpu(2)(plan, tmp_path / "ds")
    (command,) = launched
    assert command[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    worker = command[command.index("ficco.harness.worker") + 1 :]
    assert worker[worker.index("--device") + 1] == "cuda" and worker[worker.index("--phase") + 1] == "sweep"
    assert (tmp_path / "ds" / "plan.json").is_file()


class _Done:
    returncode = 0


def test_compare_asks_the_current_model_at_the_new_machines_host_factor(table):
    """The current model is scored on the new sweep as it would answer on that machine."""
    import dataclasses
    from types import SimpleNamespace

    seen = []

    class _Current:
        def decide(self, X, modes, *, host_factor=None):
            seen.append(host_factor)
            return SimpleNamespace(final=np.zeros(len(X), dtype=np.int64))  # always serial/sm

    slower = dataclasses.replace(table, host_factors=np.full(len(table), 1.7))
    better, reason, metrics = compare(slower, 0.0, _Current())
    assert (
        len(seen) == 1
        and set(seen[0]) == {1.7}
        and better
        and "current model's" in reason
        and metrics["n_scenarios"] > 0
    )


def test_compare_never_prefers_a_model_of_the_other_kind(table):
    """Simulated rows do not judge a measured model, nor measured rows a simulated one."""

    class _Measured:
        backend = "measured"

        def decide(self, X, modes, *, host_factor=None):
            raise AssertionError("not asked: the kinds differ")

    better, reason, metrics = compare(table, 0.0, _Measured(), "simulated")
    assert not better and metrics is None
    assert "the new data is simulated and the current model measured" in reason


SHIPPED = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture
def shipped_copy(tmp_path, monkeypatch):
    """A copy of the shipped registry (the measured h200x2 model) as $FICCO_MODEL_ROOT."""
    root = Path(shutil.copytree(SHIPPED, tmp_path / "models"))
    monkeypatch.setenv("FICCO_MODEL_ROOT", str(root))
    return root


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("backend", [[], ["--backend", "auto"], ["--backend", "gpu"]])
def test_retrain_without_gpus_stops_with_one_line_and_keeps_the_measured_model(
    shipped_copy, tmp_path, monkeypatch, backend
):
    monkeypatch.setattr("ficco.harness.launch.gpu_names", list)
    before = _tree(shipped_copy)
    result = runner.invoke(app, ["retrain", *backend, "--out", str(tmp_path / "ds")])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and result.output.startswith("error: retrain measures on GPUs")
    assert "pass --backend sim" in result.output and "h200x2-sim" in result.output
    assert _tree(shipped_copy) == before and not (tmp_path / "ds").exists()


@pytest.mark.heavy
def test_sim_retrain_registers_apart_and_every_answer_says_simulated(shipped_copy, tmp_path):
    """`ficco retrain --backend sim` leaves models/h200x2 as it was and registers h200x2-sim, which the
    CLI, the HTTP service, the Python predictor and the runtime sources all mark simulated."""
    from fastapi.testclient import TestClient

    from ficco.features import HardwareProfile, Scenario, get_hardware
    from ficco.runtime.sources import PredictorSource
    from ficco.service.core.config import Settings
    from ficco.service.main import create_app
    from ficco.training.predict.registry import load_predictor

    before = _tree(shipped_copy)
    measured_version = current_version(shipped_copy, "h200x2")
    args = ["--budget", "16", "--grid", "24", "--tokens", "4096", "--out", str(tmp_path / "ds")]
    result = runner.invoke(app, ["retrain", "--backend", "sim", *args])
    assert result.exit_code == 0, result.output
    assert "the measured model of h200x2 is untouched" in result.output
    assert {k: v for k, v in _tree(shipped_copy).items() if not k.startswith("h200x2-sim/")} == before
    version = current_version(shipped_copy, "h200x2-sim")
    card = list_models(shipped_copy)["h200x2-sim"][0]
    assert card["model_backend"] == "simulated" and card["hardware"]["id"] == "h200x2-sim"
    assert card["dataset"]["backends"] == ["sim"] and card["world_sizes"] == [2]
    fidelity = card["sim_fidelity"]  # the simulator's measured fidelity, and its guard in the policy
    assert fidelity["sim_model"] == SIM_MODEL_VERSION
    assert "2 ranks: fitted and scored" in fidelity["world_size_note"]
    for mode, guard in fidelity["guard_min_gain"].items():
        assert guard is None or card["policy"][mode]["min_gain"] >= guard

    scenario = ["--op", "ag_gemm", "--m", "4096", "--n", "4096", "--k", "4096"]
    answers = {
        hw: json.loads(
            runner.invoke(app, ["recommend", *scenario, "--hardware", hw, "--format", "json"]).stdout
        )
        for hw in ("h200x2", "h200x2-sim")
    }
    assert (answers["h200x2"]["model_backend"], answers["h200x2"]["model_version"]) == (
        "measured",
        measured_version,
    )
    assert (answers["h200x2-sim"]["model_backend"], answers["h200x2-sim"]["model_version"]) == (
        "simulated",
        version,
    )
    assert answers["h200x2-sim"]["sim_fidelity"] == fidelity and answers["h200x2"]["sim_fidelity"] is None
    table = runner.invoke(app, ["recommend", *scenario, "--hardware", "h200x2-sim"]).stdout
    assert f"model version {version} (h200x2-sim, simulated)" in table and "simulated times" in table
    assert f"fidelity ({SIM_MODEL_VERSION}): the simulator's own picks" in table
    config = str(SHIPPED.parent / "datasets" / "model_configs" / "Llama-3.1-8B.json")
    scored = runner.invoke(app, ["score", config, "--hardware", "h200x2-sim", "--format", "json"])
    assert json.loads(scored.stdout)["model_backend"] == "simulated"
    assert json.loads(scored.stdout)["sim_fidelity"] == fidelity

    settings = Settings(MODEL_ROOT=shipped_copy, RELOAD_POLL_S=0, RELOAD_TOKEN=None)
    with TestClient(create_app(settings)) as client:
        body = {"op": "ag_gemm", "m": 4096, "n": 4096, "k": 4096}
        assert client.post("/v1/recommend", json=body).json()["model_backend"] == "measured"
        sim = client.post("/v1/recommend", json={**body, "hardware": "h200x2-sim"}).json()
        assert (sim["model_backend"], sim["hardware_substitution"]) == ("simulated", None)
        assert sim["sim_fidelity"] == fidelity
        batch = client.post("/v1/recommend/batch", json={"scenarios": [{**body, "hardware": "h200x2-sim"}]})
        assert batch.json()["data"][0]["result"]["model_backend"] == "simulated"
        config_body = json.loads(Path(config).read_text())
        score = client.post(
            "/v1/score", json={"config": config_body, "tp": 2, "tokens": [4096], "hardware": "h200x2-sim"}
        )
        assert score.json()["model_backend"] == "simulated"

    predictor = load_predictor(shipped_copy, "h200x2-sim")
    on_it = Scenario(hardware=HardwareProfile.from_dict(card["hardware"]))
    assert predictor.recommend([on_it])[0].model_backend == "simulated"
    on_the_machine = Scenario(hardware=get_hardware("h200x2"))  # what a runtime on that machine builds
    (answer,) = PredictorSource.load(str(shipped_copy), "h200x2-sim").recommend([on_the_machine], "eager")
    assert answer.model_backend == "simulated" and answer.origin.endswith("(simulated)")


def test_retrain_on_other_gpus_than_the_hardwares_stops_with_one_line(shipped_copy, tmp_path, monkeypatch):
    """A measured h200x2 model is never trained on H100 measurements: the stop names the id that fits."""
    monkeypatch.setattr("ficco.harness.launch.gpu_names", lambda: ["NVIDIA H100 80GB HBM3"] * 4)
    before = _tree(shipped_copy)
    result = runner.invoke(app, ["retrain", "--hardware", "h200x2", "--out", str(tmp_path / "ds")])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "not of this machine's NVIDIA H100 80GB HBM3: use hardware h100x2 " in result.output
    assert _tree(shipped_copy) == before and not (tmp_path / "ds").exists()
