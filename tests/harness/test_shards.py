"""Sharded sweeps without Ray: the split, the job array environment, ``ficco dataset gather`` and the jobs
``ficco fleet emit`` writes (``harness.fleet.shards``, ``harness.fleet.gather``, ``harness.fleet.emit``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ficco.cli import app
from ficco.features.dataset import dataset_hash, load_dataset, read_manifest
from ficco.harness.dataset import part_metadata
from ficco.harness.fleet.shards import Shard, assign, read_runs, shard_from_env

REPO_ROOT = Path(__file__).resolve().parents[2]


def gather(*args) -> CliRunner:
    return CliRunner().invoke(app, ["dataset", "gather", *map(str, args)])


def sharded(fleet, small_sweep: tuple, out: Path, count: int, *extra) -> Path:
    for index in range(count):
        fleet("shard", "--shard", f"{index}/{count}", *small_sweep, "--out", out, *extra)
    return out


# The split and the environment ------------------------------------------------------------------------------


def test_assign_is_disjoint_covering_and_balanced():
    costs = np.random.default_rng(0).lognormal(0, 1.5, size=200).tolist()
    owner = assign(costs, 4)
    loads = [sum(c for c, o in zip(costs, owner, strict=True) if o == s) for s in range(4)]
    assert sorted(set(owner)) == [0, 1, 2, 3] and len(owner) == len(costs)
    assert max(loads) - min(loads) <= max(costs) * 1.01  # greedy longest-first bound
    assert assign(costs, 4) == owner  # deterministic


def test_shard_parse_names_the_bad_value():
    assert Shard.parse("2/4") == Shard(2, 4) and Shard(2, 4).name == "shard-00002-of-00004"
    for bad in ("4/4", "x/2", "3", "-1/2"):
        with pytest.raises(ValueError, match=f"got {bad!r}"):
            Shard.parse(bad)


def test_shard_from_slurm_and_kubernetes_environment():
    slurm = {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "4", "SLURM_ARRAY_TASK_COUNT": "3"}
    assert shard_from_env(slurm) == Shard(1, 3)
    assert shard_from_env({"JOB_COMPLETION_INDEX": "2", "FICCO_SHARD_COUNT": "8"}) == Shard(2, 8)
    assert shard_from_env({}) is None
    with pytest.raises(ValueError, match="FICCO_SHARD_COUNT='<unset>'"):
        shard_from_env({"JOB_COMPLETION_INDEX": "2"})


# Shards and gather ------------------------------------------------------------------------------------------


@pytest.mark.heavy
def test_four_shards_gathered_equal_the_unsharded_sweep(fleet, small_sweep, whole, tmp_path):
    out = sharded(fleet, small_sweep, tmp_path / "ds", 4)
    result = gather(out / "shards", "--out", out)
    assert result.exit_code == 0, result.output
    assert dataset_hash(out) == dataset_hash(whole)  # the same rows (simulated)
    manifest = read_manifest(out)
    assert manifest["gathered"]["rows_hash"] == dataset_hash(whole)
    assert (
        json.loads((out / "plan.json").read_text())["entries"]
        == json.loads((whole / "plan.json").read_text())["entries"]
    )
    ids = [set(load_dataset(p)["scenario_id"]) for p in sorted((out / "shards").glob("shard-*"))]
    assert all(ids) and sum(map(len, ids)) == len(set().union(*ids)) == 16  # disjoint, covering
    meta = part_metadata(next((out / "shards").glob("shard-00002*/parts/part-*.parquet")))
    assert meta["shard"] == "2/4" and meta["plan_hash"] == manifest["gathered"]["plan_hash"]
    assert meta["fingerprint"]["backend"] == "sim" and meta["code_version"].startswith("0.")
    card = (out / "card.md").read_text()
    assert "## Shards" in card and "4 of 4 shards" in card and "| 3/4 |" in card
    assert "simulated: no GPU was used" in card


@pytest.mark.heavy
def test_train_records_the_gathered_content_hash(fleet, small_sweep, tmp_path):
    from ficco.training.dataset_table import load_dataset_table

    out = sharded(fleet, small_sweep, tmp_path / "ds", 2)
    assert gather(out, "--out", out).exit_code == 0
    assert load_dataset_table(out).hash == read_manifest(out)["gathered"]["rows_hash"]


def test_a_shard_run_again_resumes_and_measures_nothing_twice(fleet, small_sweep, tmp_path):
    out = tmp_path / "ds"
    first = fleet("shard", "--shard", "1/2", *small_sweep, "--out", out)
    again = fleet("shard", "--shard", "1/2", *small_sweep, "--out", out)
    directory = out / "shards" / "shard-00001-of-00002"
    manifest = read_manifest(directory)
    planned = len(json.loads((directory / "plan.json").read_text())["entries"])
    assert f"{planned} of {planned} scenarios already measured" in again and "shard 1/2" in first
    assert len(manifest["finished"]) == len(set(manifest["finished"])) == planned
    assert [r["finished_before"] for r in read_runs(directory)] == [0, planned]
    rows = load_dataset(directory)
    assert not rows.duplicated(["scenario_id", "mode", "schedule"]).any()


def test_a_shard_directory_of_another_plan_is_refused(fleet, small_sweep, tmp_path):
    out = tmp_path / "ds"
    fleet("shard", "--shard", "0/2", *small_sweep, "--out", out)
    result = CliRunner().invoke(
        app, ["fleet", "shard", "--shard", "0/2", *map(str, small_sweep), "--out", str(out), "--grid", "9"]
    )
    assert result.exit_code != 0 and "another plan" in result.output


def test_gather_refuses_two_fingerprints_naming_the_keys(fleet, small_sweep, tmp_path):
    out = tmp_path / "ds"
    fleet("shard", "--shard", "0/2", *small_sweep, "--out", out)
    fleet("shard", "--shard", "1/2", *small_sweep, "--out", out, "--noise", "0.05")
    result = gather(out, "--out", tmp_path / "gathered")
    assert result.exit_code != 0
    assert "fingerprint.noise: 0.0 (shards 0/2) vs 0.05 (shards 1/2)" in result.output
    assert read_manifest(tmp_path / "gathered") is None


def test_gather_refuses_two_plans_naming_the_plan_hash(fleet, small_sweep, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    fleet("shard", "--shard", "0/2", *small_sweep, "--out", a)
    fleet("shard", "--shard", "1/2", *small_sweep, "--out", b, "--tokens", "1024")
    result = gather(a, b, "--out", tmp_path / "gathered")
    assert result.exit_code != 0 and "plan_hash:" in result.output


@pytest.mark.heavy
def test_gather_reports_missing_shards_and_partial_says_so(fleet, small_sweep, tmp_path):
    out = tmp_path / "ds"
    fleet("shard", "--shard", "0/3", *small_sweep, "--out", out)
    fleet("shard", "--shard", "2/3", *small_sweep, "--out", out)
    refused = gather(out, "--out", out)
    assert refused.exit_code != 0 and "missing shard(s) [1] of 3" in refused.output
    result = gather(out, "--out", out, "--partial")
    assert result.exit_code == 0 and "missing shards [1]" in result.output
    assert "**Incomplete:** missing shards [1]" in (out / "card.md").read_text()


@pytest.mark.heavy
def test_gather_keeps_a_shard_held_twice_once(fleet, small_sweep, whole, tmp_path):
    out = sharded(fleet, small_sweep, tmp_path / "ds", 2)
    copy = tmp_path / "copy" / "shard-00001-of-00002"
    shutil.copytree(out / "shards" / "shard-00001-of-00002", copy)
    result = gather(out / "shards", copy, "--out", tmp_path / "gathered")
    assert result.exit_code == 0, result.output
    gathered = read_manifest(tmp_path / "gathered")["gathered"]
    assert gathered["duplicates_dropped"] > 0 and gathered["rows_hash"] == dataset_hash(whole)


# Scheduler jobs ---------------------------------------------------------------------------------------------


@pytest.mark.heavy
@pytest.mark.slow
def test_emit_slurm_script_is_valid_bash_and_its_tasks_run_the_shards(fleet, small_sweep, whole, tmp_path):
    out = tmp_path / "ds"
    printed = fleet("emit", "slurm", "--shards", "2", *small_sweep, "--out", out)
    script = out / "shards" / "bench.sbatch"
    assert f"ficco dataset gather {out / 'shards'} --out {out}" in printed
    assert subprocess.run(["bash", "-n", script], check=False).returncode == 0
    text = script.read_text()
    assert "#SBATCH --array=0-1" in text and "#SBATCH --nodes=1" in text
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_JOB_ID": "7"}
    for index in range(2):
        task = {**env, "SLURM_ARRAY_TASK_ID": str(index)}
        done = subprocess.run(["bash", script], env=task, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-2000:]
    assert gather(out / "shards", "--out", out).exit_code == 0
    assert dataset_hash(out) == dataset_hash(whole)
    runs = read_runs(out / "shards" / "shard-00000-of-00002")
    assert [(r["engine"], r["job"]) for r in runs] == [("slurm", "7")]


def test_emit_slurm_gpu_holds_whole_nodes_unless_shared(fleet, llama_configs, tmp_path):
    fleet("emit", "slurm", "--shards", "3", "--configs", llama_configs, "--out", tmp_path / "a", "--tp", "2")
    text = (tmp_path / "a" / "shards" / "bench.sbatch").read_text()
    assert "#SBATCH --gres=gpu:2" in text and "#SBATCH --exclusive" in text
    assert "fleet shard --configs" in text and "--tp 2 --out" in text and "FICCO_SHARED_NODE" not in text
    shared_nodes = ("--shards", "3", "--share-nodes")
    fleet("emit", "slurm", *shared_nodes, "--configs", llama_configs, "--out", tmp_path / "b")
    shared = (tmp_path / "b" / "shards" / "bench.sbatch").read_text()
    assert "--exclusive" not in shared and "export FICCO_SHARED_NODE=1" in shared


def test_emit_k8s_manifest_parses_as_an_indexed_job(fleet, llama_configs, tmp_path):
    from kubernetes.client import ApiClient

    out = tmp_path / "ds"
    fleet("emit", "k8s", "--shards", "4", "--image", "reg/ficco:1", "--configs", llama_configs, "--out", out)
    manifest = json.loads((out / "shards" / "bench-job.json").read_text())
    client = ApiClient()
    job = client._ApiClient__deserialize(manifest, "V1Job")  # the client's own model classes
    assert client.sanitize_for_serialization(job) == manifest  # no key the models do not know
    spec = job.spec
    assert (spec.completion_mode, spec.completions, spec.backoff_limit_per_index) == ("Indexed", 4, 3)
    container = spec.template.spec.containers[0]
    assert container.resources.limits == {"nvidia.com/gpu": "2"}
    assert {"name": "FICCO_SHARD_COUNT", "value": "4"} in client.sanitize_for_serialization(container.env)
    assert container.command[:3] == ["ficco", "fleet", "shard"]
    assert container.command[-2:] == ["--out", str(out)]
    assert spec.template.spec.affinity.pod_anti_affinity is not None  # one shard per node
    assert sys.executable not in container.command


def test_emit_needs_a_shard_count(llama_configs, tmp_path):
    result = CliRunner().invoke(
        app, ["fleet", "emit", "k8s", "--configs", str(llama_configs), "--out", str(tmp_path)]
    )
    assert result.exit_code != 0 and "--shards N" in result.output


@pytest.mark.heavy
def test_a_card_of_shards_that_shared_a_node_says_so(fleet, small_sweep, tmp_path, monkeypatch):
    out = tmp_path / "ds"
    fleet("shard", "--shard", "0/2", *small_sweep, "--out", out)
    monkeypatch.setenv("FICCO_SHARED_NODE", "1")  # as --share-nodes sets it for GPU shards
    fleet("shard", "--shard", "1/2", *small_sweep, "--out", out)
    assert gather(out, "--out", out).exit_code == 0
    assert "**Co-tenancy:**" in (out / "card.md").read_text()


def test_shards_measure_in_the_order_given_and_their_jobs_repeat_it(fleet, small_sweep, tmp_path):
    """``--order`` (an ``order.json`` of ``ficco retrain --order-only``) orders every shard's plan; the
    scenarios it does not name follow in plan order; an order of another plan is refused."""
    from ficco.harness.plan import Plan

    fleet("shard", "--shard", "0/1", *small_sweep, "--out", tmp_path / "plain")
    plain = Plan.from_json((tmp_path / "plain" / "shards" / "shard-00000-of-00001" / "plan.json").read_text())
    keys = [s.key() for _, s in plain]
    order = tmp_path / "order.json"
    order.write_text(json.dumps({"order": keys[::-1][:-3]}))  # the last 3 of the plan left out
    for index in range(2):
        fleet("shard", "--shard", f"{index}/2", *small_sweep, "--out", tmp_path / "ordered", "--order", order)
    measured = []
    for index in range(2):
        directory = tmp_path / "ordered" / "shards" / f"shard-0000{index}-of-00002"
        shard = [s.key() for _, s in Plan.from_json((directory / "plan.json").read_text())]
        rank = {k: i for i, k in enumerate(keys[::-1][:-3] + keys[:3])}
        assert shard == sorted(shard, key=rank.__getitem__)  # the order, then the rest in plan order
        assert read_manifest(directory)["finished"] == shard
        measured += shard
    assert sorted(measured) == sorted(keys)
    job = tmp_path / "job"
    printed = fleet("emit", "slurm", "--shards", "2", *small_sweep, "--out", job, "--order", order)
    assert f"--order {order.resolve()}" in (job / "shards" / "bench.sbatch").read_text(), printed
    order.write_text(json.dumps({"order": ["ag_gemm-of-another-plan"]}))
    refused = CliRunner().invoke(app, ["fleet", "shard", "--shard", "0/2", *map(str, small_sweep), "--out",
                                       str(tmp_path / "other"), "--order", str(order)])  # fmt: skip
    assert refused.exit_code == 2 and "names none of the plan's" in refused.output
