"""``ficco fleet run`` on one local Ray cluster of 2 CPUs (module-scoped; CPU only): a 4-shard simulated
sweep gathers to the unsharded rows, a shard whose Ray worker is killed mid-shard is retried and resumes,
and a 2-shard gloo sweep gives the plan's scenarios x schedules."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ficco.features import candidates
from ficco.features.dataset import dataset_hash, load_dataset, read_manifest
from ficco.harness.fleet.ray_tasks import shard_bundle
from ficco.harness.fleet.shards import read_runs
from ficco.harness.plan import Plan

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.heavy]

REPO_ROOT = Path(__file__).resolve().parents[2]
KILLER = """
import os, sys
argv = sys.argv
if "--shard" in argv and argv[argv.index("--shard") + 1] == "1/4" and "--out" in argv:
    out = argv[argv.index("--out") + 1]
    marker = os.path.join(out, "killed-once")
    if out.endswith("kill-me") and not os.path.exists(marker):
        from ficco.harness import sweep

        write = sweep._PartSink._write

        def _write_then_die(self):
            write(self)
            if len(self.manifest["parts"]) >= 2:
                open(marker, "w").close()
                os.kill(os.getppid(), 9)  # the Ray worker running the shard's task
                os.kill(os.getpid(), 9)

        sweep._PartSink._write = _write_then_die
"""
"""A ``sitecustomize`` for the cluster's processes: the sweep of shard 1/4 into a folder ending in
``kill-me`` kills its Ray worker and itself after writing its second part, once."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One local Ray cluster of 2 CPUs for the module; its processes import this checkout and run
    ``KILLER`` at start. Prints what it cost."""
    hooks = tmp_path_factory.mktemp("hooks")
    (hooks / "sitecustomize.py").write_text(KILLER)
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(hooks), str(REPO_ROOT), before) if p)
    started = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    print(f"ray cluster up in {time.perf_counter() - started:.1f} s")
    yield
    ray.shutdown()
    print(f"ray cluster: {time.perf_counter() - started:.1f} s from start to shutdown")
    if before is None:
        os.environ.pop("PYTHONPATH")
    else:
        os.environ["PYTHONPATH"] = before


def test_four_ray_shards_gather_to_the_unsharded_rows(fleet, small_sweep, cluster, whole, tmp_path):
    out = tmp_path / "ds"
    printed = fleet("run", "auto", "--shards", "4", *small_sweep, "--out", out)
    assert "gathered 4 shards" in printed
    assert dataset_hash(out) == dataset_hash(whole)
    shards = read_manifest(out)["gathered"]["shards"]
    assert [s["shard"] for s in shards] == ["0/4", "1/4", "2/4", "3/4"]
    assert {r["engine"] for s in shards for r in s["runs"]} == {"ray"}
    assert "## Shards" in (out / "card.md").read_text()


def test_a_killed_ray_task_is_retried_and_resumes_its_shard(fleet, small_sweep, cluster, whole, tmp_path):
    out = tmp_path / "kill-me"
    fleet("run", "auto", "--shards", "4", *small_sweep, "--out", out)
    assert (out / "killed-once").exists()  # the first run of shard 1 was killed
    runs = read_runs(out / "shards" / "shard-00001-of-00004")
    assert [r["finished_before"] for r in runs] == [0, 2]  # retried, resumed after its 2 scenarios
    manifest = read_manifest(out / "shards" / "shard-00001-of-00004")
    assert len(manifest["finished"]) == len(set(manifest["finished"]))  # nothing measured twice
    assert read_manifest(out)["gathered"]["duplicates_dropped"] == 0
    assert dataset_hash(out) == dataset_hash(whole)  # nothing lost


def test_two_ray_shards_on_gloo_give_the_plans_scenarios_and_schedules(
    fleet, cluster, tiny_configs, tmp_path
):
    out = tmp_path / "ds"
    tiny = ("--configs", tiny_configs, "--tokens", "256", "--grid", "0", "--sample", "2", "--rounds", "1")
    fleet("run", "auto", "--shards", "2", "--backend", "gloo", *tiny, "--timed-ms", "0", "--out", out)
    plan = Plan.from_json((out / "plan.json").read_text())
    expected = {(s.key(), "eager", str(c)) for _, s in plan for c in candidates(s)}
    rows = load_dataset(out)
    assert set(zip(rows["scenario_id"], rows["mode"], rows["schedule"], strict=True)) == expected
    assert len(rows) == len(expected) and rows["ok"].all()
    assert sum(s["scenarios"] for s in read_manifest(out)["gathered"]["shards"]) == len(plan)


def test_shard_bundles_hold_a_whole_gpu_node_unless_shared():
    assert shard_bundle("gpu", 2, share_nodes=False, node_gpus=[8, 8]) == {"CPU": 1, "GPU": 8.0}
    assert shard_bundle("gpu", 2, share_nodes=True, node_gpus=[8, 8]) == {"CPU": 1, "GPU": 2.0}
    assert shard_bundle("gloo", 4, share_nodes=False, node_gpus=[]) == {"CPU": 4.0}
    with pytest.raises(ValueError, match="no node of the Ray cluster has 4 GPUs"):
        shard_bundle("gpu", 4, share_nodes=False, node_gpus=[2, 0])
    with pytest.raises(ValueError, match="differ in size"):
        shard_bundle("gpu", 2, share_nodes=False, node_gpus=[4, 8])
