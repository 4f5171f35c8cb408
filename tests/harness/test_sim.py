"""The simulated backend: the model's behaviour, its GEMM table, transports and host time, and what-if
hardware (the fit and its fidelity: test_sim_fit.py)."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from ficco.features import (
    SERIAL,
    HardwareProfile,
    Scenario,
    Schedule,
    all_schedules,
    candidates,
    get_hardware,
)
from ficco.harness.dataset import result_rows
from ficco.harness.gemm_table import table_for
from ficco.harness.sim import (
    DEFAULT_CONSTANTS,
    SimBackend,
    _baselines_us,
    _encode,
    _unit_send_us,
    host_price_us,
)

REPO = Path(__file__).resolve().parents[2]


def baselines_ms(sim: SimBackend, scenario: Scenario, mode: str = "eager") -> dict[str, float]:
    """Noise-free baselines (``BASELINE_KEYS``) of ``scenario`` in ``mode``, ms."""
    out = _baselines_us(sim.constants, _encode([(scenario, Schedule())], mode))
    return {key: float(v[0]) / 1e3 for key, v in out.items()}


def _serial_ms(sim, **shape) -> float:
    return float(sim.schedule_ms(Scenario(hardware=sim.hardware, **shape), [SERIAL])[0])


@pytest.mark.parametrize("dim", ["m", "n", "k"])
@pytest.mark.parametrize("op", ["ag_gemm", "gemm_rs"])
def test_serial_time_grows_with_every_dimension(h200, op, dim):
    sim = SimBackend(h200)
    times = [
        _serial_ms(sim, op=op, **{"m": 4096, "n": 4096, "k": 4096, dim: size}) for size in (1024, 4096, 16384)
    ]
    assert times[0] < times[1] < times[2]


def test_every_schedule_time_grows_with_m(h200):
    sim = SimBackend(h200)
    small, large = Scenario(m=2048, hardware=h200), Scenario(m=32768, hardware=h200)
    schedules = candidates(small)
    assert np.all(sim.schedule_ms(small, schedules) < sim.schedule_ms(large, schedules))


def test_nccl_slows_a_concurrent_gemm_more_than_copy_engines(h200):
    # Compute-bound GEMM, small transfer: overlap hides the transfer; what remains is contention.
    s = Scenario(m=16384, n=14336, k=8192, hardware=h200)
    sm, dma = SimBackend(h200).schedule_ms(s, [Schedule.parse("shard/sm"), Schedule.parse("shard/dma")])
    assert sm > dma
    assert DEFAULT_CONSTANTS.sm_gemm_slowdown > 3 * DEFAULT_CONSTANTS.dma_gemm_slowdown


def test_overlap_pays_off_when_communication_dominates(h200):
    sim = SimBackend(h200)
    comm_bound = Scenario(m=65536, n=1024, k=4096, hardware=h200)  # reference: shard/dma 1.14 vs serial 1.90
    serial, shard = sim.schedule_ms(comm_bound, [SERIAL, Schedule.parse("shard/dma")])
    assert shard < 0.75 * serial
    tiny = Scenario(m=1024, n=2048, k=2048, op="gemm_rs", hardware=h200)  # latency-bound: serial wins
    times = sim.schedule_ms(tiny, candidates(tiny))
    assert int(np.argmin(times)) == 0


def test_what_if_scales_with_profile_rates(h200):
    base = SimBackend(h200)
    faster_link = SimBackend(dataclasses.replace(h200, id="h200x2-link2x", link_gbps=900.0))
    faster_math = SimBackend(dataclasses.replace(h200, id="h200x2-peak2x", peak_bf16_tflops=1978.0))
    s = Scenario(m=16384, n=8192, k=8192, hardware=h200)
    b, link, math_ = (
        baselines_ms(x, dataclasses.replace(s, hardware=x.hardware)) for x in (base, faster_link, faster_math)
    )
    assert link["nccl_comm_ms"] < 0.7 * b["nccl_comm_ms"] and link["gemm_alone_ms"] == b["gemm_alone_ms"]
    assert math_["gemm_alone_ms"] < 0.7 * b["gemm_alone_ms"] and math_["dma_comm_ms"] == b["dma_comm_ms"]


def test_measure_marks_every_row_ok_and_unrunnable_schedules_failed(h200):
    s = Scenario(m=4 * 6, n=256, k=256, hardware=h200)  # 24 rows: splits of 8 need 16 | 24 -> no
    result = SimBackend(h200).measure(s, all_schedules())
    by_schedule = {m.schedule: m for m in result.measurements}
    assert len(by_schedule) == 30
    assert not by_schedule["finer/dma/s8/chunk"].ok and "divisible" in by_schedule["finer/dma/s8/chunk"].error
    assert by_schedule["finer/dma/s4/chunk"].ok and np.isfinite(by_schedule["finer/dma/s4/chunk"].median_ms)
    rows = result_rows("grid", s, result, "sim")
    assert {r["backend"] for r in rows} == {"sim"}


def test_noise_is_seeded_per_scenario_and_spreads_percentiles(h200):
    s = Scenario(hardware=h200)
    schedules = candidates(s)
    a = SimBackend(h200, seed=3, noise=0.05).measure(s, schedules).measurements
    b = SimBackend(h200, seed=3, noise=0.05).measure(s, schedules).measurements
    c = SimBackend(h200, seed=4, noise=0.05).measure(s, schedules).measurements
    assert [m.median_ms for m in a] == [m.median_ms for m in b]
    assert [m.median_ms for m in a] != [m.median_ms for m in c]
    assert all(m.p10_ms < m.median_ms < m.p90_ms for m in a)
    backend = SimBackend(h200, seed=3, noise=0.05)
    first, second = (backend.measure(s, schedules).measurements for _ in range(2))
    assert [m.median_ms for m in first] == [m.median_ms for m in a]  # a resumed sweep reproduces its rows
    assert [m.median_ms for m in second] != [m.median_ms for m in first]  # a re-measurement draws anew


def test_sim_backend_rejects_bad_noise(h200):
    with pytest.raises(ValueError, match=r"SimBackend\.noise must be a number in \[0, 1\]; got 2"):
        SimBackend(h200, noise=2)


def test_moe_ops_simulate_finite_times(h200):
    sim = SimBackend(h200)
    for op in ("a2a_gemm", "gemm_a2a"):
        s = Scenario(op=op, m=2048, n=4096, k=4096, experts=8, top_k=2, imbalance=1.3, hardware=h200)
        result = sim.measure(s, candidates(s))
        assert all(m.ok and np.isfinite(m.median_ms) for m in result.measurements)
        assert all(np.isnan(result.baselines[mode]["async_tp_ms"]) for mode in ("eager", "graph"))


def test_fingerprint_names_model_constants_table_and_hardware(h200):
    fp = SimBackend(h200, seed=2, noise=0.1).fingerprint()
    assert fp["backend"] == "sim" and fp["hardware_id"] == "h200x2" and fp["seed"] == 2
    assert fp["sim_model"] == "sim6" and fp["gemm_table"].startswith("h200 table (")
    other = SimBackend(h200, constants=dataclasses.replace(DEFAULT_CONSTANTS, gemm_eff=0.5)).fingerprint()
    assert other["sim_constants"] != fp["sim_constants"]


def test_world_size_comes_from_the_profile():
    assert SimBackend(HardwareProfile(id="x8", gpu_count=8)).world_size == 8


@pytest.mark.parametrize("direction", ["gather", "scatter"])
def test_sim_plan_counts_match_the_executor_plan(direction):
    """The simulator's rounds and GEMM units are the executor's (``executor.plan.make_plan``)."""
    from ficco.executor.plan import make_plan
    from ficco.harness.sim import plan_counts

    codes = {"serial": 0, "shard": 1, "finer": 2}
    for w in (2, 4, 8):
        for granularity, splits, grain in [
            ("serial", 1, "shard"), ("shard", 1, "shard"),
            *[("finer", s, g) for s in (2, 4, 8) for g in ("chunk", "shard")],
        ]:  # fmt: skip
            plan = make_plan(direction, w, granularity, splits, grain)
            rounds, peer_units, round_peers = plan_counts(
                np.array([w]),
                np.array([codes[granularity]]),
                np.array([splits]),
                np.array([grain == "chunk"]),
            )
            peers = [u for u in plan.units if u.offset not in (0, None)]
            assert (int(rounds[0]), int(peer_units[0])) == (len(plan.rounds), len(peers)), (w, granularity)
            reached = {len({piece.offset for piece in pieces}) for pieces in plan.rounds}
            assert reached == {int(round_peers[0])}, (w, granularity, splits)


def test_gemm_times_come_from_the_table_and_the_roofline_only_off_it(h200):
    s = Scenario(m=8192, n=14336, k=4096, hardware=h200)
    x = _encode([(s, Schedule())], "graph")
    one = np.array([1.0])
    measured = table_for(h200.gpu_name).lookup(one, one * 8192, one * 14336, one * 4096,
                                               grouped_kernel=one < 0, rates=h200.to_dict())  # fmt: skip
    c = DEFAULT_CONSTANTS
    assert x["t_whole"][0] == pytest.approx(measured[0])
    graph = baselines_ms(SimBackend(h200), s, "graph")["gemm_alone_ms"] * 1e3
    assert graph == pytest.approx(measured[0] * c.gemm_scale + c.graph_call_us)
    fp32 = _encode([(dataclasses.replace(s, dtype="fp32"), Schedule())], "graph")
    assert np.isnan(fp32["t_whole"][0])  # no fp32 table: the roofline
    assert (
        baselines_ms(SimBackend(h200), dataclasses.replace(s, dtype="fp32"), "graph")["gemm_alone_ms"]
        > 5 * graph / 1e3
    )


def test_expert_gemms_run_grouped_from_eight_experts(h200):
    many = Scenario(op="a2a_gemm", m=4096, n=2048, k=4096, experts=128, top_k=8, hardware=h200)
    few = dataclasses.replace(many, experts=8, top_k=2)
    x = _encode([(many, Schedule.parse("finer/dma/s8/chunk")), (few, Schedule.parse("finer/dma/s8/chunk"))])
    assert x["kernels_whole"].tolist() == [1.0, 4.0]  # 64 local experts: one grouped GEMM; 4: a loop of 4
    assert x["g_peer"].tolist() == [
        8.0,
        1.0,
    ]  # a finer piece reaches an eighth of 64 experts, part of one of 4
    assert np.all(np.isfinite(x["t_whole"]))


def test_a_scatter_unit_sends_its_own_peer_s_share(h200):
    h4 = get_hardware("h200x4")
    s = Scenario(op="gemm_rs", m=65536, n=8192, k=2048, world_size=4, hardware=h4)
    x = _encode([(s, Schedule.parse("finer/dma/s4/shard"))])
    c, dma = DEFAULT_CONSTANTS, np.array([True])
    send = _unit_send_us(c, x, dma, np.array([3.0]), np.array([4.0]))[0]
    one_peer = s.comm_bytes / 3 / (c.ce_bw_frac * h4.link_gbps * 1e3)
    assert send == pytest.approx(4 * c.ce_copy_us + one_peer)


@pytest.mark.parametrize("schedule", ["shard/dma", "finer/dma/s2/chunk", "finer/dma/s4/shard"])
def test_an_eager_copy_engine_scatter_sends_once_its_gemms_are_launched(schedule):
    """The executor pushes a copy-engine scatter's copies after launching the call's GEMMs: in an eager call
    the first send waits for that host time (the call, the GEMM launches, an event per sending unit, times
    the host factor), so dearer GEMM launches delay a communication-bound call by about as much; a graph
    replay, an all-gather and NCCL's sends do not wait."""
    h4 = get_hardware("h200x4")
    # no share of the host time on top: an eager call that is not host-bound takes its device timeline
    base = dataclasses.replace(DEFAULT_CONSTANTS, eager_overlap=0.0, eager_overlap_dma=0.0)
    slow = dataclasses.replace(base, host_gemm_us=base.host_gemm_us + 20.0)
    comm_bound = dict(m=65536, n=8192, k=512, world_size=4, hardware=h4)

    def call_us(c, op: str, sched: str, mode: str) -> float:
        s = Scenario(op=op, **comm_bound)
        return float(SimBackend(h4, constants=c).schedule_ms(s, [Schedule.parse(sched)], mode)[0] * 1e3)

    gemms = _encode([(Scenario(op="gemm_rs", **comm_bound), Schedule.parse(schedule))])["launch"][0, 1]
    delay = call_us(slow, "gemm_rs", schedule, "eager") - call_us(base, "gemm_rs", schedule, "eager")
    assert 0.0 < delay <= base.host_factor * 20.0 * gemms + 1e-6
    assert delay > 0.5 * base.host_factor * 20.0 * gemms  # the sends wait for most of it
    for op, sched, mode in (("gemm_rs", schedule, "graph"), ("ag_gemm", schedule, "eager"),
                            ("gemm_rs", schedule.replace("dma", "sm"), "eager")):  # fmt: skip
        assert call_us(slow, op, sched, mode) == pytest.approx(call_us(base, op, sched, mode))


