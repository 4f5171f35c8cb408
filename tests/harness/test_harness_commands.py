"""`ficco bench`: options and their errors, the sim path end to end, continuing a dataset, the gloo path;
`ficco dataset card`; the last release's spellings."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from ficco.features.dataset import (
    dataset_hardware,
    load_dataset,
    load_noise,
    read_manifest,
    scenario_from_row,
)
from ficco.harness.backend import Timing
from ficco.harness.commands import register
from ficco.harness.dataset import label_table
from ficco.harness.deprecated_bench import rewrite
from ficco.harness.launch import WorkerSettings, torchrun_command
from ficco.harness.worker import SAFE_ENV, parse_args

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.command("version")  # a second command keeps `bench` a subcommand, as in `ficco`
    def version() -> None: ...

    return app


@pytest.fixture(scope="module")
def ficco() -> typer.Typer:
    """The ``ficco`` command line itself (its group rewrites the last release's spellings)."""
    from ficco.cli import app

    return app


def _bench(app, *args):
    return CliRunner().invoke(app, ["bench", *map(str, args)])


def _small(tiny_configs, out, *extra):
    return (
        "--backend",
        "sim",
        "--configs",
        tiny_configs,
        "--tokens",
        "1024",
        "--grid",
        "3",
        "--out",
        out,
        *extra,
    )


@pytest.mark.heavy
def test_bench_sim_writes_dataset_card_and_estimate(app, tiny_configs, tmp_path):
    result = _bench(app, *_small(tiny_configs, tmp_path / "ds", "--remeasure", "2"))
    assert result.exit_code == 0, result.output
    assert "plan: 7 scenarios from 2 families (Tiny, grid)" in result.output
    assert "GPU sweep estimate on h200x2: 7 scenarios (+2 re-measured)" in result.output
    df = load_dataset(tmp_path / "ds")
    assert df["scenario_id"].nunique() == 7 and set(df["backend"]) == {"sim"}
    assert (tmp_path / "ds" / "card.md").exists() and (tmp_path / "ds" / "noise.parquet").exists()
    settings = json.loads((tmp_path / "ds" / "plan.json").read_text())["settings"]
    assert settings["estimated_minutes"] > 0


@pytest.mark.heavy
def test_bench_again_continues_the_dataset(app, tiny_configs, tmp_path):
    assert _bench(app, *_small(tiny_configs, tmp_path / "ds", "--sample", "2")).exit_code == 0
    again = _bench(app, *_small(tiny_configs, tmp_path / "ds"))
    assert again.exit_code == 0 and "2 of 7 scenarios already measured" in again.output
    assert len(read_manifest(tmp_path / "ds")["finished"]) == 7


def test_bench_into_a_dataset_of_other_plan_settings_is_refused_naming_them(app, tiny_configs, tmp_path):
    assert _bench(app, *_small(tiny_configs, tmp_path / "ds", "--sample", "2")).exit_code == 0
    plan_before = (tmp_path / "ds" / "plan.json").read_text()
    args = [
        a if a != "3" else "5" for a in _small(tiny_configs, tmp_path / "ds", "--seed", "7", "--ops", "all")
    ]
    result = _bench(app, *args)
    assert result.exit_code == 2, result.output
    assert "--grid 5 (the dataset's: 3)" in result.output and "--seed 7 (the dataset's: 0)" in result.output
    assert "--ops ag_gemm,gemm_rs,a2a_gemm,gemm_a2a (the dataset's: ag_gemm,gemm_rs)" in result.output
    assert (tmp_path / "ds" / "plan.json").read_text() == plan_before


@pytest.mark.heavy
def test_a_dense_dataset_of_the_last_release_continues_under_the_default_ops(app, tiny_configs, tmp_path):
    """Its plan lists every op with ``include_moe`` off: the ops it measured are the dense ones, today's
    default."""
    out = tmp_path / "ds"
    assert _bench(app, *_small(tiny_configs, out, "--sample", "2")).exit_code == 0
    plan = json.loads((out / "plan.json").read_text())
    plan["settings"]["ops"] = ["ag_gemm", "gemm_rs", "a2a_gemm", "gemm_a2a"]
    (out / "plan.json").write_text(json.dumps(plan))
    again = _bench(app, *_small(tiny_configs, out))
    assert again.exit_code == 0 and "2 of 7 scenarios already measured" in again.output


@pytest.mark.heavy
def test_dataset_card_regenerates_the_card(ficco, tiny_configs, tmp_path):
    assert _bench(ficco, *_small(tiny_configs, tmp_path / "ds")).exit_code == 0
    (tmp_path / "ds" / "card.md").unlink()
    result = CliRunner().invoke(ficco, ["dataset", "card", str(tmp_path / "ds")])
    assert result.exit_code == 0 and (tmp_path / "ds" / "card.md").exists()
    missing = CliRunner().invoke(ficco, ["dataset", "card", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "is not a ficco dataset" in missing.output


@pytest.mark.heavy
def test_dataset_card_relabel_rewrites_stale_best_sets_and_keeps_the_rows(ficco, tiny_configs, tmp_path):
    import pandas as pd

    from ficco.features.dataset import COLUMNS, MANIFEST, load_dataset

    out = tmp_path / "ds"
    _bench(ficco, *_small(tiny_configs, out))
    part = out / json.loads((out / MANIFEST).read_text())["parts"][0]["file"]
    fresh = pd.read_parquet(part)
    pd.DataFrame(fresh.assign(in_best_set=~fresh["in_best_set"])).to_parquet(part, index=False)  # stale
    result = CliRunner().invoke(ficco, ["dataset", "card", str(out), "--relabel"])
    assert result.exit_code == 0, result.output
    assert f"in_best_set changed on {len(fresh)} rows" in result.output
    rewritten = pd.read_parquet(part)
    assert list(rewritten.columns) == list(COLUMNS)  # the derived time_ms is not stored
    assert rewritten["in_best_set"].tolist() == fresh["in_best_set"].tolist()
    assert "time_ms" in load_dataset(out).columns


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tp", "9"], "--tp must be 2: --hardware h200x2 has gpu_count=2; got 9"),
        (["--tp", "3"], "--tp must be 2: --hardware h200x2 has gpu_count=2; got 3"),
        (["--hardware", "h200x8", "--tp", "9"], "--tp must be an int in [2, 8]: --hardware h200x8 has"),
        (["--rounds", "0"], "Invalid value for '--rounds': Input should be greater than or equal to 1"),
        (["--block-ms", "0.01"], "Invalid value for '--block-ms': Input should be greater than or equal"),
        (["--modes", "lazy"], "--modes must be comma-separated values of ['eager', 'graph']"),
        (["--backend", "gloo", "--modes", "graph"], "--modes must be comma-separated values of ['eager']"),
        (["--grid", "-1"], "Invalid value for '--grid': Input should be greater than or equal to 0"),
        (["--max-serial-ms", "0"], "--max-serial-ms must be > 0; got 0"),
        (["--noise", "1.5"], "Invalid value for '--noise': Input should be less than or equal to 1"),
        (["--tokens", "1k"], "--tokens must be comma-separated integers"),
        (["--tokens", "1025"], "tokens must be a non-empty list of positive multiples of tp=2; bad: [1025]"),
        (["--hardware", "tpu"], "--hardware 'tpu': unknown hardware id 'tpu'; built-in ids are"),
        (["--backend", "gloo", "--noise", "0.1"], "--noise applies to --backend sim only"),
    ],
)
def test_bench_bad_options_name_value_and_range(app, tiny_configs, tmp_path, args, message):
    base = ["--backend", "sim", "--configs", tiny_configs, "--grid", "0", "--out", tmp_path / "ds"]
    result = _bench(app, *base, *args)
    assert result.exit_code == 2
    assert message in result.output


def test_bench_bad_configs_directory_is_named(app, tmp_path):
    result = _bench(app, "--backend", "sim", "--configs", tmp_path, "--out", tmp_path / "ds")
    assert result.exit_code == 2
    assert f"no model configs (*.json or */config.json) in {tmp_path}" in result.output


@pytest.mark.heavy
def test_bench_what_if_hardware_from_json_and_calibration(app, tiny_configs, tmp_path, monkeypatch):
    """A profile JSON is registered once under the model root; its id then names it in every command."""
    import shutil

    shutil.copytree(Path(__file__).resolve().parents[2] / "models", tmp_path / "models")  # the shipped model
    monkeypatch.setenv("FICCO_MODEL_ROOT", str(tmp_path / "models"))
    _bench(app, *_small(tiny_configs, tmp_path / "measured"))
    profile = {
        "id": "future2",
        "gpu_name": "Future",
        "gpu_count": 2,
        "interconnect": "NVLink6",
        "peak_bf16_tflops": 2500.0,
        "hbm_gbps": 8000.0,
        "link_gbps": 900.0,
        "sm_count": 160,
    }
    path = tmp_path / "future.json"
    path.write_text(json.dumps(profile))
    result = _bench(
        app,
        *_small(tiny_configs, tmp_path / "what-if"),
        "--hardware",
        path,
        "--calibrate-from",
        tmp_path / "measured",
    )
    assert result.exit_code == 0, result.output
    assert "sim constants calibrated on" in result.output
    assert set(load_dataset(tmp_path / "what-if")["hardware_id"]) == {"future2"}
    assert json.loads((tmp_path / "models" / "future2" / "hardware.json").read_text()) == profile

    by_id = _bench(app, *_small(tiny_configs, tmp_path / "by-id"), "--hardware", "future2")
    assert by_id.exit_code == 0, by_id.output
    assert set(load_dataset(tmp_path / "by-id")["hardware_id"]) == {"future2"}
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**profile, "link_gbps": 100.0}))
    clash = _bench(app, *_small(tiny_configs, tmp_path / "clash"), "--hardware", other)
    assert clash.exit_code == 2 and "'future2' is registered under" in clash.output

    from ficco.cli import app as ficco

    scenario = ["--op", "ag_gemm", "--m", "4096", "--n", "4096", "--k", "4096"]
    for hardware in (path, "future2"):  # no model of it yet: the one line, the id resolved from the file
        answer = CliRunner().invoke(ficco, ["recommend", *scenario, "--hardware", str(hardware)])
        assert answer.exit_code == 2
        assert "no model answers hardware 'future2' at world_size=2" in answer.output
        assert "pairs served: (h200x2, 2), (h200x4, 4)." in answer.output  # registered: no "if" about it
        assert "`ficco retrain --backend sim --hardware future2 --tp 2`" in answer.output


