"""The retraining job: budget selection, and the whole job on the simulator (as CI runs it)."""

from __future__ import annotations

import numpy as np
from typer.testing import CliRunner

from ficco.cli import app
from ficco.training.registry import current_version, list_models
from ficco.training.retrain import compare, decision_margin, farthest_points, informative_subset

runner = CliRunner()


def test_farthest_points_spreads_and_stops_at_duplicates():
    Z = np.array([[0.0], [0.1], [10.0], [5.0], [10.0]])
    assert farthest_points(Z, 3, []) == [0, 2, 3]
    assert farthest_points(Z, 2, [2]) == [0, 3]
    assert len(farthest_points(np.zeros((4, 2)), 3, [])) == 1


def test_informative_subset_takes_the_least_sure_and_a_spread(trained, table):
    from ficco.harness.plan import Plan
    from ficco.training.predictor import Predictor

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


def test_retrain_end_to_end_on_the_simulator(tmp_path):
    registry = tmp_path / "models"
    args = ["retrain", "--backend", "sim", "--hardware", "h100x8", "--budget", "30", "--grid", "40",
            "--tokens", "2048,8192", "--registry", str(registry)]  # fmt: skip
    first = runner.invoke(app, [*args, "--out", str(tmp_path / "d1")])
    assert first.exit_code == 0, first.output
    assert "promoted to current (no usable current model)" in first.output
    assert "fingerprint" in first.output and '"backend": "sim"' in first.output
    v1 = current_version(registry, "h100x8")
    assert v1 is not None

    second = runner.invoke(app, [*args, "--out", str(tmp_path / "d2"), "--seed", "1"])
    assert second.exit_code == 0, second.output
    versions = [c["version"] for c in list_models(registry)["h100x8"]]
    assert len(versions) == 2 and v1 in versions
    v2 = next(v for v in versions if v != v1)
    assert "held-out loss" in second.output and "current model's" in second.output
    if "promoted to current" in second.output:
        assert current_version(registry, "h100x8") == v2
    else:
        assert "not promoted" in second.output and current_version(registry, "h100x8") == v1


def test_retrain_gpu_measure_launches_the_sweep_worker_on_every_gpu(tmp_path, monkeypatch):
    import subprocess

    from ficco.features import get_hardware
    from ficco.harness.plan import plan_scenarios
    from ficco.training.commands import _measure_gpu

    launched = []
    monkeypatch.setattr("ficco.harness.launch.gpu_count", lambda: 2)
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

    better, reason, metrics = compare(dataclasses.replace(table, host_factor=1.7), 0.0, _Current())
    assert seen == [1.7] and better and "current model's" in reason and metrics["n_scenarios"] > 0
