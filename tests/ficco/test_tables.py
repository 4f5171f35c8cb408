"""The table renderers every report, card, benchmark page and command uses."""

from __future__ import annotations

import pytest

from ficco.tables import markdown_table, text_table


def test_markdown_table_writes_header_rule_and_rows():
    table = markdown_table(["op", "ms", "note"], [["ag_gemm", 1.5, ""], ["gemm_rs", 2, "x"]])
    assert table.splitlines() == [
        "| op | ms | note |",
        "|---|---|---|",
        "| ag_gemm | 1.5 |  |",
        "| gemm_rs | 2 | x |",
    ]


def test_markdown_table_empty_header_cell_over_row_names():
    assert markdown_table(["", "top1"], [["model", "0.5"]]).splitlines()[:2] == ["| | top1 |", "|---|---|"]


def test_markdown_table_without_rows_is_header_and_rule():
    assert markdown_table(["a", "b"], []) == "| a | b |\n|---|---|"


def test_text_table_fits_columns_to_their_widest_cell():
    table = text_table(["pair", "op"], [["qkv", "ag_gemm"], ["attn_out", "gemm_rs"]])
    assert table.splitlines() == ["pair      op", "qkv       ag_gemm", "attn_out  gemm_rs"]


def test_text_table_aligns_per_column_with_a_minimum_width():
    table = text_table(["", "top1"], [["model", "0.5000"]], align="<>", min_width=8)
    assert table.splitlines() == ["              top1", "model       0.5000"]


def test_text_table_refuses_a_bad_align():
    with pytest.raises(
        ValueError, match=r"align must be '<' or '>', once or once per column \(2 columns\); got '<<<'"
    ):
        text_table(["a", "b"], [], align="<<<")
    with pytest.raises(ValueError, match="got '<\\^'"):
        text_table(["a", "b"], [], align="<^")
