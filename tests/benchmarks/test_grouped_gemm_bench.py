"""benchmarks.studies.grouped_gemm: the routed rows per expert, its CPU dry run writing every variant."""

from __future__ import annotations

import json

from benchmarks.studies import grouped_gemm as bench
from benchmarks.support.expert_blocks import executor_units
from ficco.features import Routing


def test_expert_rows_spread_every_routed_row_over_the_local_experts():
    rows = bench.expert_rows(tokens=100, experts=8, top_k=3)  # 150 rows over 4 experts
    assert rows == [38, 38, 37, 37] and sum(rows) == 100 * 3 // bench.WORLD_SIZE


def test_dry_run_checks_and_times_every_variant(tmp_path):
    data = bench.main(["--cpu-dry-run", "--rounds", "1", "--out", str(tmp_path), "--name", "g"])
    saved = json.loads((tmp_path / "g.json").read_text())
    assert saved["cases"] == data["cases"] and len(saved["cases"]) == 2  # dispatch and combine
    for case in saved["cases"]:
        assert set(case["error"]) == set(bench.VARIANTS) and case["ok"]
        assert all(case[f"{v}_eager_ms"] > 0 and case[f"{v}_host_us"] > 0 for v in bench.VARIANTS)
    assert "| tiny | a2a_gemm | 16 |" in (tmp_path / "g.md").read_text()


def test_units_dry_run_checks_every_block_of_every_schedule(tmp_path):
    data = bench.main(["--cpu-dry-run", "--units", "--rounds", "1", "--out", str(tmp_path), "--name", "u"])
    cases = json.loads((tmp_path / "u.json").read_text())["cases"]
    assert cases == data["cases"] and data["meta"]["kind"] == "units"
    for op in ("a2a_gemm", "gemm_a2a"):
        for schedule in bench.UNIT_SCHEDULES:
            blocks = [c for c in cases if (c["op"], c["schedule"]) == (op, schedule)]
            units = executor_units(
                op, Routing.synthetic(tokens=8, top_k=2, experts=4, world_size=2), schedule
            )
            assert [c["segments"] for c in blocks] == [len(u.segments) for u in units] and blocks
    assert all(c["ok"] and set(c["error"]) == set(bench.UNIT_VARIANTS) for c in cases)
    assert "| eager | never |" in (tmp_path / "u.md").read_text()


def test_thresholds_are_priced_per_call_over_its_blocks():
    def block(schedule, segments, loop, grouped):
        return {"family": "f", "op": "a2a_gemm", "tokens": 1, "schedule": schedule, "segments": segments,
                "loop_eager_ms": loop, "grouped_eager_ms": grouped}  # fmt: skip

    cases = [block("s", 2, 1.0, 2.0), block("s", 16, 4.0, 1.0), block("t", 16, 2.0, 1.0)]
    rows = {r["threshold"]: r for r in bench.threshold_rows(cases, ["eager"])}
    assert rows[8]["over_best_geomean"] == 1.0 and rows[8]["calls"] == 2
    assert rows[1]["over_best_max"] == 1.5  # call s: 2 + 1 against its best 1 + 1
    assert rows[10**9]["loop_over_rule_geomean"] == 1.0 and rows[8]["loop_over_rule_min"] == 2.0


def test_file_names_carry_the_gpu_model():
    assert bench.gpu_tag("NVIDIA H100 80GB HBM3") == "h100" and bench.gpu_tag("NVIDIA H200") == "h200"
