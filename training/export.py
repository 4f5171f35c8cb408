"""``ficco export``: a model's picks as tables runtimes load (``features.schedule_table``), and drop-in
artifacts for runtimes that can only choose between serial and PyTorch async-TP.

    ficco export --hardware h200x2 --config datasets/model_configs --tp 2 --out tables/
    ficco export --hardware h200x2 --dataset datasets/h200x2-unseen --format vllm --out tables/
    ficco export --hardware h200x2 --config datasets/model_configs --format autoheuristic --out tables/

Formats:

- ``tables`` (default): one schedule table per (world size, mode, dtype) of every (op, n, k) asked for.
  The model is asked at every point of the token grid (:func:`token_grid`); the breakpoints are the grid
  points where its pick changes.
- ``vllm``: per (hidden size, tp, dtype) the fewest tokens from which PyTorch async-TP is predicted faster
  than serial for the hidden size's GEMMs from there on, the numbers that replace vLLM's
  ``SP_MIN_HIDDEN_SIZE`` and ``SP_MIN_PER_GPU_SIZE_MB`` for this machine (None: never).
- ``autoheuristic``: a plain Python module, ``should_fuse(op, m, n, k) -> bool``, the fuse/no-fuse decision
  of PyTorch's micro-pipeline pass, from the same model per (op, n, k) over the token grid.

Both drop-in artifacts come from ``training.baselines.AsyncTPModel`` (what ``ficco evaluate`` scores as
``ficco_async_tp_threshold``) fitted on the model's own training datasets, and carry in their header their
evaluation on ficco's data next to vLLM's rule and the per-scenario oracle.

Refused: hardware without a model, a model trained on simulated data or on other world sizes (unless
``allow_simulated``, which marks every file ``"simulated": true``).
"""

from __future__ import annotations

import bisect
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from ficco.features import MODES, Scenario, feature_matrix, get_hardware, roofline_comm_us, roofline_gemm_us
from ficco.features.schedule_table import (
    BEST_SET_FLOOR,
    FORMAT,
    FORMAT_VERSION,
    Entry,
    Range,
    ScheduleTableFile,
    artifact_name,
    hardware_fingerprint,
)
from ficco.files import write_text_atomic
from ficco.training.model import SCHEDULES, SERIAL_INDEX

log = logging.getLogger(__name__)

Shape = tuple[str, int, int, int, int]
"""``(op, n, k, experts, top_k)``: what a table entry is keyed by (experts and top_k 0 for dense ops)."""
PER_OCTAVE = 16
"""Grid points per doubling of the token count above :data:`FINE_BELOW`: consecutive points differ by at
most 1/16 (6.25%) of the smaller."""
FINE_BELOW = 64
"""Below this many tokens (decode batches) the grid holds every multiple of the world size."""
FINE_STEP = 64
"""Where two neighbouring grid points get different picks, the model is asked at every multiple of this
many tokens between them (of ``lcm(FINE_STEP, world_size)``), so a breakpoint sits within it of the change."""
MAX_TOKENS = 65536
"""The grid's last token count: the largest of the datasets; a lookup above it gets the last range."""
FORMATS = ("tables", "vllm", "autoheuristic")


class ExportRefused(ValueError):
    """An export the model cannot back with measurements."""


