"""CPU placement of a rank's threads: cpulists, SMT cores from sysfs, the per-rank plan, applying it, and
``seek`` moving the main thread off cores in their slow state."""

import os
import threading

import pytest

from ficco.harness import affinity
from ficco.harness.affinity import (
    SEEK_PASSES,
    SEEK_PAUSE_S,
    SLOW_FACTOR,
    Placement,
    Seeker,
    parse_cpulist,
    physical_cores,
    plan_placement,
)


def test_parse_cpulist_ranges_and_singles():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("5") == [5]


@pytest.mark.parametrize("text", ["a-3", "4-2", "1-x"])
def test_parse_cpulist_names_the_bad_entry(text):
    with pytest.raises(ValueError, match="cpulist"):
        parse_cpulist(text)


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
    assert plans[0].threads == (0, 1, 2, 3, 8, 9, 10, 11)
    assert plans[1].threads == (4, 5, 6, 7, 12, 13, 14, 15)
    assert not plans[0].main


def test_core_gives_the_main_thread_a_core_of_its_own_preferring_gpu_local_cpus():
    placement = plan_placement("core", 1, 2, CPUS, CORES, local={6, 7, 14, 15})
    assert placement.main == (6,)
    assert placement.gpu_local is True
    assert 6 not in placement.threads and 14 not in placement.threads  # the sibling stays idle
    assert set(placement.threads) == {4, 5, 7, 12, 13, 15}


def test_core_without_locality_takes_the_first_core_and_reports_unknown():
    placement = plan_placement("core", 0, 2, CPUS, CORES)
    assert placement.main == (0,)
    assert placement.gpu_local is None
    assert "main thread on CPU 0" in placement.describe()


def test_more_ranks_than_cores():
    cores = [(0,), (1,)]
    placement = plan_placement("core", 2, 3, [0, 1], cores)
    assert placement.main == (0,)
    assert placement.threads == (1,)
    assert plan_placement("share", 2, 3, [0, 1], cores).threads == (0, 1)


def test_bad_policy_and_rank_are_named():
    with pytest.raises(ValueError, match="'fast'"):
        plan_placement("fast", 0, 1, CPUS, CORES)
    with pytest.raises(ValueError, match=r"local rank 2 is outside 0\.\.1"):
        plan_placement("share", 2, 2, CPUS, CORES)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux CPU affinity")
def test_apply_pins_the_main_thread_and_moves_the_others():
    before = os.sched_getaffinity(0)
    cpus = sorted(before)
    main, rest = cpus[:1], cpus[1:] or cpus[:1]
    stop = threading.Event()
    seen: list[set[int]] = []
    helper = threading.Thread(target=lambda: (stop.wait(), seen.append(os.sched_getaffinity(0))))
    helper.start()
    try:
        moved = Placement("core", tuple(rest), main=tuple(main)).apply()
        assert os.sched_getaffinity(0) == set(main)
    finally:
        stop.set()
        helper.join()
        os.sched_setaffinity(0, before)
    assert moved >= 1
    assert seen == [set(rest)]


def test_seek_starts_as_core_and_may_move_over_the_whole_share():
    placement = plan_placement("seek", 1, 2, CPUS, CORES, local={6, 7, 14, 15})
    assert placement.policy == "seek" and placement.main == (6,) and placement.gpu_local is True
    assert placement.seeker.cores == ((6, 14), (4, 12), (5, 13), (7, 15))  # the GPU-local core first
    assert "seek: main thread on whichever of CPUs 4-7 runs" in placement.describe()
    assert plan_placement("seek", 2, 3, [0, 1], [(0,), (1,)]).seeker.cores == ((0,),)  # no share: its core


class _Host:
    """A fake host: each core's probe time, and where the seeker pinned the main thread."""

    def __init__(self, monkeypatch, seeker: Seeker, us: dict[int, float]):
        self.us, self.pinned = us, []
        self.probes = []

        def probe(batches: int = 1) -> float:
            self.probes.append(batches)
            return self.us[seeker.cores[seeker.at][0]]

        monkeypatch.setattr(affinity, "probe_us", probe)
        monkeypatch.setattr(
            affinity, "_pin_main", lambda main, others: self.pinned.append((main, others)) or 0
        )


