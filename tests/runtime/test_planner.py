"""Planner: asks once per shape, fallbacks with reasons, rank agreement, no asking during a CUDA graph
capture, the decision table, and the deprecated step() and timeout_s."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from executor_world import run_world

from ficco.runtime import Answer, FixedSource, OpRequest, Planner
from ficco.runtime import planner as planner_module


def _request(m: int = 64, op: str = "ag_gemm", layer: str = "qkv", direction: str = "fwd") -> OpRequest:
    return OpRequest(layer=layer, direction=direction, op=op, m=m, n=32, k=16, dtype="bf16", world_size=2)


class CountingSource:
    """Answers ``schedule``, counting the scenarios asked about; ``error`` raises."""

    def __init__(self, schedule: str = "shard/dma", *, error: Exception | None = None):
        self.schedule, self.error = schedule, error
        self.asked: list[tuple[int, str]] = []
        self.origin = "counting"

    def recommend(self, scenarios, mode):
        self.asked += [(s.m, mode) for s in scenarios]
        if self.error is not None:
            raise self.error
        return [Answer(schedule=self.schedule, predicted_speedup=1.3, origin=self.origin) for _ in scenarios]


def test_asks_once_per_shape_and_mode():
    source = CountingSource()
    planner = Planner(source)
    for _ in range(3):
        assert str(planner.schedule(_request(64))) == "shard/dma"
        assert str(planner.schedule(_request(64, layer="other"))) == "shard/dma"  # same shape, other layer
    planner.schedule(_request(128))
    assert source.asked == [(64, "eager"), (128, "eager")]
    Planner(source, mode="graph").schedule(_request(64))
    assert source.asked[-1] == (64, "graph")


class NeighbourSource(CountingSource):
    """Answers ``shard/dma`` with ``neighbours`` measured neighbours."""

    def __init__(self, neighbours: int | None):
        super().__init__()
        self.neighbours = neighbours

    def recommend(self, scenarios, mode):
        return [Answer(schedule="shard/dma", predicted_speedup=1.3, neighbours=self.neighbours)] * len(
            scenarios
        )


def test_a_graph_answer_off_the_measured_map_runs_serial_unless_asked(caplog):
    with caplog.at_level(logging.WARNING, "ficco.runtime.planner"):
        off = Planner(NeighbourSource(0), mode="graph")
        assert str(off.schedule(_request())) == "serial/sm"
    decision = next(iter(off.decisions.values()))
    assert decision.neighbours == 0 and "off the measured map: 0 measured neighbours" in decision.reason
    assert "off the measured map" in caplog.text and "| 0 |" in off.table()
    assert str(Planner(NeighbourSource(0), mode="graph", off_map="model").schedule(_request())) == "shard/dma"
    assert str(Planner(NeighbourSource(3), mode="graph").schedule(_request())) == "shard/dma"
    assert str(Planner(NeighbourSource(None), mode="graph").schedule(_request())) == "shard/dma"  # unknown
    assert str(Planner(NeighbourSource(0), mode="eager").schedule(_request())) == "shard/dma"
    with pytest.raises(ValueError, match="off_map must be one of"):
        Planner(NeighbourSource(0), off_map="verify")


def test_prepare_asks_in_one_batch():
    source = CountingSource()
    planner = Planner(source)
    planner.prepare([_request(64), _request(64, op="gemm_rs"), _request(64, layer="again")])
    assert len(source.asked) == 2
    planner.schedule(_request(64, op="gemm_rs"))
    assert len(source.asked) == 2


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        (CountingSource(error=ConnectionError("refused")), "the source failed: ConnectionError: refused"),
        (CountingSource("finer/sm/s8/chunk"), "unusable schedule"),  # m/w = 4 rows cannot split 8 ways
        (CountingSource("no/such"), "unusable schedule"),
        (FixedSource("serial/dma"), None),
    ],
)
def test_unusable_answers_run_serial_with_the_reason(source, reason, caplog):
    planner = Planner(source)
    with caplog.at_level(logging.WARNING, "ficco.runtime.planner"):
        schedule = planner.schedule(_request(8))
    decision = planner.decisions[planner.key(_request(8))]
    if reason is None:
        assert str(schedule) == "serial/dma" and decision.reason is None
    else:
        assert str(schedule) == "serial/sm"
        assert reason in decision.reason and reason in caplog.text


def test_source_fallback_answer_runs_serial():
    class FallingBack:
        def recommend(self, scenarios, mode):
            return [Answer(schedule="serial/sm", fallback=True, fallback_reason="low confidence")] * len(
                scenarios
            )

    planner = Planner(FallingBack())
    assert str(planner.schedule(_request())) == "serial/sm"
    assert "low confidence" in planner.rows()[0]["note"]


def test_capture_decides_serial_without_asking(monkeypatch):
    source = CountingSource()
    planner = Planner(source)
    planner.schedule(_request(64))
    monkeypatch.setattr(planner_module, "_capturing", lambda: True)
    assert str(planner.schedule(_request(64))) == "shard/dma"  # decided before the capture: kept
    assert str(planner.schedule(_request(128))) == "serial/sm"
    assert source.asked == [(64, "eager")]
    assert "CUDA graph capture" in planner.decisions[planner.key(_request(128))].reason


def test_table_lists_layers_directions_and_speedups():
    planner = Planner(CountingSource())
    planner.schedule(_request(64, layer="mlp.up"))
    planner.schedule(_request(64, op="gemm_rs", layer="mlp.up", direction="bwd-input"))
    planner.note("mlp.up", "bwd-weight", "gemm [16, 64] @ [64, 32], kept gathered input")
    table = planner.table().splitlines()
    header = "| layer | direction | shape | schedule | ran | predicted speedup | neighbours | note |"
    assert table[0] == header
    assert table[2] == "| mlp.up | fwd | ag_gemm m=64 n=32 k=16 | shard/dma | (not run) | 1.30x | - |  |"
    assert table[3].startswith("| mlp.up | bwd-input | gemm_rs m=64 n=32 k=16 | shard/dma | (not run) |")
    assert table[4].startswith(
        "| mlp.up | bwd-weight | gemm [16, 64] @ [64, 32], kept gathered input | - | - | -"
    )


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match=r"Planner.mode must be one of \['eager', 'graph'\]; got 'lazy'"):
        Planner(FixedSource("serial/sm"), mode="lazy")


def test_the_deprecated_step_and_timeouts_warn_and_change_nothing():
    source = CountingSource()
    with pytest.warns(DeprecationWarning, match=r"Planner\(timeout_s=...\) is deprecated and does nothing"):
        planner = Planner(source, timeout_s=0.25)
    with pytest.warns(DeprecationWarning, match=r"Planner.step\(\) is deprecated"), planner.step():
        assert str(planner.schedule(_request(64))) == "shard/dma"
    with pytest.warns(DeprecationWarning, match=r"prepare\(timeout_s=...\) .* ServiceClient\(timeout_s"):
        planner.prepare([_request(128)], timeout_s=5)
    assert source.asked == [(64, "eager"), (128, "eager")]


def _agreement_world(rank: int, world_size: int) -> list[str]:
    """Rank 1's source always fails and rank 0's answers: every rank must run rank 0's schedules."""
    source = CountingSource("shard/sm") if rank == 0 else CountingSource(error=RuntimeError("down"))
    planner = Planner(source)
    out = [str(planner.schedule(_request(m))) for m in (64, 128)]
    assert rank == 0 or not source.asked  # only rank 0 asks
    return out