def test_host_factor_does_not_offer_the_simulator(app):
    from ficco.cli import app as ficco

    assert "sim" not in CliRunner().invoke(ficco, ["host-factor", "--help"]).output.split("--backend")[1][:60]
    refused = CliRunner().invoke(ficco, ["host-factor", "--backend", "sim"], env={"COLUMNS": "200"})
    assert refused.exit_code == 2 and "'sim' is not one of 'gpu', 'gloo'" in refused.output


@pytest.mark.heavy
@pytest.mark.skipif(bool(os.environ.get("CUDA_VISIBLE_DEVICES")), reason="needs a machine without GPUs")
def test_bench_gpu_without_gpus_says_so(app, tiny_configs, tmp_path, monkeypatch):
    monkeypatch.setattr("ficco.harness.launch.gpu_names", list)
    result = _bench(app, "--backend", "gpu", "--configs", tiny_configs, "--out", tmp_path / "ds")
    assert result.exit_code == 2 and "--backend gpu needs 2 GPUs; nvidia-smi lists 0" in result.output


@pytest.mark.parametrize(("tp", "hardware"), [(4, "h100x4"), (2, "h100x2")])
def test_bench_gpu_files_its_rows_under_this_machines_gpus(
    app, tiny_configs, tmp_path, monkeypatch, tp, hardware
):
    monkeypatch.setattr("ficco.harness.launch.gpu_names", lambda: ["NVIDIA H100 80GB HBM3"] * 4)
    planned = []

    def run_torchrun(plan, out, **kwargs):
        planned.append(plan)
        raise typer.Exit(0)  # measured no further

    monkeypatch.setattr("ficco.harness.commands.run_torchrun", run_torchrun)
    args = ("--backend", "gpu", "--tp", tp, "--tokens", "1024", "--grid", "2", "--configs", tiny_configs)
    result = _bench(app, *args, "--out", tmp_path / "ds")
    assert result.exit_code == 0, result.output
    assert {s.hardware.id for _, s in planned[0]} == {hardware}
    assert f"GPU sweep estimate on {hardware}" in result.output