def test_the_first_settle_probes_every_core_and_stays_on_the_fastest(monkeypatch):
    seeker = Seeker(cores=((0,), (1,), (2,)))
    host = _Host(monkeypatch, seeker, {0: 8.0, 1: 4.0, 2: 4.4})
    assert seeker.settle() is True
    assert seeker.at == 1 and seeker.fastest_us == 4.0
    assert host.pinned[-1] == ((1,), (0, 2))  # the other threads off the main thread's core
    assert seeker.moves == 0  # probing at the start is not a move


def test_settle_moves_off_a_core_that_turned_slow_and_counts_it(monkeypatch):
    seeker = Seeker(cores=((0,), (1,), (2,)))
    host = _Host(monkeypatch, seeker, {0: 4.0, 1: 4.1, 2: 4.2})
    seeker.settle()
    assert seeker.at == 0
    host.us[0] = 4.0 * SLOW_FACTOR * 1.1  # core 0 slows down: the next core that is not slow is taken
    host.us[1] = 8.0
    assert seeker.settle() is True
    assert seeker.at == 2 and seeker.moves == 2 and seeker.slow == 0
    host.us[2] = 4.0 * SLOW_FACTOR * 0.99  # within the tolerance: stays
    assert seeker.settle() is True and seeker.at == 2 and seeker.moves == 2


def test_a_core_found_fast_costs_one_batch_and_a_slow_one_is_confirmed_before_moving(monkeypatch):
    seeker = Seeker(cores=((0,), (1,)))
    host = _Host(monkeypatch, seeker, {0: 4.0, 1: 4.2})
    seeker.settle()
    host.probes.clear()
    assert seeker.settle() is True and host.probes == [1]  # the usual path: one batch
    host.us[0] = 8.0
    host.probes.clear()
    assert seeker.settle() is True and seeker.at == 1
    assert host.probes == [1, affinity.PROBE_BATCHES, 1]  # slow, confirmed, moved, fast


def test_settle_waits_out_a_pass_of_slow_cores_and_says_when_they_stay_slow(monkeypatch):
    seeker = Seeker(cores=((0,), (1,)))
    host = _Host(monkeypatch, seeker, {0: 4.0, 1: 4.0})
    seeker.settle()
    pauses = []
    monkeypatch.setattr(affinity.time, "sleep", pauses.append)
    host.us.update({0: 9.0, 1: 9.0})
    assert seeker.settle() is False
    assert seeker.slow == 1 and seeker.moves == SEEK_PASSES  # one move per pass over the two cores
    assert pauses == [SEEK_PAUSE_S] * (SEEK_PASSES - 1)
    assert "1 found every core slow" in seeker.describe()
    slow_then_fast = iter([9.0, 9.0, 9.0, 9.0, 4.1])  # a pass of slow cores (each confirmed), a pause, back
    monkeypatch.setattr(affinity, "probe_us", lambda batches=1: next(slow_then_fast))
    assert seeker.settle() is True and seeker.slow == 1 and len(pauses) == SEEK_PASSES


def test_other_policies_settle_without_probing(monkeypatch):
    monkeypatch.setattr(affinity, "probe_us", lambda batches=1: pytest.fail("probed"))
    for policy in ("none", "share", "core"):
        assert plan_placement(policy, 0, 2, CPUS, CORES).settle() is True


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux CPU affinity")
def test_seek_on_this_machine_leaves_the_main_thread_on_one_cpu_of_the_share():
    before = os.sched_getaffinity(0)
    placement = plan_placement("seek", 0, 1, sorted(before), [(c,) for c in sorted(before)])
    try:
        placement.apply()
        assert placement.settle() in (True, False)
        placement.settle()
        now = os.sched_getaffinity(0)
        assert len(now) == 1 and now <= set(placement.cpus)
        assert placement.seeker.fastest_us < 1e3
    finally:
        os.sched_setaffinity(0, before)