@pytest.mark.parametrize("op", ["a2a_gemm", "gemm_a2a"])
def test_an_eager_call_launches_the_gemms_its_units_run(op):
    """The host pays for the GEMM kernels the device runs: a loop of one GEMM per local expert below 8 of
    them (as many as ``features.launch_cost`` counts for the loop), one grouped GEMM per unit from 8 on; the
    dense ops one GEMM per unit."""
    h2 = get_hardware("h200x2")
    schedules = ["serial/sm", "shard/dma", "finer/sm/s4/chunk", "finer/dma/s2/shard"]

    def gemms(experts: int, op: str = op) -> list[float]:
        moe = {"experts": experts, "top_k": 2} if experts else {}
        s = Scenario(op=op, m=4096, n=4096, k=4096, world_size=2, hardware=h2, **moe)
        return _encode([(s, Schedule.parse(name)) for name in schedules])["launch"][:, 1].tolist()

    assert gemms(8) == [4, 8, 4 + 4, 8]  # 4 local experts: a loop
    assert gemms(64) == [1, 2, 1 + 4, 2]  # 32: grouped, each piece of a finer chunk reaches 8 of them
    assert gemms(0, "ag_gemm" if op == "a2a_gemm" else "gemm_rs") == [1, 2, 1 + 4, 2]


