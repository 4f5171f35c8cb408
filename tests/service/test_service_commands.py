"""``ficco score``, ``ficco recommend`` and ``ficco serve --prepare-only``: same answers as the API."""

from __future__ import annotations

import csv
import io
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ficco.cli import app
from ficco.features import Scenario, get_hardware

CONFIG = Path(__file__).resolve().parents[2] / "datasets" / "model_configs" / "Llama-3.1-8B.json"
runner = CliRunner()
HARDWARE = "h200x2"


def _run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def test_score_json_equals_api(client, registry_root):
    code, out = _run(
        "score",
        str(CONFIG),
        "--tp",
        "2",
        "--tokens",
        "4096,16384",
        "--format",
        "json",
        "--model-root",
        str(registry_root),
    )
    assert code == 0, out
    body = {"config": json.loads(CONFIG.read_text()), "name": CONFIG.stem, "tp": 2, "tokens": [4096, 16384]}
    assert json.loads(out) == client.post("/v1/score", json=body).json()


def test_score_table_and_csv_show_every_pair(registry_root):
    code, table = _run("score", str(CONFIG), "--tokens", "4096", "--model-root", str(registry_root))
    assert code == 0, table
    assert all(name in table for name in ("qkv", "attn_out", "mlp_up", "mlp_down", "ms per step"))
    code, text = _run(
        "score", str(CONFIG), "--tokens", "4096,8192", "--format", "csv", "--model-root", str(registry_root)
    )
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 8
    assert {r["tokens"] for r in rows} == {"4096", "8192"}


def test_score_bad_tokens_exit_1_naming_file_and_field(registry_root):
    code, out = _run("score", str(CONFIG), "--tokens", "4096,4097", "--model-root", str(registry_root))
    assert code == 1
    assert f"{CONFIG}: tokens.1:" in out and "multiple of tp=2" in out


def test_recommend_json_equals_api(client, registry_root):
    code, out = _run(
        "recommend",
        "--op",
        "gemm_rs",
        "--m",
        "8192",
        "--n",
        "4096",
        "--k",
        "7168",
        "--format",
        "json",
        "--model-root",
        str(registry_root),
    )
    assert code == 0, out
    api = client.post("/v1/recommend", json={"op": "gemm_rs", "m": 8192, "n": 4096, "k": 7168}).json()
    assert json.loads(out) == api


def test_recommend_for_another_machines_host_factor(client, registry_root):
    args = ["recommend", "--op", "ag_gemm", "--m", "512", "--n", "4096", "--k", "4096", "--format", "json"]
    code, out = _run(*args, "--host-factor", "2.5", "--model-root", str(registry_root))
    assert code == 0, out
    body = {"op": "ag_gemm", "m": 512, "n": 4096, "k": 4096, "host_factor": 2.5}
    assert json.loads(out) == client.post("/v1/recommend", json=body).json()
    assert json.loads(out)["host_factor"] == 2.5
    code, out = _run(*args, "--host-factor", "20", "--model-root", str(registry_root))
    assert code == 2 and "host_factor" in out


def test_recommend_table_shows_schedule(registry_root):
    code, out = _run(
        "recommend",
        "--op",
        "ag_gemm",
        "--m",
        "8192",
        "--n",
        "4096",
        "--k",
        "4096",
        "--model-root",
        str(registry_root),
    )
    assert code == 0, out
    assert out.startswith("schedule: ") and "predicted speedup" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--op", "nope"], "op: Input should be 'ag_gemm'"),
        (["--world-size", "9"], "world_size"),
        (["--m", "8191"], "Scenario.m must be divisible by world_size=2"),
        (["--hardware", "tpu9"], "unknown hardware id 'tpu9'"),
    ],
)
def test_recommend_bad_input_exits_2_with_message(registry_root, args, message):
    base = {"--op": "ag_gemm", "--m": "8192", "--n": "4096", "--k": "4096"}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    code, out = _run("recommend", *[x for kv in base.items() for x in kv], "--model-root", str(registry_root))
    assert code == 2
    assert message in out