@pytest.mark.slow
def test_ranks_agree_on_rank_zeros_decision():
    assert run_world(2, _agreement_world) == [["shard/sm", "shard/sm"]] * 2


def _four_gpu_world(rank: int, world_size: int) -> list[tuple[str, str | None, str, int | None]]:
    """Every rank plans a shape the 4-GPU sweep measured around and one far from any of its rows, in graph
    mode, from the shipped h200x4 model; only rank 0 loads it and asks."""
    from ficco.runtime import PredictorSource

    source = PredictorSource.load(hardware_id="h200x4") if rank == 0 else CountingSource(error=OSError("x"))
    planner = Planner(source, mode="graph", hardware="h200x4")
    shapes = [(8192, 4096, 8192), (32768, 1024, 16384)]  # the second: the grid the 4-GPU sweep lacks
    requests = [OpRequest(layer="x", direction="fwd", op="ag_gemm", m=m, n=n, k=k, dtype="bf16",
                          world_size=world_size) for m, n, k in shapes]  # fmt: skip
    planner.prepare(requests)
    decisions = [planner.decisions[planner.key(r)] for r in requests]
    return [(str(d.schedule), d.reason, d.origin, d.neighbours) for d in decisions]


@pytest.mark.slow
def test_a_four_rank_group_plans_from_the_four_gpu_model_and_agrees():
    """At 4 gloo ranks the h200x4 model decides (rank 0 asks, every rank runs its answers), and a graph
    answer off the 4-GPU measured map runs serial/sm saying so."""
    from ficco.training.predict.registry import current_version, default_model_root

    ranks = run_world(4, _four_gpu_world)
    assert all(rank == ranks[0] for rank in ranks)
    (_, reason, origin, near), (schedule, off_reason, _, none_near) = ranks[0]
    version = current_version(default_model_root(), "h200x4")
    assert origin == f"model h200x4/{version} (measured)" and near > 0 and reason is None
    assert (schedule, none_near) == ("serial/sm", 0)  # the model's own serial pick, or the planner's:
    assert off_reason is None or off_reason.startswith("off the measured map: 0")


