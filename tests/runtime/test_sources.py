"""Schedule sources: both predictor signatures through one adapter, the shipped model, the HTTP service
(mocked transport), fixed and table sources."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from ficco.features import Scenario
from ficco.runtime import FixedSource, Planner, PredictorSource, ServiceSource, TableSource
from ficco.runtime.sources import Answer
from ficco.service.client import ServiceClient

SCENARIOS = [Scenario(op="ag_gemm", m=8192, n=7168, k=4096), Scenario(op="gemm_rs", m=8192, n=4096, k=7168)]


def _rec(schedule: str, **extra) -> SimpleNamespace:
    fields = {"schedule": schedule, "predicted_speedup": 1.2, "fallback": False, "fallback_reason": None}
    return SimpleNamespace(**fields, **extra)


class ModePredictor:
    """``recommend(scenarios, mode="eager")`` with per-mode answers."""

    hardware_id, version = "h200x2", "new"

    def __init__(self):
        self.modes, self.machines = [], []

    def recommend(self, scenarios, mode="eager", **machine):
        self.modes.append(mode)
        self.machines.append(machine)
        schedule = "finer/dma/s2/chunk" if mode == "graph" else "shard/sm"
        return [_rec(schedule, mode=mode, predicted_speedups={schedule: 1.2}) for _ in scenarios]


def test_predictor_source_passes_the_mode():
    predictor = ModePredictor()
    source = PredictorSource(predictor)
    assert [a.schedule for a in source.recommend(SCENARIOS, "graph")] == ["finer/dma/s2/chunk"] * 2
    assert [a.schedule for a in source.recommend(SCENARIOS, "eager")] == ["shard/sm"] * 2
    assert predictor.modes == ["graph", "eager"]
    assert predictor.machines == [{}, {}]  # no host factor given: the model's own


def test_predictor_source_passes_this_machines_host_factor():
    predictor = ModePredictor()
    PredictorSource(predictor, host_factor=1.4).recommend(SCENARIOS, "eager")
    assert predictor.machines == [{"host_factor": 1.4}]


def test_shipped_model_answers_through_the_planner():
    source = PredictorSource.load(hardware_id="h200x2")
    answers = source.recommend(SCENARIOS, "eager")
    assert len(answers) == 2 and all(a.origin.startswith("model h200x2/") for a in answers)
    planner = Planner(source)
    assert planner.hardware.id == "h200x2"


def _service(handler) -> ServiceSource:
    return ServiceSource(
        ServiceClient("http://ficco.test", transport=httpx.MockTransport(handler), retries=0)
    )


def test_service_source_sends_one_batch_and_reads_the_answers():
    bodies = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        answer = {
            "schedule": "shard/dma",
            "mode": "eager",
            "predicted_speedups": {"serial/sm": 1.0, "shard/dma": 1.4},
            "predicted_speedup": 1.4,
            "fallback": False,
            "fallback_reason": None,
            "model_version": "v",
            "hardware_id": "h200x2",
            "requested_hardware": "h200x2",
            "hardware_substitution": None,
        }
        n = len(bodies[-1]["scenarios"])
        items = [{"index": i, "status": "ok", "result": answer, "errors": None} for i in range(n)]
        return httpx.Response(200, json={"data": items, "count": n, "failed": 0})

    source = _service(handler)
    answers = source.recommend(SCENARIOS, "eager")
    assert [a.schedule for a in answers] == ["shard/dma"] * 2 and answers[0].predicted_speedup == 1.4
    assert len(bodies) == 1
    sent = bodies[0]["scenarios"][0]
    assert {k: sent[k] for k in ("op", "m", "n", "k", "dtype", "world_size", "hardware")} == {
        "op": "ag_gemm",
        "m": 8192,
        "n": 7168,
        "k": 4096,
        "dtype": "bf16",
        "world_size": 2,
        "hardware": "h200x2",
    }
    assert sent["mode"] == "eager" and sent.get("host_factor") is None
    client = ServiceClient("http://ficco.test", transport=httpx.MockTransport(handler), retries=0)
    ServiceSource(client, host_factor=1.6).recommend(SCENARIOS, "eager")
    assert [item["host_factor"] for item in bodies[-1]["scenarios"]] == [1.6, 1.6]


def test_a_scenario_the_service_refuses_runs_serial_and_the_others_their_answers():
    """The batch answers per item: a refused one is that scenario's serial fallback, with the service's
    line; the rest keep their schedules."""
    error = {
        "loc": ["body", "scenarios", 1, "world_size"],
        "field": "scenarios.1.world_size",
        "input": 2,
        "msg": "no model answers hardware 'h200x2' at world_size=2",
        "type": "not_served",
        "allowed": None,
    }
    answer = {
        "schedule": "shard/dma",
        "mode": "eager",
        "predicted_speedups": {"serial/sm": 1.0, "shard/dma": 1.4},
        "predicted_speedup": 1.4,
        "fallback": False,
        "fallback_reason": None,
        "model_version": "v",
        "hardware_id": "h200x2",
        "requested_hardware": "h200x2",
        "hardware_substitution": None,
    }
    items = [
        {"index": 0, "status": "ok", "result": answer, "errors": None},
        {"index": 1, "status": "error", "result": None, "errors": [error]},
    ]
    source = _service(lambda request: httpx.Response(200, json={"data": items, "count": 2, "failed": 1}))
    ok, refused = source.recommend(SCENARIOS, "eager")
    assert (ok.schedule, ok.fallback) == ("shard/dma", False)
    assert (refused.schedule, refused.fallback) == ("serial/sm", True)
    assert refused.fallback_reason.startswith("the service refused it: POST /v1/recommend/batch refused")
    assert "world_size: no model answers hardware 'h200x2' at world_size=2" in refused.fallback_reason


def test_service_down_runs_serial_with_the_reason():
    planner = Planner(_service(lambda request: httpx.Response(503, text="loading")))
    request = SimpleNamespace(
        layer="qkv", direction="fwd", op="ag_gemm", m=64, n=32, k=16, dtype="bf16", world_size=2
    )
    assert str(planner.schedule(request)) == "serial/sm"
    assert "ServiceError" in planner.rows()[0]["note"]


def test_fixed_source_falls_back_where_the_schedule_cannot_run():
    small = Scenario(op="ag_gemm", m=8, n=16, k=16)
    answers = FixedSource("finer/dma/s8/chunk").recommend([small, SCENARIOS[0]], "eager")
    assert answers[0].fallback and "divisible" in answers[0].fallback_reason
    assert answers[1].schedule == "finer/dma/s8/chunk"


def test_table_source_looks_up_by_op_shape_and_mode():
    table = {("ag_gemm", 8192, 7168, 4096, "graph"): Answer(schedule="shard/dma")}
    source = TableSource(table)
    assert source.recommend(SCENARIOS[:1], "graph")[0].schedule == "shard/dma"
    missing = source.recommend(SCENARIOS[:1], "eager")[0]
    assert missing.fallback and "not in the table" in missing.fallback_reason
    measured = TableSource(table, on_missing=lambda s, mode: Answer(schedule="shard/sm", origin="measured"))
    assert measured.recommend(SCENARIOS[1:], "eager")[0].origin == "measured"


@pytest.mark.parametrize("bad", ["shard", 3])
def test_fixed_source_rejects_unknown_schedules(bad):
    with pytest.raises(ValueError, match="schedule"):
        FixedSource(bad)


def test_fixed_source_takes_a_token_range_table():
    source = FixedSource("0:serial/sm;2048:shard/dma")
    picks = [source.answer(Scenario(op="ag_gemm", m=m, n=64, k=64), "eager").schedule for m in (1024, 8192)]
    assert picks == ["serial/sm", "shard/dma"] and source.cache_key == "fixed 0:serial/sm;2048:shard/dma"


def test_hardware_of_names_the_built_in_profile_of_a_device():
    from ficco.features.hardware import hardware_of

    assert hardware_of("NVIDIA H100 80GB HBM3", 2).id == "h100x2"
    assert hardware_of("NVIDIA H200", 8).id == "h200x8"
    assert hardware_of("AMD Instinct MI300X", 8).id == "mi300xx8"
    assert hardware_of("NVIDIA H200", 3) is None and hardware_of("NVIDIA A100-SXM4-80GB", 2) is None


NO_TORCH = """
import sys

