"""The copy-arrangement probe: its verdict arithmetic (which arrangement ships, when a size table pays, the
goal against NCCL), and its CPU dry run (gloo, 4 ranks) writing the JSON and the markdown with every variant
checked and every schedule timed under every arrangement."""

from __future__ import annotations

import json

import pytest
from executor_world import run_world

from benchmarks import copy_arrangements as probe
from ficco.executor.context import DEFAULT_COPY_STREAMS

NAMES = ["per_peer", "2", "1"]


def _row(mib: int, nccl: float, dma: dict[str, float], graph: float = 1.0) -> dict:
    """An all-gather row: NCCL's time and each arrangement's (graph times scaled by ``graph``)."""
    ms = {"nccl": nccl, "nccl@graph": nccl * graph}
    for a, t in dma.items():
        ms[f"dma:{a}"], ms[f"dma:{a}@graph"] = t, t * graph
    return {"mbytes": mib, "ms": ms, "host_ms": {}, "errors": {}}


def _data(rows: list[dict], schedules: list[dict] = (), current: str = "per_peer") -> dict:
    return {
        "meta": {"arrangements": NAMES, "current": current, "world_size": 4},
        "allgather": rows,
        "schedules": list(schedules),
    }


def test_the_arrangement_fastest_everywhere_ships_and_meets_the_goal_when_it_beats_nccl():
    rows = [
        _row(mib, 1.0 * mib, {"per_peer": 1.2 * mib, "2": 1.0 * mib, "1": 0.9 * mib}) for mib in (1, 64, 256)
    ]
    v = probe.verdict(_data(rows))
    assert v["ship"] == "1" and v["table"] is None
    assert v["size_winners"] == {1: "1", 64: "1", 256: "1"}
    assert v["scores"]["1"] == pytest.approx(1.0) and v["scores"]["per_peer"] == pytest.approx(1.2 / 0.9)
    assert v["goal_met"] is True  # 0.9x NCCL at 64 and 256 MiB
    rows[-1]["ms"]["dma:1"] = 1.1 * 256  # slower than NCCL at 256 MiB
    assert probe.verdict(_data(rows))["goal_met"] is False


def test_a_tie_keeps_the_current_arrangement():
    rows = [_row(mib, mib, {"per_peer": 1.002 * mib, "2": 1.1 * mib, "1": 1.0 * mib}) for mib in (1, 256)]
    assert probe.verdict(_data(rows))["ship"] == "per_peer"  # 0.2% behind: inside TIE
    assert probe.verdict(_data(rows, current="2"))["ship"] == "1"


def test_a_size_table_ships_when_the_winner_changes_once_and_the_table_pays():
    small = {"per_peer": 1.3, "2": 1.2, "1": 1.0}  # fewer streams win while the host issues every call
    large = {"per_peer": 1.0, "2": 1.1, "1": 1.25}  # one stream per peer wins once bandwidth-bound
    rows = [
        _row(mib, mib, {a: t * mib for a, t in (small if mib < 64 else large).items()})
        for mib in (1, 4, 16, 64, 256)
    ]
    v = probe.verdict(_data(rows))
    assert v["size_winners"] == {1: "1", 4: "1", 16: "1", 64: "per_peer", 256: "per_peer"}
    assert v["table"]["from_mib"] == 64 and v["table"]["gain"] > probe.TABLE_GAIN
    piece = 64 / 3  # MiB of one peer's piece where the winner changes, at 4 ranks
    assert v["ship"] == f"0:1;{piece:g}:per_peer"
    from ficco.executor.lanes import CopyStreams

    assert CopyStreams.parse(v["ship"]).at(int(piece * 2**20)) is None  # the table parses and switches there
    against = {(r["mbytes"], r["mode"]): r["arrangement"] for r in v["against_nccl"]}
    assert against[(1, "eager")] == "1" and against[(256, "graph")] == "per_peer"


def test_schedules_count_by_their_fastest_copy_engine_schedule_relative_to_serial():
    def shape(arrangement: str, finer: float) -> dict:
        rows = [
            {"schedule": "serial/sm", "mode": "graph", "ok": True, "relative": 1.0},
            {"schedule": "shard/dma", "mode": "graph", "ok": True, "relative": 0.9},
            {"schedule": "finer/dma/s2/chunk", "mode": "graph", "ok": True, "relative": finer},
        ]
        return {"arrangement": arrangement, "op": "ag_gemm", "m": 4096, "n": 4096, "k": 4096, "rows": rows}

    schedules = [shape("per_peer", 0.8), shape("2", 0.85), shape("1", 0.7)]
    v = probe.verdict(_data([], schedules))
    assert v["items"] == 1 and v["ship"] == "1"
    assert v["scores"]["2"] == pytest.approx(0.85 / 0.7)


def test_arrangements_that_give_the_same_lanes_at_a_world_size_are_tried_once():
    assert probe.arrangements(2) == ["per_peer"]
    assert probe.arrangements(3) == ["per_peer", "1"]
    assert probe.arrangements(4) == ["per_peer", "2", "1"]
    assert probe.arrangements(8) == ["per_peer", "4", "2", "1"]


def _dry_run(rank: int, world_size: int, out: str) -> dict:
    return probe.main(["--cpu-dry-run", "--out", out, "--rounds", "5", "--name", "arrangements"])


@pytest.mark.heavy
@pytest.mark.slow
def test_dry_run_checks_and_times_every_variant_and_schedule_under_every_arrangement(tmp_path):
    result = run_world(4, _dry_run, str(tmp_path))[0]
    names = result["meta"]["arrangements"]
    assert names == ["per_peer", "2", "1"] and result["meta"]["current"] == DEFAULT_COPY_STREAMS
    assert [r["mbytes"] for r in result["allgather"]] == list(probe.DRY_RUN_SIZES_MIB)
    for row in result["allgather"]:
        assert set(row["ms"]) == {"nccl", *(f"dma:{a}" for a in names)}, row  # every check passed
        assert all(t > 0 for t in row["ms"].values())
        assert set(row["errors"]) == {"batched"} and "needs CUDA" in row["errors"]["batched"]
    measured = {(s["op"], s["arrangement"]) for s in result["schedules"]}
    assert measured == {(op, a) for op, *_ in probe.DRY_RUN_SHAPES for a in names}
    assert all(r["ok"] for s in result["schedules"] for r in s["rows"])
    ship = result["verdict"]["ship"]  # an arrangement, or (the CPU's times are noisy) a table of two
    from ficco.executor.lanes import CopyStreams

    assert ship in names or set(map(str, CopyStreams.parse(ship).streams)) <= {"None", "2", "1"}
    saved = json.loads((tmp_path / "arrangements.json").read_text())
    assert saved["verdict"]["ship"] == result["verdict"]["ship"]
    markdown = (tmp_path / "arrangements.md").read_text()
    assert f"Ship **`FICCO_COPY_STREAMS={result['verdict']['ship']}`**" in markdown
    assert "| MiB | nccl | dma:per_peer | dma:2 | dma:1 | winner |" in markdown