def test_recommend_empty_registry_exits_2(tmp_path):
    code, out = _run(
        "recommend", "--op", "ag_gemm", "--m", "64", "--n", "64", "--k", "64", "--model-root", str(tmp_path)
    )
    assert code == 2
    assert "no model could be loaded" in out and "--prepare-only" in out


def test_serve_prepare_only_keeps_registered_model(registry_root, caplog):
    from ficco.training.predict.registry import current_version

    before = current_version(registry_root, HARDWARE)
    with caplog.at_level(logging.INFO):
        code, out = _run("serve", "--prepare-only", "--model-root", str(registry_root))
    assert code == 0, out
    assert current_version(registry_root, HARDWARE) == before
    assert f"default model: {HARDWARE} version {before}" in caplog.text


def test_serve_prepare_only_without_dataset_exits_2(tmp_path, monkeypatch):
    monkeypatch.setenv("FICCO_DATASET_ROOT", str(tmp_path / "datasets"))
    code, out = _run("serve", "--prepare-only", "--model-root", str(tmp_path / "models"))
    assert code == 2
    assert "shipped dataset" in out and "is missing" in out


@pytest.mark.heavy
def test_serve_prepare_only_trains_default_model_from_dataset(tmp_path, monkeypatch, caplog):
    """The default model is trained from a measured dataset only: simulated rows are refused first (the
    second dataset stands in for GPU measurements: the simulator's times under the gpu backend's name)."""
    from ficco.harness.sim import SimBackend
    from ficco.harness.sweep import run_sweep
    from ficco.training import train
    from ficco.training.fit import TrainConfig
    from ficco.training.predict.policy import DecisionPolicy
    from ficco.training.predict.registry import current_version, load_predictor

    hw = get_hardware(HARDWARE)
    rng = np.random.default_rng(0)
    plan = {}
    while len(plan) < 40:
        s = Scenario(
            op="ag_gemm",
            m=2 * int(rng.choice([64, 1024, 16384])),
            n=int(128 * rng.integers(4, 65)),
            k=int(128 * rng.integers(4, 65)),
            hardware=hw,
        )
        plan[s.key()] = ("grid", s)
    dataset = tmp_path / "datasets" / HARDWARE
    run_sweep(list(plan.values()), SimBackend(hw), dataset, progress=False)
    monkeypatch.setenv("FICCO_DATASET_ROOT", str(tmp_path / "datasets"))
    code, out = _run("serve", "--prepare-only", "--model-root", str(tmp_path / "models"))
    assert code == 2 and "holds rows of backends ['sim'], not GPU measurements only" in out
    assert current_version(tmp_path / "models", HARDWARE) is None
    shutil.rmtree(dataset)
    run_sweep(
        list(plan.values()), type("Measured", (SimBackend,), {"name": "gpu"})(hw), dataset, progress=False
    )
    fast = train.train_model
    monkeypatch.setattr(  # the orchestration is under test, not the (slow) full cross-validation grid
        train,
        "train_model",
        lambda table, **kw: fast(
            table,
            configs=(TrainConfig(max_depth=2, n_estimators=5),),
            policies=(DecisionPolicy(),),
            **{k: v for k, v in kw.items() if k == "seed"},
        ),
    )
    monkeypatch.setenv("FICCO_DATASET_ROOT", str(tmp_path / "datasets"))
    with caplog.at_level(logging.INFO):
        code, out = _run("serve", "--prepare-only", "--model-root", str(tmp_path / "models"))
    assert code == 0, out
    version = current_version(tmp_path / "models", HARDWARE)
    assert version is not None
    assert load_predictor(tmp_path / "models", HARDWARE).card["dataset"]["n_scenarios"] == 40
    assert "training one from" in caplog.text and f"promoted {HARDWARE} version {version}" in caplog.text
