"""CPU placement of a rank's threads: cpulists, SMT cores from sysfs, the per-rank plan, applying it."""

import os
import threading

import pytest

from ficco.harness.cpu_placement import Placement, physical_cores, plan_placement


def _fake_sysfs(tmp_path, siblings: dict[int, str]):
    for cpu, text in siblings.items():
        topo = tmp_path / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings_list").write_text(text + "\n")
    return tmp_path


def test_physical_cores_groups_smt_siblings(tmp_path):
    sys_cpu = _fake_sysfs(tmp_path, {0: "0,4", 1: "1,5", 4: "0,4", 5: "1,5"})
    assert physical_cores([0, 1, 4, 5], sys_cpu) == [(0, 4), (1, 5)]


def test_physical_cores_keep_only_allowed_siblings_and_unknown_cpus_alone(tmp_path):
    sys_cpu = _fake_sysfs(tmp_path, {0: "0,4"})
    assert physical_cores([0, 7], sys_cpu) == [(0,), (7,)]


CORES = [(0, 8), (1, 9), (2, 10), (3, 11), (4, 12), (5, 13), (6, 14), (7, 15)]
CPUS = sorted(c for core in CORES for c in core)


def test_share_gives_ranks_disjoint_whole_cores():
    plans = [plan_placement("share", r, 2, CPUS, CORES) for r in range(2)]
    assert plans[0].cpus == (0, 1, 2, 3, 8, 9, 10, 11)
    assert plans[1].cpus == (4, 5, 6, 7, 12, 13, 14, 15)


def test_share_says_whether_it_lies_near_the_gpu():
    assert plan_placement("share", 1, 2, CPUS, CORES, local={4, 5, 6, 7, 12, 13, 14, 15}).gpu_local is True
    assert plan_placement("share", 0, 2, CPUS, CORES, local={4, 5}).gpu_local is False
    placement = plan_placement("share", 0, 2, CPUS, CORES)
    assert placement.gpu_local is None and placement.describe() == "share: every thread on CPUs 0-3,8-11"


def test_more_ranks_than_cores():
    assert plan_placement("share", 2, 3, [0, 1], [(0,), (1,)]).cpus == (0, 1)


def test_bad_policy_and_rank_are_named():
    with pytest.raises(ValueError, match="'fast'"):
        plan_placement("fast", 0, 1, CPUS, CORES)
    with pytest.raises(ValueError, match=r"local rank 2 is outside 0\.\.1"):
        plan_placement("share", 2, 2, CPUS, CORES)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux CPU affinity")
def test_confine_keeps_the_threads_started_later_within_the_share():
    before = os.sched_getaffinity(0)
    share = tuple(sorted(before)[:1])
    seen: list[set[int]] = []
    try:
        Placement("share", share).confine()
        helper = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
        helper.start()
        helper.join()
        assert os.sched_getaffinity(0) == set(share)
    finally:
        os.sched_setaffinity(0, before)
    assert seen == [set(share)]
