"""benchmarks.coverage_plan: a plan of the emptiest regions that the harness measures and resumes (the
simulator here), and benchmarks.studies.coverage_curve over what it measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, cwd=REPO, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_choice_spreads_over_empty_regions_before_filling_one():
    from benchmarks.coverage_plan import choose
    from ficco.features import Scenario

    empty = [Scenario(m=64, n=1024, k=1024), Scenario(m=96, n=1024, k=1024)]  # each the other's neighbour
    far = [Scenario(m=16384, n=8192, k=8192)]
    known = [Scenario(m=1024, n=4096, k=4096)]
    scenarios = empty + far + known
    near = {mode: np.array([0, 0, 0, 5]) for mode in ("eager", "graph")}
    spread = np.array([0.1, 0.3, 0.2, 0.9])
    # the largest spread among the empty first (m=96); its neighbour m=64 then has one: the far one comes next
    assert choose(scenarios, near, spread, np.arange(4), 3) == [1, 2, 0]


@pytest.mark.heavy
def test_plan_is_measured_and_resumed_by_the_harness_and_curved(tmp_path):
    plan, out = tmp_path / "plan.json", tmp_path / "coverage"
    done = run("benchmarks.coverage_plan", "plan", "--candidates", "150", "--dense", "10", "--moe", "4",
               "--bags", "0", "--plan", str(plan))  # fmt: skip
    data = json.loads(plan.read_text())
    entries = [e[1] for e in data["entries"]]
    assert len(entries) == 14 and sum(e["op"] in ("a2a_gemm", "gemm_a2a") for e in entries) == 4
    selection = data["settings"]["selection"]
    assert [s["id"] for s in selection["scores"]] and selection["scenarios_per_call"] == 14
    assert "scenarios per 8.0 min call" in done.stdout
    committed = set()
    for path in (REPO / "datasets").glob("h200x2*/manifest.json"):
        committed |= set(json.loads(path.read_text())["finished"])
    assert not {s["id"] for s in selection["scores"]} & committed  # nothing measured twice
    run("benchmarks.coverage_plan", "measure", "--backend", "sim", "--plan", str(plan), "--out", str(out),
        "--minutes", "0.0001")  # fmt: skip
    first = len(json.loads((out / "manifest.json").read_text())["finished"])
    assert first < 14  # the time budget stopped it
    again = run(
        "benchmarks.coverage_plan", "measure", "--backend", "sim", "--plan", str(plan), "--out", str(out)
    )
    assert "14 of 14 scenarios measured" in again.stdout and (out / "card.md").exists()
    curve = tmp_path / "curve.json"
    run("benchmarks.studies.coverage_curve", "--base", str(out), "--coverage", str(out), "--unseen",
        "--steps", "0", "--max-folds", "2", "--out", str(curve))  # fmt: skip
    result = json.loads(curve.read_text())
    steps, split = result["steps"], result["coverage_scenarios"]
    assert split == {"trainable": 12, "test": 2}  # every fifth in plan order held out
    assert [s["added"] for s in steps] == [0, 12] and {"family_holdout", "coverage_test"} <= set(steps[0])
    assert curve.with_suffix(".md").exists() and curve.with_suffix(".png").exists()