sys.modules["torch"] = None  # importing torch raises ModuleNotFoundError: an install without it
from ficco.features import Scenario
from ficco.runtime import TableSource

source = TableSource.load(sys.argv[1])  # machine="auto": no nvidia-smi on PATH, no torch: nothing to check
answer = source.recommend([Scenario(op="ag_gemm", m=4096, n=4096, k=4096)], "graph")[0]
print(answer.schedule, sorted(m for m in sys.modules if m.startswith(("ficco.executor", "ficco.runtime."))))
"""


def test_table_source_reads_tables_without_torch(tmp_path):
    """A runtime reads exported tables with neither torch nor the executor imported (``ficco.runtime``
    imports its modules on first use), and checks no fingerprint where no GPU can be seen."""
    import os
    import shutil
    import subprocess
    import sys

    from ficco.files import SHIPPED_MODELS

    if shutil.which("nvidia-smi", path="/usr/bin:/bin"):
        pytest.skip("nvidia-smi is on the system PATH: the table's fingerprint would be checked here")
    from ficco.training.export import build_schedule_table
    from ficco.training.predict.registry import load_predictor

    predictor = load_predictor(SHIPPED_MODELS, "h200x2")
    table = build_schedule_table(predictor, [("ag_gemm", 4096, 4096, 0, 0)], world_size=2, mode="graph",
                                 dtype="bf16")  # fmt: skip
    table.write(tmp_path)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(repo)}  # no nvidia-smi; this checkout
    done = subprocess.run([sys.executable, "-c", NO_TORCH, str(tmp_path)], capture_output=True, text=True,
                          env=env, check=False, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    schedule, modules = done.stdout.split(" ", 1)
    expected = table.entries[("ag_gemm", 4096, 4096, 0, 0)].lookup(4096, 2).schedule
    assert schedule == expected and modules.strip() == "['ficco.runtime.sources']"
