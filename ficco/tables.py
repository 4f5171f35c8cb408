"""Tables as text: GitHub markdown for reports and cards, aligned columns for the terminal.

Every report, card, benchmark page and command that prints a table renders it here, so that a column
rule or an alignment is written once::

    >>> print(markdown_table(["op", "ms"], [["ag_gemm", 1.5]]))
    | op | ms |
    |---|---|
    | ag_gemm | 1.5 |
    >>> print(text_table(["op", "ms"], [["ag_gemm", "1.5"]], align="<>"))
    op        ms
    ag_gemm  1.5
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub markdown table: the header, the ``---`` rule, then one ``| a | b |`` line per row (cells
    with ``str``; an empty header cell is written ``| |``); no trailing newline."""
    lines = ["|" + "".join(f" {cell} |" if cell else " |" for cell in header), "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(
    header: Sequence[str], rows: Iterable[Sequence[str]], *, align: str = "<", min_width: int = 0
) -> str:
    """Columns separated by two spaces, each as wide as its widest cell (header included, at least
    ``min_width``), trailing spaces stripped; no trailing newline. ``align``: ``<`` (left) or ``>`` (right),
    one character per column or one for all; a header cell may be empty (over a column of row names)."""
    table = [list(header), *(list(row) for row in rows)]
    aligns = align * len(header) if len(align) == 1 else align
    if len(aligns) != len(header) or set(aligns) - {"<", ">"}:
        raise ValueError(
            f"align must be '<' or '>', once or once per column ({len(header)} columns); got {align!r}"
        )
    widths = [max(min_width, *(len(r[i]) for r in table)) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if a == "<" else cell.rjust(w) for cell, w, a in zip(r, widths, aligns, strict=True)
        ).rstrip()
        for r in table
    )
