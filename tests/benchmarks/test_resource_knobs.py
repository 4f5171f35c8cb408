"""The resource-knob benchmark: its verdict arithmetic, and its CPU dry run (gloo, tiny shapes) writing the
JSON and markdown with every candidate and knob variant checked and timed."""

from __future__ import annotations

import json

import numpy as np
import pytest
from executor_world import run_world

from benchmarks.studies import resource_knobs as bench


def _shape(times: dict[str, float], mode: str = "graph", rounds: int = 20, noise: float = 0.002) -> dict:
    """A measured shape whose schedules take ``times`` ms, with a little paired noise per round."""
    rng = np.random.default_rng(0)
    drift = 1 + noise * rng.standard_normal(rounds)
    rows = []
    for schedule, ms in times.items():
        round_ms = (ms * drift * (1 + noise * rng.standard_normal(rounds))).tolist()
        label = bench._label(round_ms, mode)
        rows.append(
            {
                "schedule": schedule,
                "mode": mode,
                "ok": True,
                "error": "",
                "label_ms": label,
                "round_ms": round_ms,
            }
        )
    return {"op": "ag_gemm", "m": 4096, "n": 4096, "k": 4096, "schedules": rows}


def test_a_knob_changes_the_best_only_when_it_beats_every_plain_schedule_beyond_noise():
    faster = _shape({"serial/sm": 1.0, "shard/sm": 0.8, "shard/sm/cta8": 0.64, "shard/sm/carve16": 0.801})
    tied = _shape({"serial/sm": 1.0, "shard/sm": 0.8, "shard/sm/cta8": 0.798, "shard/sm/carve16": 0.9})
    v = bench.verdict([faster, tied])
    ctas, carve = v["ctas"], v["carveout"]
    assert [r["changes_best"] for r in ctas["per_shape"]] == [True, False]
    assert ctas["per_shape"][0]["best_knob"] == "shard/sm/cta8"
    assert ctas["per_shape"][0]["gain"] == pytest.approx(1.25, rel=0.01)
    assert ctas["modes"]["graph"]["changes_best"] == 1 and ctas["modes"]["graph"]["share"] == 0.5
    assert ctas["modes"]["graph"]["wins"] == 1
    assert ctas["kept"]  # wins on 1 of 2 shapes >= KEEP_SHARE
    # the carve-out ties once (0.801 against 0.8: inside the 1% floor) and loses once: never a change
    assert [r["changes_best"] for r in carve["per_shape"]] == [False, False]
    assert carve["modes"]["graph"]["geomean_gain"] == pytest.approx(1.0)
    assert not carve["kept"]


def test_a_knob_that_changes_the_best_by_less_than_three_percent_does_not_win_and_leaves():
    """The rule: a knob stays only where it wins by >= 3% on >= 10% of the shapes of a mode. Beyond noise
    (quiet rounds) but 2% faster changes the best schedule without winning."""
    shapes = [_shape({"serial/sm": 1.0, "shard/sm": 0.8, "shard/sm/cta8": 0.784}, noise=0.0005)]
    shapes += [_shape({"serial/sm": 1.0, "shard/sm": 0.8, "shard/sm/cta8": 0.9})] * 9
    ctas = bench.verdict(shapes)["ctas"]
    assert ctas["per_shape"][0]["changes_best"] and not ctas["per_shape"][0]["wins"]
    assert ctas["modes"]["graph"]["wins"] == 0 and not ctas["kept"]
    shapes[0] = _shape({"serial/sm": 1.0, "shard/sm": 0.8, "shard/sm/cta8": 0.76}, noise=0.0005)  # 5%
    ctas = bench.verdict(shapes)["ctas"]
    assert ctas["modes"]["graph"]["share"] == pytest.approx(0.1) and ctas["kept"]  # 1 of 10: kept


def test_failed_variants_are_left_out_and_a_shape_without_variants_has_no_row():
    shape = _shape({"serial/sm": 1.0, "shard/dma": 0.7, "shard/sm/cta2": 0.5})
    shape["schedules"][-1].update(ok=False, label_ms=None, round_ms=[])
    assert bench.verdict([shape])["ctas"]["per_shape"] == []


def _dry_run(rank: int, world_size: int, out: str) -> dict:
    return bench.main(["--cpu-dry-run", "--out", out, "--rounds", "3", "--name", "knobs"])


@pytest.mark.slow
def test_dry_run_checks_and_times_every_schedule_and_knob_variant(tmp_path):
    data = run_world(2, _dry_run, str(tmp_path))[0]
    saved = json.loads((tmp_path / "knobs.json").read_text())
    assert [(s["op"], s["m"]) for s in saved["shapes"]] == [(op, m) for op, m, _, _ in bench.DRY_RUN_SHAPES]
    for shape in saved["shapes"]:
        names = [r["schedule"] for r in shape["schedules"]]
        assert len(names) == 30 + 2 * 7 + 2 * 14  # CTA caps on 7 sm schedules, carve-outs on 14 overlapped
        assert "finer/sm/s8/shard/cta2" in names and "finer/dma/s2/chunk/carve32" in names
        assert all(r["ok"] and len(r["round_ms"]) >= 3 for r in shape["schedules"]), shape["op"]
    assert set(saved["verdict"]) == {"ctas", "carveout"} and saved["verdict"] == data["verdict"]
    markdown = (tmp_path / "knobs.md").read_text()
    assert "## Verdict" in markdown and "| SM carve-out for the GEMMs (/carve<N>) | eager | 2 |" in markdown


def test_a_failing_probe_is_recorded_and_the_others_still_run(monkeypatch):
    class Backend:
        rank = 1  # not the lead: nothing printed
        world_size = 2

    def gemm_probe(backend, m, n, k):
        raise RuntimeError(f"cuBLASLt refused {m}x{n}x{k}\nsecond line")

    monkeypatch.setattr(bench, "gemm_probe", gemm_probe)
    monkeypatch.setattr(bench, "p2p_probe", lambda backend, mib: {"mib_per_peer": mib, "ctadefault_ms": 0.1})
    probes = bench.measure_probes(Backend())
    assert probes["gemm"] == [] and [r["mib_per_peer"] for r in probes["p2p"]] == list(bench.P2P_MIB)
    assert probes["errors"][0] == "gemm (4096, 4096, 4096): RuntimeError: cuBLASLt refused 4096x4096x4096"
    assert len(probes["errors"]) == len(bench.GEMM_PROBES)


def test_one_rank_runs_the_gemm_probes_alone(monkeypatch):
    class Backend:
        rank, world_size = 1, 1

    monkeypatch.setattr(bench, "gemm_probe", lambda backend, m, n, k: {"m": m, "n": n, "k": k, "add_ms": 0.5})
    monkeypatch.setattr(bench, "p2p_probe", lambda backend, mib: pytest.fail("no peer to exchange with"))
    probes = bench.measure_probes(Backend())
    assert [r["m"] for r in probes["gemm"]] == [m for m, _, _ in bench.GEMM_PROBES] and probes["p2p"] == []
