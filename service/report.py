"""Text renderings of answers for the commands: tables for people, CSV for spreadsheets."""

from __future__ import annotations

import csv
import io

from ficco.features.provenance import SIMULATED
from ficco.service.schemas import PairScore, RecommendationPublic, ScorePublic
from ficco.tables import text_table
from ficco.training.predict.coverage import off_map_note

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
    "pick_reason",
    "neighbours",
    "serial_us",
    "predicted_us",
    "saved_us_per_layer",
)


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _served_line(result: ScorePublic | RecommendationPublic) -> str:
    backend = result.model_backend or "measured or simulated: the server does not say"
    world_size = result.tp if isinstance(result, ScorePublic) else result.world_size
    line = f"model version {result.model_version} ({result.hardware_id}, {backend}), world_size {world_size}"
    if result.model_backend == SIMULATED:
        line += "\nnote: this model was trained on simulated times, not GPU measurements"
        if result.sim_fidelity:
            line += "\n" + fidelity_line(result.sim_fidelity)
    if result.hardware_substitution:
        line += f"\nnote: {result.hardware_substitution}"
    return line


def fidelity_line(fidelity: dict) -> str:
    """A simulated model's fidelity (``service.schemas.SimFidelity``) as one line of a table."""
    regret = "; ".join(
        f"{ranks} ranks " + " / ".join(f"{100 * v:.1f}% {mode}" for mode, v in sorted(by_mode.items()))
        for ranks, by_mode in sorted(fidelity["held_out_regret"].items(), key=lambda kv: int(kv[0]))
    )
    guard = ", ".join(
        f"{mode} {'none' if g is None else f'below +{100 * g:.0f}%'}"
        for mode, g in sorted(fidelity["guard_min_gain"].items())
    )
    return (
        f"fidelity ({fidelity['sim_model']}): the simulator's own picks on measured times of held-out model "
        f"families regret {regret}; {fidelity['world_size_note']}; falls back to serial at a predicted gain "
        f"{guard}"
    )


def score_table(result: ScorePublic) -> str:
    """One block per token count: the pairs with schedules and savings, then the layer and step totals."""
    blocks = [
        f"{result.model}: {result.layers} layers, tp={result.tp}, {result.dtype}; {_served_line(result)}",
        f"estimate: {result.serial_time_estimate} ({result.estimate_note})",
    ]
    if result.config_note:
        blocks.append(f"note: {result.config_note}")
    if any(p.name == PARALLEL_BLOCK_PAIRS[0] for entry in result.data for p in entry.pairs):
        blocks.append(
            "parallel attention+MLP block: scored as one all-gather+GEMM (qkv_mlp_up: QKV and gate/up fused "
            "along n) and one GEMM+reduce-scatter (attn_mlp_out: attention-out and down fused along k)"
        )
    header = ["pair", "op", "m", "n", "k", "x/layer", "schedule", "speedup", "neighbours", "serial_us",
              "saved_us/layer"]  # fmt: skip
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
                "-" if p.neighbours is None else str(p.neighbours),
                _num(p.serial_us),
                _num(p.saved_us_per_layer),
            ]
            for p in entry.pairs
        ]
        blocks.append(
            f"\ntokens={entry.tokens}\n{text_table(header, rows)}\n"
            f"saved {entry.saved_us_per_step / 1000:.3f} ms per step ({100 * entry.saved_fraction:.1f}% of "
            f"{entry.serial_us_per_layer * result.layers / 1000:.3f} ms serial), "
            f"{entry.saved_us_per_layer:.1f} us per layer on average over {result.layers} layers"
        )
        blocks += [f"note: {p.name}: {p.schedule} {_pick_note(p)}" for p in entry.pairs if _pick_note(p)]
        if entry.range_note:
            blocks.append(f"note: tokens={entry.tokens}: {entry.range_note}")
    return "\n".join(blocks)


def _pick_note(pair: PairScore) -> str | None:
    """Why a pair's schedule is not the fastest predicted, or why a saving is negative; None if neither."""
    if pair.fallback and pair.measured:
        return f"is the fallback: {pair.fallback_reason}"
    if pair.pick_reason:
        saving = (pair.saved_us_per_layer or 0.0) < 0
        kept = " over serial/sm (a negative saving)" if saving else ""
        return f"is kept{kept}: {pair.pick_reason}"
    return None


def score_csv(results: ScorePublic | list[ScorePublic]) -> str:
    """One row per (model, token count, pair), columns ``SCORE_CSV_COLUMNS``, one header."""
    out = io.StringIO()
    writer = csv.DictWriter(out, SCORE_CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for result in results if isinstance(results, list) else [results]:
        for entry in result.data:
            for p in entry.pairs:
                row = {**dict(p), **dict(p.scenario), "pair": p.name}  # the columns pick their fields
                writer.writerow({**row, "model": result.model, "tokens": entry.tokens})
    return out.getvalue()


def recommendation_table(rec: RecommendationPublic, *, top: int = 5) -> str:
    """The schedule, speedup, fallback and why the pick is not the fastest predicted (if it is not), then
    the ``top`` schedules of highest predicted speedup, with the pick added (and marked) when it is not
    among them."""
    lines = [
        f"schedule: {rec.schedule}",
        f"predicted speedup over serial: {_num(rec.predicted_speedup, 3)}",
        f"fallback: {'yes: ' + (rec.fallback_reason or '') if rec.fallback else 'no'}",
    ]
    if rec.pick_reason and not rec.fallback:
        lines.append(f"why not the fastest predicted: {rec.pick_reason}")
    if rec.neighbours is not None:
        lines.append(f"measured neighbours: {rec.neighbours}{off_map_note(rec.neighbours, rec.mode)}")
    lines.append(_served_line(rec))
    if rec.range_note:
        lines.append(f"note: {rec.range_note}")
    ranked = sorted(rec.predicted_speedups.items(), key=lambda kv: -kv[1])
    shown = ranked[:top]
    if rec.schedule not in dict(shown) and rec.schedule in rec.predicted_speedups:
        shown.append((rec.schedule, rec.predicted_speedups[rec.schedule]))
    rows = [[name + (" (pick)" if name == rec.schedule else ""), f"{p:.3f}"] for name, p in shown]
    return "\n".join(lines) + "\n" + text_table(["schedule", "predicted speedup"], rows)
