"""The runtimes benchmark (``benchmarks/runtimes.py``): its CPU mode on 2 gloo ranks at debug size runs every
variant that runs without GPUs (the compiled baselines and the limit included, two layers compiled per
block), checks it against serial, runs the eager diagnoses, writes the JSON, markdown and plot, and a second
run resumes (measures nothing again); at 4 ranks the eager styles still equal serial; the comparisons, the
done-when and the report on made-up points, results from before the compiled baselines included."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
from executor_world import run_world

from benchmarks import REPO, loopback_report
from benchmarks import runtimes as bench
from benchmarks import runtimes_report as report
from benchmarks.support import end_to_end as e2e

pytestmark = pytest.mark.heavy

ARGV = ["--device", "cpu", "--tokens", "32", "--layers", "2", "--warmup", "1", "--rounds", "1", "--reps", "1",
        "--timed-ms", "0"]  # fmt: skip


def _cpu_run(rank: int, world_size: int, out: str, *extra: str) -> dict:
    return bench.main([*ARGV, "--out", out, *extra])


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory) -> tuple[dict, dict, Path]:
    out = tmp_path_factory.mktemp("runtimes")
    first = run_world(2, _cpu_run, str(out), timeout_s=420)[0]
    again = run_world(2, _cpu_run, str(out), timeout_s=300)[0]
    return first, again, out


@pytest.mark.slow
def test_cpu_run_checks_every_variant_against_serial(cpu_run):
    result, _, _ = cpu_run
    assert [(p["model"], p["phase"], p["tokens"]) for p in result["points"]] == [
        ("debug", "inference", 32),
        ("debug", "train", 32),
    ]
    for p in result["points"]:
        assert all(p["step_ms"][v] > 0 for v in ("serial", "ficco_eager", "serial_compile", "ficco_compile"))
        assert p["step_ms"]["no_comm"] > 0 and 0.0 <= e2e.limit_share(p) <= 1.0
        assert p["step_ms"]["async_tp"] is None and "async_tp" in p["unavailable"]
        # vLLM compiles either way: below its threshold it runs the compiled serial step
        assert p["vllm_rule_runs"] == "serial_compile"
        assert p["step_ms"]["vllm_rule"] == p["step_ms"]["serial_compile"]
        assert p["errors"] == {}
        assert "no_comm" not in p["rel_err"]  # its values are wrong by design
        assert all(e <= e2e.TOLERANCE["fp32"] for e in p["rel_err"].values()), p["rel_err"]
        assert p["profile"] == {}  # the GPU profile: CUDA only
    train = result["points"][1]
    assert set(bench.DIAGNOSES) <= set(train["step_ms"]) and set(bench.DIAGNOSES) <= set(train["rel_err"])
    assert all(train["step_ms"][v] > 0 for v in bench.DIAGNOSES)
    assert train["verify"] is not None  # debug sizes: every pick serial/sm, so nothing was pinned
    assert result["summary"]["goals_met"]["gradients"] is True


@pytest.mark.slow
def test_no_comm_runs_no_collective(cpu_run):
    result, _, _ = cpu_run
    for p in result["points"]:
        calls = p["ops"]["no_comm"]["calls"]
        assert not any("all_gather" in c or "reduce_scatter" in c for c in calls), calls
        assert any("reduce_scatter" in c for c in p["ops"]["serial_compile"]["calls"])


@pytest.mark.slow
def test_what_ran_is_reported_per_variant(cpu_run):
    result, _, _ = cpu_run
    train = result["points"][1]
    calls = {v: o["calls"] for v, o in train["ops"].items()}
    assert not any(name.startswith("ficco::") for name in calls["serial"])
    # two layers: q/k/v and w1/w3 gather once each, wo and w2 scatter; the backward runs the other op of
    # each (of q/k/v and w1/w3: the reduce-scatter of the summed GEMMs). Each op runs its twin without
    # autograd: what the compiled graphs hold too
    for op, count in (("all_gather_matmul", 8), ("matmul_reduce_scatter", 4), ("matmuls_reduce_scatter", 4)):
        assert calls["ficco_eager"][f"ficco::{op}"] == calls["ficco_eager"][f"ficco::_{op}"] == count
    assert {r["layer"] for r in train["ops"]["ficco_eager"]["ran"]} == {
        f"layers.{i}.{m}"
        for i in range(2)
        for m in ("attention.wq", "attention.wo", "feed_forward.w1", "feed_forward.w2")
    }
    compiled = train["ops"]["ficco_compile"]
    # the layers share one compiled graph per direction: 4 forward sites; 4 input gradients', the row-parallel
    # layers' gathers and the column-parallel ones' reduce-scatters of summed matmuls (q/k/v, w1/w3). Every
    # pick serial/sm at debug sizes: each site stays PyTorch's compiled path, reported as left for serial
    assert compiled["ran"] == [] and {x["reason"] for x in compiled["left"]} == {"serial"}
    assert [x["direction"] for x in compiled["left"]].count("fwd") == 4
    assert [x["direction"] for x in compiled["left"]].count("bwd-input") == 4
    assert not any(name.startswith("ficco::") for name in calls["ficco_compile"])
    for variant in ("ficco_eager", "ficco_compile"):
        assert all(r["ran"] == r["schedule"] for r in train["ops"][variant]["ran"])


@pytest.mark.slow
def test_cpu_run_writes_json_markdown_plot_and_resumes(cpu_run):
    result, again, out = cpu_run
    path = out / "runtimes-cpu.json"
    written = json.loads(path.read_text())
    assert written["meta"]["hardware"] == "cpu" and written["meta"]["layers"] == 2
    assert len(written["points"]) == 2 and written["summary"] == result["summary"]
    md = path.with_suffix(".md").read_text()
    assert "## Done when (issue 48)" in md and "not a GPU result" in md
    assert "| debug | train | 32 |" in md and "ficco_eager:bwd_serial" in md
    assert path.with_suffix(".png").stat().st_size > 0
    # the second run found both points done: the same timings, nothing measured again
    assert again["points"] == result["points"]


def _redo_run(rank: int, world_size: int, out: str) -> tuple[dict, dict]:
    redo = ["--phases", "train", "--redo", "ficco_eager", "ficco_eager:all_serial"]
    return _cpu_run(rank, world_size, out, *redo), _cpu_run(rank, world_size, out, *redo)


@pytest.mark.slow
def test_redo_measures_the_named_variants_and_serial_again(cpu_run):
    result, _, out = cpu_run
    first, second = run_world(2, _redo_run, str(out), timeout_s=300)[0]
    before, after = result["points"][1], first["points"][1]
    assert after["redone"]["variants"] == ["ficco_eager", "ficco_eager:all_serial"]
    # measured again: serial (the baseline, in the same rounds) and the named variants, checked again
    assert all(after["step_ms"][v] > 0 for v in ("serial", "ficco_eager", "ficco_eager:all_serial"))
    assert after["rel_err"]["ficco_eager"] <= e2e.TOLERANCE["fp32"]
    assert after["ops"]["ficco_eager"]["calls"]
    # the rest keep their numbers; the inference point was not asked for
    for v in ("serial_compile", "ficco_compile", "no_comm", "ficco_eager:bwd_serial", "ficco_eager:sm_only"):
        assert after["step_ms"][v] == before["step_ms"][v], v
    assert first["points"][0] == result["points"][0]
    # a second call finds the point redone for these variants: nothing measured again
    assert second["points"] == first["points"]


def _redo_all_run(rank: int, world_size: int, out: str) -> tuple[dict, dict]:
    redo = ["--phases", "train", "--redo", "all"]
    return _cpu_run(rank, world_size, out, *redo), _cpu_run(rank, world_size, out, *redo)


@pytest.mark.slow
def test_redo_all_measures_the_points_again_with_every_variant(cpu_run, tmp_path):
    result, _, out = cpu_run
    shutil.copytree(out, tmp_path / "out")  # the first run's JSON, whatever other tests redo in out
    first, second = run_world(2, _redo_all_run, str(tmp_path / "out"), timeout_s=300)[0]
    before, after = result["points"][1], first["points"][1]
    assert after["redone"]["variants"] == ["all"] and len(first["points"]) == len(result["points"])
    assert set(after["step_ms"]) == set(before["step_ms"])
    # every variant measured again, the compiled ones too
    assert all(
        after["step_ms"][v] != before["step_ms"][v] for v in ("serial_compile", "ficco_compile", "serial")
    )
    assert first["points"][0] == result["points"][0]  # the inference point was not asked for
    assert second["points"] == first["points"]


def test_redo_all_is_named_alone():
    with pytest.raises(SystemExit):
        bench.parse_args(["--redo", "all", "ficco_eager"])


def _tp4_run(rank: int, world_size: int, out: str) -> dict:
    argv = ["--device", "cpu", "--tokens", "32", "--layers", "1", "--phases", "train", "--variants",
            "ficco_eager", "--diagnose-max-tokens", "0", "--warmup", "1", "--rounds", "1", "--reps", "1",
            "--timed-ms", "0", "--out", out]  # fmt: skip
    return bench.main(argv)


@pytest.mark.slow
def test_four_ranks_run_the_eager_styles_as_serial(tmp_path):
    result = run_world(4, _tp4_run, str(tmp_path), timeout_s=300)[0]
    (point,) = result["points"]
    assert result["meta"]["world_size"] == 4 and (tmp_path / "runtimes-cpux4.json").exists()
    assert set(point["rel_err"]) == {"ficco_eager"} and point["rel_err"]["ficco_eager"] <= 1e-5
    assert point["step_ms"]["serial_compile"] is None  # not asked for


# The arithmetic and the report on made-up points ----------------------------------------------------------


def _point(model, phase, tokens, **ms) -> dict:
    return {"model": model, "phase": phase, "tokens": tokens, "comm_share": 0.1, "step_ms": ms,
            "rel_err": {"ficco_eager": 1e-3, "ficco_compile": 1e-3}, "errors": {}, "unavailable": {},
            "ops": {}, "host_ms": {}}  # fmt: skip


POINTS = [
    _point("m", "train", 1024, serial=10, ficco_eager=9, serial_compile=8, async_tp=7.5, ficco_compile=7.2,
           no_comm=6),
    _point("m", "train", 4096, serial=40, ficco_eager=41, serial_compile=30, async_tp=29, ficco_compile=29.5,
           no_comm=28),
    _point("m", "inference", 256, serial=4, ficco_eager=3, serial_compile=3, async_tp=3.2, ficco_compile=2.2,
           no_comm=2),
]  # fmt: skip


def test_each_variant_is_compared_with_its_like_for_like_baseline():
    p = POINTS[0]
    assert e2e.speedup(p, "ficco_eager") == 10 / 9
    assert e2e.speedup(p, "ficco_compile") == 8 / 7.2 and e2e.speedup(p, "async_tp") == 8 / 7.5
    assert e2e.speedup(p, "ficco_eager:bwd_serial") is None  # not run at this point
    assert (
        e2e.speedup({**p, "step_ms": {**p["step_ms"], "ficco_eager:sm_only": 8}}, "ficco_eager:sm_only")
        == 10 / 8
    )
    assert e2e.limit_ms(p) == 2 and e2e.limit_share(p) == 2 / 8
    assert math.isclose(e2e.realized(p, "ficco_compile"), 0.8 / 2)
    assert e2e.realized(POINTS[1], "ficco_compile") == 0.5 / 2


def test_summary_checks_the_done_when():
    s = e2e.summarize(POINTS, "bf16")
    assert s["comm_heavy_points"] == 2  # limit shares 25%, 7%, 33%
    assert math.isclose(s["goals"]["eager_vs_serial_min"], 40 / 41)
    assert math.isclose(s["goals"]["compile_vs_async_tp_min"], 29 / 29.5)
    assert math.isclose(s["goals"]["compile_vs_async_tp_heavy"], math.sqrt(7.5 / 7.2 * 3.2 / 2.2))
    assert math.isclose(s["goals"]["realized_share_heavy"], (0.4 + 0.8) / 2)
    assert s["goals_met"] == {
        "eager_vs_serial_min": False,
        "compile_vs_serial_compile_min": True,
        "compile_vs_async_tp_min": False,
        "compile_vs_async_tp_heavy": True,
        "realized_share_heavy": True,
        "gradients": True,
    }
    assert e2e.summarize(POINTS, "bf16", loopback=True)["goals_met"]["gradients"] is None
    bad = [{**POINTS[0], "rel_err": {"ficco_compile": 0.5}}, *POINTS[1:]]
    assert e2e.summarize(bad, "bf16")["goals_met"]["gradients"] is False


OLD = {
    "meta": {"hardware": "h200x2", "device": "NVIDIA H200", "loopback": False, "world_size": 2,
             "dtype": "bf16", "layers": 1, "batch": 2, "shapes": "static", "planner": "model h200x2/x",
             "planner_hardware": "h200x2", "torch": "2.11", "timing": {}, "comm_share": "..."},
    "points": [
        {**_point("Llama-3.1-8B", "train", 256, serial=17.2, async_tp=10.5, ficco_eager=12.7,
                  ficco_compile=7.7, vllm_rule=17.2), "vllm_rule_runs": "serial"},
        {**_point("Llama-3.1-8B", "inference", 1024, serial=0.63, async_tp=0.54, ficco_eager=0.53,
                  ficco_compile=0.47, vllm_rule=0.63), "vllm_rule_runs": "serial"},
    ],
    "compile_reports": {},
}  # fmt: skip
"""Results from before the compiled baseline and the limit (made-up numbers)."""


def test_results_from_before_the_compiled_baselines_still_render(tmp_path):
    md = report.markdown(OLD)
    assert "| Llama-3.1-8B | train | 256 | - | 1.35x | - | - | 1.36x | - | - |" in md
    assert "ficco eager over eager serial, worst point: 1.19x" in md
    report.plot(OLD, tmp_path / "old.png")
    assert (tmp_path / "old.png").stat().st_size > 0
    from benchmarks.results_page import end_to_end_section

    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    (results / "runtimes-h200x2.json").write_text(json.dumps(OLD))
    (results / "runtimes-cpu.json").write_text(json.dumps(OLD))  # CPU runs measure no overlap: not shown
    section = "\n".join(end_to_end_section(tmp_path))
    assert section.count("### ") == 1 and "(`benchmarks/results/runtimes-h200x2.json`)" in section
    assert "| Llama-3.1-8B | inference | 1024 | - | 1.19x |" in section


def test_the_report_shows_the_new_fields():
    result = {"meta": {**OLD["meta"], "layers": 4}, "points": [dict(p) for p in POINTS]}
    result["points"][0]["profile"] = {
        "serial": {"step_ms": 10.0, "busy_ms": 7.0, "idle_ms": 3.0, "exposed_comm_ms": 1.0, "kernels": 9,
                   "kinds": {"gemm": 5.0, "attention": 1.0, "comm": 2.0, "copy": 0.0, "other": 0.5}}
    }  # fmt: skip
    result["points"][0]["step_ms"]["ficco_eager:all_serial"] = 11.0
    pinned = ["ag_gemm m=1024 n=8 k=8 eager"]
    result["points"][0]["verify"] = {"times_ms": {"planned": 9.0, "serial": 8.5}, "confirm_ms": {},
                                     "winner": "serial", "pinned": pinned}  # fmt: skip
    md = report.markdown(result)
    assert (
        "| m | train | 1024 | serial | 10.00 | 3.00 | 5.00 | 1.00 | 2.00 | 0.00 | 0.50 | 1.00 | gemm |" in md
    )
    assert "| ficco_eager:all_serial | 11.000 | 0.91x | 0.82x |" in md
    assert "kept serial, pinned ag_gemm m=1024 n=8 k=8 eager" in md
    assert "| gemm / - |" in md  # what dominates the eager serial step (no compiled profile here)
    assert "| m | train | 1024-4096 | 16% (7%-25%) | 1.04x (0.98x-1.11x) |" in md


def test_points_come_in_the_plan_order_within_the_asked_models_and_phases():
    args = types.SimpleNamespace(models=list(bench.MODELS), phases=["train"], tokens=None)
    points = bench.planned_points(args, cpu=False)
    assert points[0] == ("Llama-3.1-70B", "train", 4096) and {p[1] for p in points} == {"train"}
    assert max(p[2] for p in points) >= 32768
    args = types.SimpleNamespace(models=["Llama-3.1-8B"], phases=["inference", "train"], tokens=[64, 128])
    assert bench.planned_points(args, cpu=False) == [
        ("Llama-3.1-8B", ph, t) for ph in ("inference", "train") for t in (64, 128)
    ]
    assert bench.planned_points(types.SimpleNamespace(phases=["train"], tokens=None), cpu=True) == [
        ("debug", "train", t) for t in bench.CPU_TOKENS
    ]


@pytest.mark.parametrize(
    ("hardware", "dim", "tokens", "runs"),
    [
        ("h200x2", 8192, 512, "serial_compile"),  # Llama-3.1-70B: vLLM's threshold on sm90 at TP=2: 1024
        ("h200x2", 8192, 1024, "async_tp"),
        ("h100x2", 8192, 16384, "async_tp"),
        ("h200x2", 4096, 16384, "serial_compile"),  # Llama-3.1-8B: below vLLM's smallest hidden size
        ("cpu", 8192, 16384, "serial_compile"),
    ],
)
def test_vllm_rule_runs_async_tp_from_its_token_threshold(hardware, dim, tokens, runs):
    ctx = types.SimpleNamespace(hardware=hardware, world_size=2)
    assert bench.vllm_choice(dim, tokens, ctx) == runs


def test_hardware_id_comes_from_the_gpu_name(monkeypatch):
    import torch

    cuda = torch.device("cuda", 0)
    for name, world, want in [
        ("NVIDIA H200", 2, "h200x2"),
        ("NVIDIA H200", 4, "h200x4"),
        ("NVIDIA H100 80GB HBM3", 2, "h100x2"),
        ("NVIDIA A100-SXM4-80GB", 2, "a100x2"),  # no built-in profile: the GPU model as a slug
    ]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: name)
        assert bench.hardware_id(cuda, world) == want
    assert bench.hardware_id(torch.device("cpu"), 2) == "cpu"
    assert bench.hardware_id(torch.device("cpu"), 4) == "cpux4"


# A loopback run: ficco's own GPU and host work ------------------------------------------------------------


@pytest.mark.slow
def test_a_loopback_run_times_each_op_alone_under_every_schedule_and_layout(tmp_path):
    """``--loopback --ops-only`` on the CPU (a pretend world of 2, the plumbing: GPU work is CUDA only): each
    op of a training step's layer alone, PyTorch's path beside ficco's serial, its pick and each batched
    layout of the schedules asked, into ``runtimes-loopback-cpu.{json,md}``."""
    args = ["--device", "cpu", "--loopback", "--ops-only", "--tokens", "32", "--phases", "train",
            "--op-layouts", "shard/sm", "--out", str(tmp_path)]  # fmt: skip
    command = [sys.executable, "-m", "benchmarks.runtimes", *args]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (point,) = json.loads((tmp_path / "runtimes-loopback-cpu.json").read_text())["points"]
    rows = point["op_costs"]
    assert [(r["direction"], r["op"]) for r in rows] == [
        (d, op) for d in ("fwd", "bwd-input") for op in (("ag_gemm", "gemm_rs") * 2 if d == "fwd" else
                                                          ("gemm_rs", "ag_gemm") * 2)
    ]  # fmt: skip
    for row in rows:
        names = {"pytorch", "serial/sm", row["pick"], "shard/sm", "shard/sm:segmented", "shard/sm:rank_major"}
        assert set(row["variants"]) == names
        assert all(v["host_us"] > 0 for v in row["variants"].values())
    page = (tmp_path / "runtimes-loopback-cpu.md").read_text()
    assert "Loopback world" in page and page.rstrip().splitlines()[-1].endswith("met: None)")


def _loopback_point(tokens, ratios: dict, ran: dict, ops: list | None = None) -> dict:
    base = {"serial": 10.0, "serial_compile": 8.0}
    profile = {v: {"kernel_ms": base[v]} for v in base}
    profile |= {v: {"kernel_ms": base[b] * ratios[v]} for v, b in loopback_report.PAIRS.items()}
    return {"model": "m", "phase": "train", "tokens": tokens, "profile": profile, "op_costs": ops or [],
            "ops": {v: {"ran": [{"ran": r} for r in schedules]} for v, schedules in ran.items()}}  # fmt: skip


def test_the_loopback_goals_hold_serial_points_to_one_percent_and_every_point_to_five():
    serial = {"ficco_eager": ["serial/sm"], "ficco_compile": ["serial/sm"]}
    overlapped = {"ficco_eager": ["shard/dma", "serial/sm"], "ficco_compile": ["serial/sm"]}
    cost = {"host_us": 50.0}
    layouts = {
        "shard/dma:segmented": {"kernel_ms": 1.6, **cost},
        "shard/dma:rank_major": {"kernel_ms": 1.2, **cost},
    }
    op = {"layers": "w1,w3", "direction": "fwd", "op": "ag_gemm", "pick": "shard/dma",
          "variants": {"pytorch": {"kernel_ms": 1.0, **cost}, "serial/sm": {"kernel_ms": 1.03, **cost},
                       "shard/dma": {"kernel_ms": 1.2, **cost}, **layouts}}  # fmt: skip
    points = [
        _loopback_point(256, {"ficco_eager": 1.005, "ficco_compile": 1.0}, serial, [op]),
        _loopback_point(4096, {"ficco_eager": 1.04, "ficco_compile": 1.02}, overlapped),
    ]
    summary = loopback_report.summarize(points)
    assert summary["ficco_eager_all_serial_max"] == pytest.approx(1.005)
    assert summary["ficco_compile_all_serial_max"] == pytest.approx(1.02)  # its ops all ran serial there
    assert summary["ficco_eager_max"] == pytest.approx(1.04)
    assert summary["small_layout_max"] == pytest.approx(1.0)  # ran in its cheapest layout (rank-major)
    assert summary["small_serial_max"] == pytest.approx(1.03)
    assert summary["small_pick_max"] == pytest.approx(1.2)  # reported: the decomposition's GPU work
    assert summary["met"] == {"ficco_eager_all_serial_max": True, "ficco_eager_max": True,
                              "ficco_compile_all_serial_max": False, "ficco_compile_max": True,
                              "small_layout_max": True, "small_serial_max": True}  # fmt: skip
    meta = {"hardware": "h200x2", "world_size": 2, "layers": 2, "dtype": "bf16", "batch": 2, "device": "H200",
            "torch": "2.11", "planner": "p", "planner_hardware": "h200x2"}  # fmt: skip
    page = loopback_report.markdown({"meta": meta, "points": points})
    goals = page.rstrip().splitlines()[-5:]
    assert all("met: " in line for line in goals) and goals[-1].endswith("met: True)")
    assert "Each pick over PyTorch's path at 64-1024 tokens" in page and "worst 1.200x" in page
    # the pick run in its segmented layout at 1.6 where rank-major costs 1.2: the blow-up, not met
    op["variants"]["shard/dma"] = {"kernel_ms": 1.6, **cost}
    assert loopback_report.summarize(points)["met"]["small_layout_max"] is False
    op["variants"]["serial/sm"] = {"kernel_ms": 1.1, **cost}
    assert loopback_report.summarize(points)["met"]["small_serial_max"] is False
    assert "Points: all 2 of the plan measured." in page
    skipped = [{"model": "m", "phase": "inference", "tokens": 16}]
    page = loopback_report.markdown({"meta": meta, "points": points, "skipped": skipped})
    assert "Points: 2 of the plan's 3 measured (the goals below hold over these only)" in page
    assert page.count("m inference 16") == 1