def test_decisions_record_their_origin():
    planner = Planner(FixedSource("shard/dma"))
    planner.schedule(_request())
    assert next(iter(planner.decisions.values())).origin == "fixed shard/dma"


def test_graphed_call_refuses_what_it_cannot_capture():
    import torch

    from ficco.runtime import GraphedCall

    with pytest.raises(ValueError, match=r"GraphedCall\.warmup must be an int >= 1"):
        GraphedCall(lambda: None, warmup=0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="GraphedCall needs CUDA"):
            GraphedCall(lambda: None)


# as_planner: the one way schedules are said ---------------------------------------------------------------


def test_as_planner_takes_every_form_and_shares_one_planner_per_source():
    from ficco.features import Schedule
    from ficco.runtime import FunctionSource, as_planner

    planner = Planner(CountingSource())
    assert as_planner(planner) is planner
    source = CountingSource()
    assert as_planner(source).source is source and as_planner(source) is as_planner(source)
    assert as_planner(source) is not as_planner(source, mode="graph")
    assert as_planner("shard/dma") is as_planner(Schedule.parse("shard/dma"))
    assert isinstance(as_planner(lambda *shape: "shard/sm").source, FunctionSource)
    table = as_planner("0:serial/sm;128:shard/dma")
    picks = [str(table.schedule(_request(m))) for m in (64, 128, 4096)]
    assert picks == ["serial/sm", "shard/dma", "shard/dma"]
    with pytest.raises(ValueError, match=r"schedules must be a runtime.Planner.*got int"):
        as_planner(3)
    with pytest.raises(ValueError, match="no/such"):
        as_planner("no/such")


def test_as_planner_of_none_without_a_gpu_runs_serial_and_warns_once(caplog, monkeypatch):
    import torch

    from ficco.runtime import as_planner

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(planner_module, "_warned_serial", [])
    monkeypatch.setattr(planner_module, "_planners", {})
    with caplog.at_level(logging.WARNING, "ficco.runtime.planner"):
        first, again = as_planner(None), as_planner(None, mode="graph")
    assert str(first.schedule(_request())) == "serial/sm" and str(again.schedule(_request())) == "serial/sm"
    assert caplog.text.count("no measured model for this machine (no CUDA GPU here)") == 1


def test_as_planner_of_none_loads_the_model_of_the_detected_hardware(monkeypatch):
    """On 2 H100s the registry's h100x2 model; on 2 H200s the shipped h200x2 one."""
    import torch

    from ficco.runtime import as_planner, sources
    from ficco.training.predict.registry import ModelLoadError

    loaded = []

    def load(cls, root=None, hardware_id="h200x2", version=None, host_factor=None):
        loaded.append(hardware_id)
        if hardware_id != "h200x2":
            raise ModelLoadError(f"no model for hardware {hardware_id!r}")
        return cls(SimpleNamespace(hardware_id=hardware_id, version="v", recommend=None))

    monkeypatch.setattr(sources.PredictorSource, "load", classmethod(load))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(planner_module, "_planners", {})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    assert as_planner(None).source.hardware_id == "h200x2"
    monkeypatch.setattr(planner_module, "_planners", {})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    assert as_planner(None).source.origin == "fixed serial/sm"  # no h100x2 model here
    assert loaded == ["h200x2", "h100x2"]