@pytest.mark.parametrize("op", ["ag_gemm", "gemm_rs"])
def test_send_receive_groups_are_priced_per_send_and_receive(op):
    """An ``sm`` call's host time grows by ``host_p2p_op_us`` for each send and receive its groups issue:
    two per piece, so with the splits of a finer schedule of one group per peer (a scatter's grain
    ``shard``) and with the peers of a shard schedule."""
    c = dataclasses.replace(DEFAULT_CONSTANTS, host_p2p_op_us=10.0)
    zero = dataclasses.replace(c, host_p2p_op_us=0.0)

    def ops_us(w: int, schedule: str) -> float:
        s = Scenario(op=op, m=4096, n=4096, k=4096, world_size=w, hardware=get_hardware(f"h200x{w}"))
        launches = _encode([(s, Schedule.parse(schedule))])["launch"]
        return float(host_price_us(c, launches)[0] - host_price_us(zero, launches)[0])

    for w in (2, 4, 8):
        assert ops_us(w, "shard/sm") == pytest.approx(10.0 * 2 * (w - 1))
        for splits in (2, 4, 8):
            assert ops_us(w, f"finer/sm/s{splits}/shard") == pytest.approx(10.0 * 2 * (w - 1) * splits)
        assert ops_us(w, "serial/sm") == 0.0 and ops_us(w, "shard/dma") == 0.0


