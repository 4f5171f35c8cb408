"""Text renderings of answers for the commands: tables for people, CSV for spreadsheets."""

from __future__ import annotations

import csv
import io
from typing import Any

from ficco.service.schemas import RecommendationPublic, ScorePublic
from ficco.tables import text_table

PARALLEL_BLOCK_PAIRS = ("qkv_mlp_up", "attn_mlp_out")
"""The pairs of a parallel attention+MLP block (features.model_config, Cohere)."""

SCORE_CSV_COLUMNS = (
    "model",
    "tokens",
    "pair",
    "op",
    "m",
    "n",
    "k",
    "experts",
    "top_k",
    "per_layer",
    "layers",
    "schedule",
    "predicted_speedup",
    "fallback",
    "serial_us",
    "predicted_us",
    "saved_us_per_layer",
)


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _served_line(result: ScorePublic | RecommendationPublic) -> str:
    line = f"model version {result.model_version} ({result.hardware_id})"
    if result.hardware_substitution:
        line += f"\nnote: {result.hardware_substitution}"
    return line


def score_table(result: ScorePublic) -> str:
    """One block per token count: the pairs with schedules and savings, then the layer and step totals."""
    blocks = [
        f"{result.model}: {result.layers} layers, tp={result.tp}, {result.dtype}; {_served_line(result)}",
        f"estimate: {result.serial_time_estimate} ({result.estimate_note})",
    ]
    if any(p.name == PARALLEL_BLOCK_PAIRS[0] for entry in result.data for p in entry.pairs):
        blocks.append(
            "parallel attention+MLP block: scored as one all-gather+GEMM (qkv_mlp_up: QKV and gate/up fused "
            "along n) and one GEMM+reduce-scatter (attn_mlp_out: attention-out and down fused along k)"
        )
    header = ["pair", "op", "m", "n", "k", "x/layer", "schedule", "speedup", "serial_us", "saved_us/layer"]
    for entry in result.data:
        rows = [
            [
                p.name,
                p.scenario.op,
                str(p.scenario.m),
                str(p.scenario.n),
                str(p.scenario.k),
                str(p.per_layer),
                p.schedule + (" (fallback)" if p.fallback else ""),
                _num(p.predicted_speedup, 3),
                _num(p.serial_us),
                _num(p.saved_us_per_layer),
            ]
            for p in entry.pairs
        ]
        blocks.append(
            f"\ntokens={entry.tokens}\n{text_table(header, rows)}\n"
            f"saved {entry.saved_us_per_layer:.1f} us per layer ({100 * entry.saved_fraction:.1f}% of "
            f"{entry.serial_us_per_layer:.1f} us serial), {entry.saved_us_per_step / 1000:.3f} ms per step"
        )
    return "\n".join(blocks)


def score_csv(results: ScorePublic | list[ScorePublic]) -> str:
    """One row per (model, token count, pair), columns ``SCORE_CSV_COLUMNS``, one header."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(SCORE_CSV_COLUMNS)
    for result in results if isinstance(results, list) else [results]:
        _score_rows(writer, result)
    return out.getvalue()


def _score_rows(writer: Any, result: ScorePublic) -> None:
    """``result``'s CSV rows."""
    for entry in result.data:
        for p in entry.pairs:
            s = p.scenario
            writer.writerow(
                [
                    result.model,
                    entry.tokens,
                    p.name,
                    s.op,
                    s.m,
                    s.n,
                    s.k,
                    s.experts,
                    s.top_k,
                    p.per_layer,
                    p.layers,
                    p.schedule,
                    p.predicted_speedup,
                    p.fallback,
                    p.serial_us,
                    p.predicted_us,
                    p.saved_us_per_layer,
                ]
            )


def recommendation_table(rec: RecommendationPublic, *, top: int = 5) -> str:
    """The schedule, speedup and fallback, then the ``top`` schedules of highest predicted speedup."""
    lines = [
        f"schedule: {rec.schedule}",
        f"predicted speedup over serial: {_num(rec.predicted_speedup, 3)}",
        f"fallback: {'yes: ' + (rec.fallback_reason or '') if rec.fallback else 'no'}",
        _served_line(rec),
    ]
    ranked = sorted(rec.predicted_speedups.items(), key=lambda kv: -kv[1])[:top]
    rows = [[name, f"{p:.3f}"] for name, p in ranked]
    return "\n".join(lines) + "\n" + text_table(["schedule", "predicted speedup"], rows)