def test_deterministic_sources_are_asked_even_during_a_capture(monkeypatch):
    """A function source is plain Python, alike on every rank: asked during a capture too."""
    from ficco.runtime import FunctionSource

    def pick(op, m, n, k, dtype, world_size):
        return "shard/dma" if m >= 128 else "finer/sm/s2/chunk"

    planner = Planner(FunctionSource(pick))
    assert str(planner.schedule(_request(128))) == "shard/dma"
    monkeypatch.setattr(planner_module, "_capturing", lambda: True)
    assert str(planner.schedule(_request(64))) == "finer/sm/s2/chunk"


def test_a_failing_function_source_costs_one_shape_its_overlap():
    from ficco.runtime import FunctionSource

    def picky(op, m, n, k, dtype, world_size):
        if m == 64:
            raise KeyError("no such shape")
        return "shard/dma"

    planner = Planner(FunctionSource(picky))
    planner.prepare([_request(64), _request(128)])
    assert [str(planner.schedule(_request(m))) for m in (64, 128)] == ["serial/sm", "shard/dma"]
    assert "the schedule function failed: KeyError" in planner.decisions[planner.key(_request(64))].reason


def test_a_default_hardware_planner_asks_about_the_groups_size():
    """With no hardware given, 4 ranks are asked about as h200x4, not refused as more than h200x2's GPUs."""
    seen = []

    class Recording(CountingSource):
        def recommend(self, scenarios, mode):
            seen.extend(s.hardware.id for s in scenarios)
            return super().recommend(scenarios, mode)

    request = OpRequest(
        layer="x",
        direction="fwd",
        op="ag_gemm",
        m=64,
        n=32,
        k=16,
        dtype="bf16",
        world_size=4,
    )
    assert str(Planner(Recording()).schedule(request)) == "shard/dma" and seen == ["h200x4"]
    pinned = Planner(CountingSource(), hardware="h200x2")
    assert str(pinned.schedule(request)) == "serial/sm"  # asked for h200x2: not a valid scenario


class SpeedupSource(CountingSource):
    """Answers ``shard/dma`` with a predicted speedup of ``speedup``."""

    def __init__(self, speedup: float):
        super().__init__("shard/dma")
        self.speedup = speedup

    def recommend(self, scenarios, mode):
        return [Answer(schedule=self.schedule, predicted_speedup=self.speedup)] * len(scenarios)


def test_a_batched_op_keeps_its_pick_only_where_the_overlap_pays_for_its_decomposition():
    """8B's w1/w3 gather over two sequences. At 256 tokens a GEMM per shard reads the weight twice (the
    rows are few) and a GEMM per shard and sequence four times, or the outputs move into place, a copy
    larger than serial's (PyTorch's copy of the gathered input): GPU work the model, which timed one
    sequence, did not see, and more than the communication it could hide. At 8192 tokens the GEMMs are
    compute-bound and the pick stays, its prediction bounded by what overlap can hide: no schedule ends
    before its own GEMMs."""

    def decide(speedup: float, batch: int, m: int = 256):
        planner = Planner(SpeedupSource(speedup))
        request = OpRequest(layer="w13", direction="fwd", op="ag_gemm", m=m, n=14336, k=4096, dtype="bf16",
                            world_size=2, batch=batch)  # fmt: skip
        planner.schedule(request)
        return planner.decisions[planner.key(request)]

    for speedup in (1.02, 1.5):
        small = decide(speedup, batch=2)
        assert str(small.schedule) == "serial/sm" and "its GEMMs and copies take" in small.reason
        assert str(decide(speedup, batch=1).schedule) == "shard/dma"  # one sequence: the model measured it
    paying = decide(1.5, batch=2, m=8192)
    assert str(paying.schedule) == "shard/dma" and 1.0 < paying.predicted_speedup < 1.1
    planner = Planner(SpeedupSource(1.02))  # the key holds the sequences: both decided, each its own way
    one, two = (OpRequest(layer="w13", direction="fwd", op="ag_gemm", m=256, n=14336, k=4096, dtype="bf16",
                          world_size=2, batch=b) for b in (1, 2))  # fmt: skip
    assert (str(planner.schedule(one)), str(planner.schedule(two))) == ("shard/dma", "serial/sm")
    assert planner.key(two).shape.endswith(" batch=2")