def test_eager_calls_pay_their_host_time_and_graph_replays_do_not(h200):
    sim = SimBackend(h200)
    s = Scenario(m=256, n=1024, k=1024, hardware=h200)  # tiny: host-bound when eager
    finer = Schedule.parse("finer/dma/s8/chunk")
    eager, graph = (float(sim.schedule_ms(s, [finer], mode)[0]) * 1e3 for mode in ("eager", "graph"))
    host = (
        DEFAULT_CONSTANTS.host_factor * host_price_us(DEFAULT_CONSTANTS, _encode([(s, finer)])["launch"])[0]
    )
    assert eager >= host > graph


def test_transports_follow_the_executor_benchmarks():
    """NCCL's and the copy engines' all-gather alone at 4 ranks, 16 MiB to 1 GiB received per GPU: the
    simulator within 15% of ``benchmarks/results/executor-h200x4.json`` (eager; one of the fit's sources) at
    the median, within 35% everywhere."""
    h4 = get_hardware("h200x4")
    sim = SimBackend(h4)
    bench = json.loads((REPO / "benchmarks" / "results" / "executor-h200x4.json").read_text())
    errors = []
    for point in bench["allgather_bandwidth"]:
        if point["mbytes"] < 16:
            continue
        m = round(point["mbytes"] * 2**20 / (3 * 4096 * 2)) * 4  # 3/4 of m rows of 4096 bf16 received
        base = baselines_ms(sim, Scenario(m=m, n=4096, k=4096, world_size=4, hardware=h4))
        errors += [
            np.log(base["nccl_comm_ms"] / point["nccl_ms"]),
            np.log(base["dma_comm_ms"] / point["dma_ms"]),
        ]
    assert len(errors) >= 10 and np.median(np.abs(errors)) < np.log(1.15)
    assert np.max(np.abs(errors)) < np.log(1.35)


def test_h100_carries_the_h200_table_by_its_rates():
    h100, h200 = get_hardware("h100x8"), get_hardware("h200x8")
    fingerprint = SimBackend(h100).fingerprint()
    assert "h200 table" in fingerprint["gemm_table"] and "carried to NVIDIA H100" in fingerprint["gemm_table"]
    assert "roofline" in SimBackend(get_hardware("mi300xx8")).fingerprint()["gemm_table"]
    memory_bound = [Scenario(m=64, n=8192, k=8192, world_size=8, hardware=hw) for hw in (h100, h200)]
    slow, fast = (baselines_ms(SimBackend(s.hardware), s, "graph")["gemm_alone_ms"] for s in memory_bound)
    assert slow > 1.2 * fast


def test_the_simulator_prices_the_executor_s_copy_arrangement():
    from ficco.executor.context import DEFAULT_COPY_STREAMS
    from ficco.harness.sim import COPY_STREAMS

    assert str(COPY_STREAMS) == DEFAULT_COPY_STREAMS