def test_bench_gpu_refuses_a_profile_of_another_gpu_model(app, tiny_configs, tmp_path, monkeypatch):
    monkeypatch.setattr("ficco.harness.launch.gpu_names", lambda: ["NVIDIA H100 80GB HBM3"] * 2)
    result = _bench(app, "--backend", "gpu", "--hardware", "h200x2", "--configs", tiny_configs)
    message = (
        "error: hardware h200x2 is a profile of NVIDIA H200 GPUs, not of this machine's NVIDIA H100 80GB"
    )
    assert result.exit_code == 2 and message in result.output and "use hardware h100x2 " in result.output
    assert "Traceback" not in result.output


def test_bench_gpu_on_gpus_of_no_profile_says_how_to_describe_them(app, tiny_configs, tmp_path, monkeypatch):
    monkeypatch.setattr("ficco.harness.launch.gpu_names", lambda: ["NVIDIA A100-SXM4-80GB"] * 2)
    result = _bench(app, "--backend", "gpu", "--configs", tiny_configs, "--out", tmp_path / "ds")
    message = (
        "error: this machine's NVIDIA A100-SXM4-80GB GPUs have no hardware profile 'a100x2': pass --hardware"
    )
    assert result.exit_code == 2 and message in result.output and "did you mean" not in result.output


