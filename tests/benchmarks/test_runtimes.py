"""The runtimes benchmark (``benchmarks/runtimes.py``): its CPU mode on 2 gloo ranks at debug size runs every
variant that runs without GPUs, checks it against serial, writes the JSON, markdown and plot, and a second
run resumes (measures nothing again); the done-when arithmetic on made-up points."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from executor_world import run_world

from benchmarks import runtimes as bench

ARGV = [
    "--device",
    "cpu",
    "--tokens",
    "32",
    "--warmup",
    "1",
    "--rounds",
    "1",
    "--reps",
    "1",
    "--timed-ms",
    "0",
]


def _cpu_run(rank: int, world_size: int, out: str) -> dict:
    return bench.main([*ARGV, "--out", out])


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory) -> tuple[dict, dict, Path]:
    out = tmp_path_factory.mktemp("runtimes")
    first = run_world(2, _cpu_run, str(out), timeout_s=300)[0]
    again = run_world(2, _cpu_run, str(out), timeout_s=300)[0]
    return first, again, out


@pytest.mark.slow
def test_cpu_run_checks_every_ficco_variant_against_serial(cpu_run):
    result, _, _ = cpu_run
    assert {(p["model"], p["phase"], p["tokens"]) for p in result["points"]} == {
        ("debug", "inference", 32),
        ("debug", "train", 32),
    }
    for p in result["points"]:
        assert set(p["step_ms"]) == set(bench.VARIANTS)
        assert all(p["step_ms"][v] > 0 for v in ("serial", *bench.FICCO_VARIANTS))
        assert p["step_ms"]["async_tp"] is None and "async_tp" in p["unavailable"]
        assert p["vllm_rule_runs"] == "serial" and p["step_ms"]["vllm_rule"] == p["step_ms"]["serial"]
        assert p["errors"] == {}
        assert 0.0 <= p["comm_share"] <= 1.0 and p["comm_only_ms"] > 0
        assert set(p["rel_err"]) == set(bench.FICCO_VARIANTS)
        assert all(e <= bench.TOLERANCE["fp32"] for e in p["rel_err"].values()), p["rel_err"]
    summary = result["summary"]
    assert summary["goals_met"]["gradients"] is True
    assert set(summary["goals"]) == set(bench.GOALS)
    assert summary["goals"]["vs_async_tp"] is None  # no async-TP on the CPU


@pytest.mark.slow
def test_what_ran_is_reported_per_variant(cpu_run):
    result, _, _ = cpu_run
    train = next(p for p in result["points"] if p["phase"] == "train")
    calls = {v: o["calls"] for v, o in train["ops"].items()}
    assert not any(name.startswith("ficco::") for name in calls["serial"])
    # one layer: q/k/v and w1/w3 gather once each, wo and w2 scatter; the backward runs the other op of each.
    # Each op runs its twin without autograd: what the compiled graphs hold too
    for op in ("all_gather_matmul", "matmul_reduce_scatter"):
        assert calls["ficco_eager"][f"ficco::{op}"] == calls["ficco_eager"][f"ficco::_{op}"] == 4
    assert {r["layer"] for r in train["ops"]["ficco_eager"]["ran"]} == {
        f"layers.0.{m}" for m in ("attention.wq", "attention.wo", "feed_forward.w1", "feed_forward.w2")
    }
    compiled = train["ops"]["ficco_compile"]
    # the compile pass: 4 forward ops per layer; 4 input gradients, the row-parallel layers' gathers and the
    # column-parallel ones' reduce-scatters of summed matmuls (q/k/v, w1/w3)
    assert [r["direction"] for r in compiled["ran"]].count("fwd") == 4
    assert [r["direction"] for r in compiled["ran"]].count("bwd-input") == 4
    assert compiled["left"] == []
    assert calls["ficco_compile"]["ficco::_all_gather_matmul"] == 4
    assert "ficco::all_gather_matmul" not in calls["ficco_compile"]
    for variant in bench.FICCO_VARIANTS:
        assert all(r["ran"] == r["schedule"] for r in train["ops"][variant]["ran"])


@pytest.mark.slow
def test_cpu_run_writes_json_markdown_plot_and_resumes(cpu_run):
    result, again, out = cpu_run
    path = out / "runtimes-cpu.json"
    written = json.loads(path.read_text())
    assert written["meta"]["hardware"] == "cpu" and written["meta"]["loopback"] is False
    assert len(written["points"]) == 2 and written["summary"] == result["summary"]
    assert set(written["compile_reports"]) == {"debug/inference", "debug/train"}
    md = path.with_suffix(".md").read_text()
    assert "## Done when (issue 41)" in md and "not a GPU result" in md
    assert path.with_suffix(".png").stat().st_size > 0
    # the second run found both points done: the same timings, nothing measured again
    assert again["points"] == result["points"]


def _point(model, phase, tokens, comm, **ms) -> dict:
    step = {v: ms.get(v) for v in bench.VARIANTS}
    return {"model": model, "phase": phase, "tokens": tokens, "comm_share": comm, "step_ms": step,
            "rel_err": {"ficco_eager": 1e-3, "ficco_compile": 1e-3}, "errors": {}}  # fmt: skip


def test_summary_takes_the_faster_ficco_variant_per_job_over_comm_heavy_points():
    points = [
        _point("m", "train", 256, 0.1, serial=10, async_tp=12, ficco_eager=9, ficco_compile=11, vllm_rule=10),
        _point(
            "m", "train", 1024, 0.3, serial=20, async_tp=18, ficco_eager=15, ficco_compile=16, vllm_rule=18
        ),
        _point(
            "m", "inference", 256, 0.5, serial=4, async_tp=5, ficco_eager=4.2, ficco_compile=2, vllm_rule=4
        ),
    ]
    s = bench.summarize(points, "bf16")
    assert s["ficco_choice"] == {"m/inference": "ficco_compile", "m/train": "ficco_eager"}
    assert s["comm_heavy_points"] == 2
    assert math.isclose(s["goals"]["vs_async_tp"], math.sqrt(18 / 15 * 5 / 2))
    assert math.isclose(s["goals"]["vs_vllm_rule"], math.sqrt(18 / 15 * 4 / 2))
    assert math.isclose(s["goals"]["vs_serial_min"], 10 / 9)  # every point counts, not only heavy ones
    assert s["goals_met"] == {
        "vs_async_tp": True,
        "vs_vllm_rule": True,
        "vs_serial_min": True,
        "gradients": True,
    }
    assert bench.summarize(points, "bf16", loopback=True)["goals_met"]["gradients"] is None
    points[0]["rel_err"]["ficco_compile"] = 0.5
    assert bench.summarize(points, "bf16")["goals_met"]["gradients"] is False


@pytest.mark.parametrize(
    ("hardware", "dim", "tokens", "runs"),
    [
        ("h200x2", 8192, 512, "serial"),  # Llama-3.1-70B: vLLM's threshold on sm90 at TP=2 is 1024 tokens
        ("h200x2", 8192, 1024, "async_tp"),
        ("h100x2", 8192, 16384, "async_tp"),
        ("h200x2", 4096, 16384, "serial"),  # Llama-3.1-8B: below vLLM's smallest hidden size
        ("cpu", 8192, 16384, "serial"),
    ],
)
def test_vllm_rule_runs_async_tp_from_its_token_threshold(hardware, dim, tokens, runs):
    import types

    ctx = types.SimpleNamespace(hardware=hardware, world_size=2)
    assert bench.vllm_choice(dim, tokens, ctx) == runs


def test_hardware_id_comes_from_the_gpu_name(monkeypatch):
    import torch

    cuda = torch.device("cuda", 0)
    for name, world, want in [
        ("NVIDIA H200", 2, "h200x2"),
        ("NVIDIA H100 80GB HBM3", 2, "h100x2"),
        ("NVIDIA A100-SXM4-80GB", 2, "a100-sxm4-80gbx2"),
    ]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device, name=name: name)
        assert bench.hardware_id(cuda, world) == want
    assert bench.hardware_id(torch.device("cpu"), 2) == "cpu"
