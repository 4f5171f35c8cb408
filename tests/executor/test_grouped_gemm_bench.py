"""benchmarks/grouped_gemm.py: the routed rows per expert, and its CPU dry run writing every variant."""

from __future__ import annotations

import json

from benchmarks import grouped_gemm as bench


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