def test_a_fleet_launcher_plans_the_named_or_default_profile_whatever_its_own_gpus(tiny_configs, monkeypatch):
    """``fleet run`` and ``emit`` run where nothing is measured (a login node, a Ray head): their GPUs
    neither pick the profile nor refuse one; each shard checks its node before measuring."""
    from ficco.harness.commands import parse_sweep

    monkeypatch.setattr("ficco.harness.launch.gpu_names", lambda: ["NVIDIA H100 80GB HBM3"] * 8)
    for given, planned in [([], "h200x2"), (["--hardware", "h200x4", "--tp", "4"], "h200x4")]:
        job, _ = parse_sweep(["--backend", "gpu", "--configs", str(tiny_configs), "--tokens", "1024", *given])
        assert job.hardware.id == planned


def test_gpu_names_reads_nvidia_smi(monkeypatch):
    from ficco.harness import launch

    listed = "GPU 0: NVIDIA H200 (UUID: GPU-1a)\nGPU 1: NVIDIA H200 (UUID: GPU-2b)\n"
    monkeypatch.setattr(launch.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(launch.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, listed))
    launch.gpu_names.cache_clear()  # read once per process
    try:
        assert launch.gpu_names() == ("NVIDIA H200", "NVIDIA H200")
    finally:
        launch.gpu_names.cache_clear()


def test_bench_keeps_to_its_option_budget(ficco):
    """The sweep's own options; dataset cards and fleets are verbs of their own."""
    bench = typer.main.get_command(ficco).commands["bench"]
    assert len([p for p in bench.params if p.name != "help"]) <= 22


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("bench --card-only --relabel --out D", "dataset card D --relabel"),
        ("-v bench --tp 8 --ray auto --shards 4 --out D", "-v fleet run auto --shards 4 --tp 8 --out D"),
        (
            "bench --emit=k8s --shards 2 --image I --share-nodes --out D",
            "fleet emit k8s --shards 2 --share-nodes --image I --out D",
        ),
        ("bench --shard 1/4 --resume --out D", "fleet shard --shard 1/4 --out D"),
        ("bench --include-moe --limit 3 --nproc 2 --out D", "bench --out D --ops all --sample 3"),
        ("bench --include-moe --ops a2a_gemm --out D", "bench --ops a2a_gemm --out D"),
        ("bench --out D", "bench --out D"),
        ("serve --port 1", "serve --port 1"),
    ],
)
def test_the_last_releases_bench_spellings_become_the_new_commands(old, new, capsys):
    assert rewrite(old.split(), {}) == new.split()
    assert ("warning:" in capsys.readouterr().err) == (old != new)