def token_grid(world_size: int, *, per_octave: int = PER_OCTAVE, max_tokens: int = MAX_TOKENS) -> np.ndarray:
    """Token counts the model is asked at, sorted int ``[G]``: every multiple of ``world_size`` below
    :data:`FINE_BELOW`, then ``per_octave`` points per doubling (each octave ``[b, 2b)`` in steps of
    ``b / per_octave``), up to ``max_tokens``; every point a multiple of ``world_size``."""
    points = list(range(world_size, FINE_BELOW, world_size))
    base = FINE_BELOW
    while base < max_tokens:
        step = max(world_size, base // per_octave)
        points += range(base, min(2 * base, max_tokens + 1), step)
        base *= 2
    points.append(max_tokens)
    grid = np.unique(np.asarray(points, dtype=np.int64) // world_size * world_size)
    return grid[grid >= world_size]


def grid_description(world_size: int, per_octave: int = PER_OCTAVE, max_tokens: int = MAX_TOKENS) -> dict:
    """How fine :func:`token_grid` is, for the table header."""
    return {
        "world_size_multiples_below": FINE_BELOW,
        "points_per_octave": per_octave,
        "max_tokens": max_tokens,
        "n_points": len(token_grid(world_size, per_octave=per_octave, max_tokens=max_tokens)),
        "refined_to": math.lcm(FINE_STEP, world_size),
        "rule": f"every multiple of {world_size} tokens below {FINE_BELOW}, then {per_octave} points per "
        f"doubling (steps of 1/{per_octave} of the octave's start, at least {world_size}) up to "
        f"{max_tokens}, and every multiple of {math.lcm(FINE_STEP, world_size)} tokens between two points "
        "whose picks differ; a lookup of m returns "
        "the range of the largest breakpoint <= m: the model's pick at every grid point, and between grid "
        f"points the pick at the grid point below (above {max_tokens}: the last range)",
    }


# What the model is and where it was measured ---------------------------------------------------------


def training_fingerprint(card: dict[str, Any]) -> dict[str, Any]:
    """The :data:`FINGERPRINT_KEYS` of the machine the model's data come from, from its card: ``gpu`` for
    GPU measurements (``sim`` otherwise), its GPU name and count."""
    backend = "gpu" if card.get("dataset", {}).get("backends") == ["gpu"] else "sim"
    hw = card["hardware"]
    return {"backend": backend, "gpu_name": hw["gpu_name"], "gpu_count": int(hw["gpu_count"])}


def check_measured(card: dict[str, Any], world_size: int, *, allow_simulated: bool) -> bool:
    """Whether an export at ``world_size`` would be simulated (returned when ``allow_simulated``); else
    :class:`ExportRefused` naming why: the model's data are not GPU measurements, or of other world sizes
    (its card's ``world_sizes``; cards from before that field: its hardware's GPU count)."""
    backends = card.get("dataset", {}).get("backends", [])
    measured_sizes = set(card.get("world_sizes") or [int(card["hardware"]["gpu_count"])])
    why = []
    if backends != ["gpu"]:
        why.append(f"its training data come from backends {backends}, not GPU measurements")
    if world_size not in measured_sizes:
        why.append(f"it was measured at world sizes {sorted(measured_sizes)}, not {world_size}")
    if why and not allow_simulated:
        raise ExportRefused(
            f"model {card['hardware_id']}/{card['version']} cannot back a table at tp={world_size}: "
            f"{'; '.join(why)}. Measure this machine (`ficco retrain`), or pass --allow-simulated to export "
            "tables marked simulated"
        )
    return bool(why)


def model_header(predictor: Any, host_factor: float) -> dict[str, Any]:
    """The model part of every export's header."""
    card = predictor.card
    return {
        "hardware_id": predictor.hardware_id,
        "version": predictor.version,
        "feature_schema": predictor.feature_schema,
        "objective": card.get("objective"),
        "policy": card.get("policy"),
        "host_factor": host_factor,
    }


def datasets_header(card: dict[str, Any]) -> list[dict[str, Any]]:
    """The training datasets and their content hash (``harness.dataset.frame_hash``, from the card)."""
    data = card.get("dataset", {})
    return [{"path": data.get("path"), "hash": data.get("hash", card.get("dataset_hash"))}]


def export_header(
    predictor: Any, fmt: str, *, world_size: int, mode: str, dtype: str, host_factor: float, simulated: bool,
    grid: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """The header every export file carries: format, device, (world size, mode, dtype), the hardware
    fingerprint, whether simulated, the model, its training datasets, the grid and the time."""
    card = predictor.card
    fields = training_fingerprint(card)
    return {
        "format": fmt,
        "format_version": FORMAT_VERSION,
        "hardware_id": predictor.hardware_id,
        "device_name": card["hardware"]["gpu_name"],
        "world_size": world_size,
        "mode": mode,
        "dtype": dtype,
        "fingerprint": hardware_fingerprint(fields),
        "fingerprint_fields": fields,
        "simulated": simulated,
        "model": model_header(predictor, host_factor),
        "datasets": datasets_header(card),
        "grid": grid,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


# Shapes ---------------------------------------------------------------------------------------------


def config_shapes(paths: Sequence[str | Path], *, tp: int, dtype: str, hardware_id: str) -> list[Shape]:
    """Every (op, n, k, experts, top_k) of the layers of the Hugging Face configs in ``paths`` (files or
    directories, ``features.model_config``) at tensor-parallel degree ``tp``."""
    from ficco.features.model_config import config_paths, layer_pairs, load_model_config

    hardware = get_hardware(hardware_id)
    shapes: dict[Shape, None] = {}
    for path in paths:
        for file in config_paths(path):
            config = load_model_config(file)
            for pair in layer_pairs(config, tp=tp, tokens=tp * FINE_BELOW, dtype=dtype, hardware=hardware):
                s = pair.scenario
                shapes.setdefault((s.op, s.n, s.k, s.experts, s.top_k), None)
    return list(shapes)


GRID_SIZES: tuple[int, ...] = (1024, 2048, 3072, 4096, 5120, 6144, 7168, 8192, 12288, 14336, 16384)
"""Per-rank n and k of :func:`grid_shapes`: common hidden and projection widths."""


def grid_shapes() -> list[Shape]:
    """The dense shape grid a table is built for when no model config is given: both tensor-parallel ops
    at every (n, k) of :data:`GRID_SIZES`."""
    return [(op, n, k, 0, 0) for op in ("ag_gemm", "gemm_rs") for n in GRID_SIZES for k in GRID_SIZES]


def dataset_shapes(paths: Sequence[str | Path], *, tp: int, dtype: str) -> list[Shape]:
    """Every (op, n, k, experts, top_k) of the datasets in ``paths`` at world size ``tp`` and ``dtype``."""
    from ficco.features.dataset import load_datasets

    df, _ = load_datasets([Path(p) for p in paths])
    df = df[(df["world_size"] == tp) & (df["dtype"] == dtype)]
    keys = df[["op", "n", "k", "experts", "top_k"]].drop_duplicates().itertuples(index=False)
    return sorted((str(op), int(n), int(k), int(e), int(t)) for op, n, k, e, t in keys)


def grid_scenarios(shape: Shape, grid: np.ndarray, *, world_size: int, dtype: str, hardware_id: str):
    """The scenarios of ``shape`` at every token count of ``grid`` it can run (MoE: ``m * top_k``
    divisible by the world size), and those token counts."""
    op, n, k, experts, top_k = shape
    hardware = get_hardware(hardware_id)
    out, ms = [], []
    for m in grid.tolist():
        try:
            out.append(Scenario(op=op, m=m, n=n, k=k, dtype=dtype, world_size=world_size, hardware=hardware,
                                experts=experts, top_k=top_k))  # fmt: skip
        except ValueError:
            continue
        ms.append(m)
    return out, np.asarray(ms, dtype=np.int64)


# Schedule tables ---------------------------------------------------------------------------------------


def entry_of(shape: Shape, ms: np.ndarray, final: np.ndarray, speedups: np.ndarray) -> Entry:
    """One table entry from the model's picks over the token grid: ``ms`` ``[G]``, recommended columns
    ``final`` ``[G]``, predicted speedups of every schedule ``[G, S]`` (NaN: cannot run)."""
    rows = np.arange(len(ms))
    pick = np.where(final == SERIAL_INDEX, 1.0, speedups[rows, final])
    others = speedups.copy()
    others[rows, final] = np.nan
    others = np.where(np.isnan(others), -np.inf, others)
    runner = others.argmax(axis=1)
    runner_speedup = others[rows, runner]
    margin = np.where(np.isfinite(runner_speedup), pick / runner_speedup - 1.0, np.inf)
    starts = np.flatnonzero(np.r_[True, final[1:] != final[:-1]])
    ends = np.r_[starts[1:], len(ms)]
    ranges = []
    for a, b in zip(starts, ends, strict=True):
        low = float(margin[a:b].min())
        ranges.append(
            Range(
                schedule=SCHEDULES[final[a]],
                predicted_speedup=round(float(pick[a]), 4),
                min_speedup=round(float(pick[a:b].min()), 4),
                runner_up=SCHEDULES[runner[a]] if np.isfinite(runner_speedup[a]) else None,
                margin=round(low, 4) if np.isfinite(low) else 1e9,
                confident=bool(low >= BEST_SET_FLOOR),
            )
        )
    op, n, k, experts, top_k = shape
    return Entry(op=op, n=n, k=k, experts=experts, top_k=top_k,
                 breakpoints=tuple(int(m) for m in ms[starts]), ranges=tuple(ranges))  # fmt: skip


def build_schedule_table(
    predictor: Any,
    shapes: Sequence[Shape],
    *,
    world_size: int,
    mode: str,
    dtype: str,
    host_factor: float | None = None,
    allow_simulated: bool = False,
    per_octave: int = PER_OCTAVE,
    max_tokens: int = MAX_TOKENS,
) -> ScheduleTableFile:
    """The schedule table of ``predictor`` (a ``training.predictor.Predictor``) for ``shapes`` in one
    (world size, mode, dtype), on a machine of ``host_factor`` (None: the model's training data's).

    Raises :class:`ExportRefused` for a model that cannot back it (:func:`check_measured`) and
    ``ValueError`` for an unknown mode or no shapes.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}; got {mode!r}")
    if not shapes:
        raise ValueError("no shapes to export: give model configs, datasets or --shape op:n:k")
    card = predictor.card
    simulated = check_measured(card, world_size, allow_simulated=allow_simulated)
    factor = predictor.host_factor if host_factor is None else host_factor
    grid = token_grid(world_size, per_octave=per_octave, max_tokens=max_tokens)
    hw = predictor.hardware_id

    def decide(points: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(token counts it can run, picks, speedups) of every shape at its ``points``, in one batch."""
        per_shape = [grid_scenarios(s, g, world_size=world_size, dtype=dtype, hardware_id=hw)
                     for s, g in zip(shapes, points, strict=True)]  # fmt: skip
        scenarios = [sc for scs, _ in per_shape for sc in scs]
        if not scenarios:
            return [(ms, ms, np.empty((0, len(SCHEDULES)))) for _, ms in per_shape]
        d = predictor.decide(feature_matrix(scenarios), [mode] * len(scenarios), host_factor=factor)
        bounds = np.cumsum([0] + [len(ms) for _, ms in per_shape])
        return [(ms, d.final[a:b], d.speedups[a:b]) for (_, ms), a, b in
                zip(per_shape, bounds[:-1], bounds[1:], strict=True)]  # fmt: skip

    # 1. every shape on the coarse grid; 2. every fine step inside each interval whose ends differ
    coarse = decide([grid] * len(shapes))
    fine_step = math.lcm(FINE_STEP, world_size)
    refine = []
    for ms, final, _ in coarse:
        changed = np.flatnonzero(final[1:] != final[:-1])
        inside = [np.arange((ms[i] // fine_step + 1) * fine_step, ms[i + 1], fine_step) for i in changed]
        refine.append(np.concatenate([np.empty(0, dtype=np.int64), *inside]).astype(np.int64))
    fine = decide(refine)
    entries = {}
    for shape, (ms, final, speedups), (ms2, final2, speedups2) in zip(shapes, coarse, fine, strict=True):
        if not len(ms):
            continue
        order = np.argsort(np.r_[ms, ms2], kind="stable")
        merged = (np.r_[ms, ms2][order], np.r_[final, final2][order], np.r_[speedups, speedups2][order])
        entry = entry_of(shape, *merged)
        entries[entry.key] = entry
    grid_text = grid_description(world_size, per_octave, max_tokens)
    header = export_header(predictor, FORMAT, world_size=world_size, mode=mode, dtype=dtype,
                           host_factor=factor, simulated=simulated, grid=grid_text)  # fmt: skip
    return ScheduleTableFile(header=header, entries=entries)


# Drop-in artifacts: serial or PyTorch async-TP --------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class FuseRanges:
    """Where ficco's async-TP model fuses, per (op, n, k) over the token grid, in one (tp, mode, dtype)."""

    starts: dict[tuple[str, int, int], list[int]]
    """Token counts where the decision changes (the first is the grid's smallest)."""
    fuse: dict[tuple[str, int, int], list[bool]]
    """The decision from each start on."""
    log_ratio: dict[tuple[str, int, int], np.ndarray]
    """Predicted ``log(t_async_tp / t_serial)`` at every grid point."""
    grid: dict[tuple[str, int, int], np.ndarray]
    """The grid points of each shape."""


def fuse_ranges(model: Any, shapes: Sequence[Shape], *, world_size: int, mode: str, dtype: str,
                hardware_id: str, host_factor: float) -> FuseRanges:  # fmt: skip
    """``model`` (a fitted ``training.baselines.AsyncTPModel``) over the token grid of every dense shape."""
    grid = token_grid(world_size)
    starts, fuse, ratios, grids = {}, {}, {}, {}
    for shape in shapes:
        if shape[3]:  # MoE: PyTorch has no async-TP for an all-to-all
            continue
        scs, ms = grid_scenarios(shape, grid, world_size=world_size, dtype=dtype, hardware_id=hardware_id)
        X = feature_matrix(scs)
        ratio = model.predict_log_ratio(X, np.full(len(ms), mode, dtype=object), host_factor)
        on = -ratio >= np.log1p(model.min_gain_.get(mode, 0.0))
        change = np.flatnonzero(np.r_[True, on[1:] != on[:-1]])
        key = shape[:3]
        starts[key], fuse[key] = ms[change].tolist(), on[change].tolist()
        ratios[key], grids[key] = ratio, ms
    return FuseRanges(starts=starts, fuse=fuse, log_ratio=ratios, grid=grids)


def vllm_thresholds(ranges: FuseRanges, scenarios_of: dict[tuple[str, int, int], list[Scenario]],
                    min_gain: float) -> dict[int, int | None]:  # fmt: skip
    """Per hidden size (``k`` of an all-gather, ``n`` of a reduce-scatter), the fewest grid tokens from
    which the roofline-weighted mean predicted log ratio of the hidden size's GEMMs stays below
    ``-log(1 + min_gain)`` (async-TP predicted faster) up to the grid's end; None: not at the grid's end."""
    from ficco.training.peer_rules import rule_hidden_size

    by_hidden: dict[int, list[tuple[str, int, int]]] = {}
    for key, scs in scenarios_of.items():
        by_hidden.setdefault(rule_hidden_size(scs[0]), []).append(key)
    out = {}
    for hidden, keys in sorted(by_hidden.items()):
        grid = ranges.grid[keys[0]]
        weights = np.array([[roofline_gemm_us(s) + roofline_comm_us(s) for s in scenarios_of[k]]
                            for k in keys])  # fmt: skip
        mean = (np.stack([ranges.log_ratio[k] for k in keys]) * weights).sum(0) / weights.sum(0)
        fused = mean <= -np.log1p(min_gain)
        if not fused[-1]:
            out[hidden] = None
            continue
        last_serial = np.flatnonzero(~fused)
        out[hidden] = int(grid[last_serial[-1] + 1]) if len(last_serial) else int(grid[0])
    return out


def autoheuristic_module(ranges: FuseRanges, header: dict[str, Any]) -> str:
    """The text of a Python module with ``should_fuse(op, m, n, k) -> bool`` (module docstring)."""
    import pprint

    table = {f"{op}:{n}:{k}": [ranges.starts[(op, n, k)], ranges.fuse[(op, n, k)]]
             for op, n, k in sorted(ranges.starts)}  # fmt: skip
    return f'''"""Fuse/no-fuse decision of PyTorch's micro-pipeline TP pass for one machine, generated by
`ficco export --format autoheuristic` from ficco's model restricted to serial or async-TP.

Device {header["device_name"]}, tp={header["world_size"]}, mode={header["mode"]}, dtype={header["dtype"]};
model {header["model"]["hardware_id"]}/{header["model"]["version"]}. A shape not in RANGES is not fused.
Its evaluation on ficco's data is in HEADER["evaluation"].
"""

import bisect

HEADER = {pprint.pformat(json.loads(json.dumps(header)), width=110, sort_dicts=False)}

RANGES = {pprint.pformat(table, width=110, compact=True)}
"""op:n:k -> (token counts where the decision changes, fuse from each on)."""


def should_fuse(op: str, m: int, n: int, k: int) -> bool:
    """True: run PyTorch's fused async-TP op for this GEMM of m tokens; False: serial."""
    found = RANGES.get(f"{{op}}:{{n}}:{{k}}")
    if found is None:
        return False
    starts, fuse = found
    return fuse[max(0, bisect.bisect_right(starts, m) - 1)]
'''


def fit_async_tp_model(card: dict[str, Any], *, seed: int = 0) -> tuple[Any, Any]:
    """``training.baselines.AsyncTPModel`` (both modes), fitted on the model's training datasets (read from
    the card's paths; ``ExportRefused`` when they are missing or their content hash is not the card's), and
    their table."""
    from ficco.training.baselines import AsyncTPModel
    from ficco.training.table import load_dataset_table

    paths = str(card.get("dataset", {}).get("path", "")).split(" + ")
    missing = [p for p in paths if not Path(p).is_dir()]
    if missing:
        raise ExportRefused(
            f"the drop-in formats fit ficco's async-TP model on the model's training datasets {paths}, and "
            f"{missing} are not here; run the export where they are (the repository root)"
        )
    loaded = load_dataset_table(*paths)
    if loaded.hash != card.get("dataset", {}).get("hash", card.get("dataset_hash")):
        raise ExportRefused(
            f"the datasets {paths} hash to {loaded.hash}, not the card's {card.get('dataset_hash')}: they "
            "changed since the model was trained"
        )
    table = loaded.table
    return AsyncTPModel(seed=seed).fit(table), table


def score_fuse_rule(
    fuse_of: Any, paths: Sequence[str | Path], *, world_size: int, mode: str, dtype: str, training: str
) -> dict[str, Any]:
    """The serial-or-async-TP metrics (``training.evaluate.serial_or_async_tp_score``) of ``fuse_of``
    (scenario -> bool, or None where it has no answer: serial) beside vLLM's rule and the oracle, on each
    dataset of ``paths`` (rows of ``world_size``, ``mode`` and ``dtype`` that measured async-TP)."""
    from ficco.training.evaluate import serial_or_async_tp_score
    from ficco.training.peer_rules import vllm_sp_rule
    from ficco.training.table import load_dataset_table

    out = {}
    for path in paths:
        table = load_dataset_table(path).table
        keep = (table.modes == mode) & np.isfinite(table.async_tp_ms)
        keep &= np.array([s.world_size == world_size and s.dtype == dtype for s in table.scenarios])
        sub = table.subset(keep)
        if not len(sub):
            continue
        answers = [fuse_of(s) for s in sub.scenarios]
        mine = np.array([bool(a) for a in answers])
        with np.errstate(invalid="ignore"):
            oracle = sub.async_tp_ms < sub.serial_ms
        out[str(path)] = {
            "in_training_data": str(path) in training.split(" + "),
            "n_not_covered": sum(a is None for a in answers),
            "this_artifact": serial_or_async_tp_score(sub, mine)[0],
            "vllm_sp_rule": serial_or_async_tp_score(sub, vllm_sp_rule(sub.scenarios))[0],
            "oracle_serial_or_async_tp": serial_or_async_tp_score(sub, oracle)[0],
        }
    return out


def write_vllm(model: Any, ranges: FuseRanges, header: dict[str, Any], out: Path, score_on: Sequence) -> Path:
    """The vLLM thresholds file of one (tp, mode, dtype) (module docstring), evaluated on ``score_on``."""
    from ficco.training.peer_rules import rule_hidden_size

    w, mode, dtype, hw = header["world_size"], header["mode"], header["dtype"], header["hardware_id"]
    scenarios_of = {key: grid_scenarios((*key, 0, 0), ranges.grid[key], world_size=w, dtype=dtype,
                                        hardware_id=hw)[0] for key in ranges.grid}  # fmt: skip
    thresholds = vllm_thresholds(ranges, scenarios_of, model.min_gain_.get(mode, 0.0))

    def fuse_of(s: Scenario) -> bool | None:
        hidden = rule_hidden_size(s)
        if hidden not in thresholds:
            return None
        return thresholds[hidden] is not None and s.m >= thresholds[hidden]

    header["evaluation"] = score_fuse_rule(fuse_of, score_on, world_size=w, mode=mode, dtype=dtype,
                                           training=header["datasets"][0]["path"])  # fmt: skip
    header["replaces"] = (
        "SP_MIN_HIDDEN_SIZE and SP_MIN_PER_GPU_SIZE_MB of vllm/compilation/passes/fusion/"
        "sequence_parallelism.py: get_sequence_parallelism_threshold(hidden_size, tp_size, "
        "element_size) returns thresholds[hidden_size] for this device, tp and dtype (null: off)"
    )
    rows = [{"hidden_size": h, "tp": w, "dtype": dtype, "min_tokens": t} for h, t in thresholds.items()]
    path = out / f"op=sp_async_tp,{artifact_name(header)}.json"
    write_text_atomic(path, json.dumps({**header, "thresholds": rows}, indent=1) + "\n")
    return path


def write_autoheuristic(ranges: FuseRanges, header: dict[str, Any], out: Path, score_on: Sequence) -> Path:
    """The ``should_fuse`` module of one (tp, mode, dtype) (module docstring), evaluated on ``score_on``."""

    def fuse_of(s: Scenario) -> bool | None:
        key = (s.op, s.n, s.k)
        if key not in ranges.starts:
            return None
        return ranges.fuse[key][max(0, bisect.bisect_right(ranges.starts[key], s.m) - 1)]

    header["evaluation"] = score_fuse_rule(
        fuse_of, score_on, world_size=header["world_size"], mode=header["mode"], dtype=header["dtype"],
        training=header["datasets"][0]["path"],
    )  # fmt: skip
    name = f"async_tp_fuse,{artifact_name(header)}".replace("=", "_").replace(",", "__")
    path = out / f"{name}.py"
    write_text_atomic(path, autoheuristic_module(ranges, header))
    return path


def export(
    predictor: Any,
    *,
    out: str | Path,
    shapes: Sequence[Shape],
    world_size: int,
    modes: Sequence[str] = MODES,
    dtype: str = "bf16",
    fmt: str = "tables",
    host_factor: float | None = None,
    allow_simulated: bool = False,
    score_on: Sequence[str | Path] = (),
) -> list[Path]:
    """Write ``fmt`` (:data:`FORMATS`) for every mode of ``modes`` under ``out``; the paths written."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {list(FORMATS)}; got {fmt!r}")
    out = Path(out)
    if fmt == "tables":
        return [
            build_schedule_table(predictor, shapes, world_size=world_size, mode=mode, dtype=dtype,
                                 host_factor=host_factor, allow_simulated=allow_simulated).write(out)
            for mode in modes
        ]  # fmt: skip
    simulated = check_measured(predictor.card, world_size, allow_simulated=allow_simulated)
    factor = predictor.host_factor if host_factor is None else host_factor
    model, _ = fit_async_tp_model(predictor.card)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for mode in modes:
        ranges = fuse_ranges(model, shapes, world_size=world_size, mode=mode, dtype=dtype,
                             hardware_id=predictor.hardware_id, host_factor=factor)  # fmt: skip
        header = export_header(
            predictor, f"ficco-{fmt}", world_size=world_size, mode=mode, dtype=dtype, host_factor=factor,
            simulated=simulated, grid=grid_description(world_size),
        )  # fmt: skip
        header["model"]["async_tp_min_gain"] = model.min_gain_.get(mode, 0.0)
        if fmt == "vllm":
            written.append(write_vllm(model, ranges, header, out, score_on))
        else:
            written.append(write_autoheuristic(ranges, header, out, score_on))
    return written