def test_bench_in_a_job_array_task_measures_its_shard_as_before():
    env = {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2"}
    assert rewrite(["bench", "--out", "D"], env) == ["fleet", "shard", "--out", "D"]


def test_an_old_spelling_runs_and_says_what_to_use(ficco, tiny_configs, tmp_path):
    args = [*_small(tiny_configs, tmp_path / "ds", "--limit", "2", "--resume")]
    result = CliRunner().invoke(ficco, ["bench", *map(str, args)])
    assert result.exit_code == 0, result.output
    assert (
        "warning: `ficco bench` with --limit, --resume is the spelling of the last release" in result.output
    )
    assert "--sample 2`" in result.output and len(read_manifest(tmp_path / "ds")["finished"]) == 2


def test_torchrun_command_runs_the_worker_on_every_rank(tmp_path):
    command = torchrun_command(
        tmp_path,
        nproc=2,
        device="cuda",
        phase="noise",
        settings=WorkerSettings(
            modes=("eager", "graph"),
            timing=Timing(rounds=7, max_rounds=9, block_ms=0.5, timed_ms=120.0),
            remeasure=64,
            flush_seconds=10.0,
            pin="none",
        ),
    )
    assert command[:5] == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
    ]
    args = parse_args(command[command.index("ficco.harness.worker") + 1 :])
    got = (
        args.plan,
        args.out,
        args.device,
        args.phase,
        args.modes,
        (args.rounds, args.max_rounds, args.block_ms, args.timed_ms),
        args.remeasure,
        args.pin,
    )
    timing = (7, 9, 0.5, 120.0)
    assert got == (tmp_path / "plan.json", tmp_path, "cuda", "noise", "eager,graph", timing, 64, "none")
    assert SAFE_ENV == {
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }


def _bench_gloo(configs: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """``ficco bench --backend gloo`` on ``configs`` (128 tokens, no grid, at least 2 rounds) into ``out``, in
    a subprocess (it launches torchrun itself); the test fails with its output if it fails."""
    command = [sys.executable, "-m", "ficco.cli", "bench", "--backend", "gloo", "--configs", str(configs)]
    command += ["--tokens", "128", "--grid", "0", "--rounds", "2", *extra, "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("ficco.harness.torch_backend") is None,
    reason="harness/torch_backend.py not written yet",
)
@pytest.mark.heavy
def test_bench_gloo_end_to_end_two_tiny_scenarios(tiny_configs, tmp_path):
    out = tmp_path / "gloo"
    extra = ("--sample", "2", "--modes", "eager", "--max-rounds", "3", "--timed-ms", "1000000")
    done = _bench_gloo(tiny_configs, out, *extra, "--remeasure", "1")
    df = load_dataset(out)
    assert df["scenario_id"].nunique() == 2 and set(df["backend"]) == {"gloo"}
    assert len(df) == 60 and df["ok"].all(), df[~df["ok"]][["schedule", "error"]].to_string()
    assert set(df["mode"]) == {"eager"} and all(len(r) == 3 for r in df["round_ms"])  # --max-rounds
    assert df.groupby("scenario_id")["in_best_set"].any().all()
    manifest = read_manifest(out)
    assert manifest["fingerprint"]["backend"] == "gloo" and manifest["protocol"]["rounds"] == 2
    assert manifest["protocol"]["max_rounds"] == 3
    assert manifest["protocol"]["pin"] == "share"  # the default: the placement the committed datasets had
    assert "CPU placement share: every thread on CPUs" in done.stderr
    assert load_noise(out)["scenario_id"].nunique() == 1  # the second torchrun job
    assert (out / "card.md").exists()


@pytest.mark.heavy
@pytest.mark.slow
def test_bench_gloo_moe_ops_measure_the_moe_pairs(tiny_moe_configs, tmp_path):
    out = tmp_path / "gloo-moe"
    _bench_gloo(tiny_moe_configs, out, "--ops", "all", "--sample", "4", "--max-rounds", "2")
    df = load_dataset(out)
    assert df.groupby("op")["scenario_id"].nunique().to_dict() == {
        "a2a_gemm": 1,
        "ag_gemm": 1,
        "gemm_a2a": 1,
        "gemm_rs": 1,
    }
    assert len(df) == 4 * 30 and df["ok"].all(), df[~df["ok"]][["schedule", "error"]].to_string()
    moe = df[df["op"].isin(["a2a_gemm", "gemm_a2a"])]
    assert set(zip(moe["experts"], moe["top_k"], moe["imbalance"], strict=True)) == {(4, 2, 1.0)}
    hardware = dataset_hardware(out)
    assert all(scenario_from_row(row, hardware).key() == row.scenario_id for row in moe.itertuples())
    assert (moe[["gemm_alone_ms", "nccl_comm_ms", "dma_comm_ms"]] > 0).all().all()
    assert moe["async_tp_ms"].isna().all()  # no async-TP for an all-to-all (nor on the CPU)
    assert set(label_table(df)["op"]) == {"ag_gemm", "gemm_rs", "a2a_gemm", "gemm_a2a"}
    assert json.loads((out / "plan.json").read_text())["settings"]["include_moe"] is True
    assert "MoE pairs included" in (out / "card.md").read_text()
