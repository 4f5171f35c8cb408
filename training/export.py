"""``ficco export``: a model's picks as schedule tables runtimes load (``features.schedule_table``).

:func:`build_schedule_table` asks the model, one split class at a time, next to every point of
:func:`token_grid` and between neighbouring counts whose answers differ, with numpy and the model alone (the
service's ``/v1/tables`` builds here too). :class:`ExportRefused`: a world size the model was not trained
at, or simulated training data without ``allow_simulated``. The grid tables the service's ``GET`` serves
(:func:`grid_requests`) can be written into the model's registry folder (:func:`write_grid_tables`,
``ficco export --into-model``), where the service finds them ready (:func:`read_grid_table`). The drop-in
artifacts (``--format vllm|autoheuristic``) are ``training.dropin``'s. See docs/tables.md.
"""

from __future__ import annotations

import bisect
import gzip
import itertools
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from ficco.features import DENSE_OPS, DTYPES, KNOWN_HARDWARE, MODES, HardwareProfile, Scenario, feature_matrix
from ficco.features.provenance import SIMULATED, registry_id
from ficco.features.schedule import FINER_SPLITS, max_splits, range_starts
from ficco.features.schedule_table import (
    BEST_SET_FLOOR,
    FORMAT,
    FORMAT_VERSION,
    Entry,
    Range,
    ScheduleTableFile,
    Track,
    artifact_name,
    hardware_fingerprint,
)
from ficco.files import replacing
from ficco.training.predict.coverage import NEIGHBOUR_FACTOR, OFF_MAP_BELOW, off_map
from ficco.training.predict.pairs import SCHEDULES, SERIAL_INDEX

log = logging.getLogger(__name__)

Shape = tuple[str, int, int, int, int]
"""``(op, n, k, experts, top_k)``: what a table entry is keyed by (experts and top_k 0 for dense ops)."""
PER_OCTAVE = 16
"""Grid points per doubling of the token count above :data:`FINE_BELOW`: consecutive points differ by at
most 1/16 (6.25%) of the smaller."""
FINE_BELOW = 64
"""Below this many tokens (decode batches) the grid holds every token count."""
MAX_STEP = 512
"""Most tokens between two grid points (the top octaves' steps: the model's picks follow GEMM waves of a
few hundred rows, which a step of 1/16 of 32k tokens would straddle)."""
MAX_TOKENS = 65536
"""The grid's last token count: the largest of the datasets; a lookup above it gets the last range."""
DECIDE_ROWS = 4096
"""Token counts the model is asked at per call (bounds the pair matrix to about 25 MB)."""
SPLIT_CLASSES: tuple[int, ...] = tuple(sorted((1, *FINER_SPLITS), reverse=True))
"""The split classes of a table's tracks, largest first (``features.schedule.max_splits``)."""
BUILD_VERSION = 2
"""What :func:`build_schedule_table` writes for one model and request, versioned (the header's
``build_version``): bump it with a change that moves a table of the same model (the grid, the refinement,
the decision policy's rules). 2: the guard against picks predicted slower than serial and the /hp tie rule
(``training.predict.policy``). A grid table shipped with a model under another build version is rebuilt,
not served (:func:`read_grid_table`), and the service's ETags carry it."""
GRID_TABLES_DIR = "tables"
"""The folder of a registered model version (``<root>/<hardware>/<version>/``) its grid tables are written
into (:func:`write_grid_tables`)."""


class ExportRefused(ValueError):
    """An export the model cannot back with its training data."""


class InvalidShapes(ValueError):
    """Shapes no table can be built for; ``errors`` holds ``(index, shape, why)`` of each."""

    def __init__(self, errors: list[tuple[int, Shape, str]]) -> None:
        self.errors = errors
        listed = "; ".join(f"{':'.join(map(str, shape))}: {why}" for _, shape, why in errors[:3])
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        super().__init__(f"{len(errors)} shape(s) cannot be tabled: {listed}{more}")


def token_grid(world_size: int, *, per_octave: int = PER_OCTAVE, max_tokens: int = MAX_TOKENS) -> np.ndarray:
    """Token counts the drop-in artifacts are decided at (a schedule table's tracks next to them), sorted int
    ``[G]``, multiples of ``world_size``: every one below :data:`FINE_BELOW`, then ``per_octave`` points per
    doubling (steps of ``b / per_octave`` in ``[b, 2b)``, at most :data:`MAX_STEP`) up to ``max_tokens``."""
    points = list(range(world_size, FINE_BELOW, world_size))
    base = FINE_BELOW
    while base < max_tokens:
        step = max(world_size, min(base // per_octave, MAX_STEP))
        points += range(base, min(2 * base, max_tokens + 1), step)
        base *= 2
    points.append(max_tokens)
    grid = np.unique(np.asarray(points, dtype=np.int64) // world_size * world_size)
    return grid[grid >= world_size]


def grid_description(world_size: int, per_octave: int = PER_OCTAVE, max_tokens: int = MAX_TOKENS) -> dict:
    """How a table's token counts are chosen and looked up, for its header."""
    return {
        "every_count_below": FINE_BELOW,
        "points_per_octave": per_octave,
        "max_tokens": max_tokens,
        "n_points": len(token_grid(world_size, per_octave=per_octave, max_tokens=max_tokens)),
        "rule": f"per split class (the largest of {list(SPLIT_CLASSES)} finer sub-chunks the rows divide "
        f"into among {world_size} ranks), the class's token count at or above every count below "
        f"{FINE_BELOW} and {per_octave} points per doubling up to {max_tokens}, and between two counts whose "
        "answers differ, the counts half-way between until the two are neighbours in the class",
        "lookup": "the track of m's split class (rows = m, MoE m * top_k; the largest s of "
        f"{list(SPLIT_CLASSES)} with rows % (world_size * s) == 0), then the range of its largest breakpoint "
        f"<= m (the first range below the first breakpoint; above {max_tokens}: the last range)",
    }


# What the model is and where it was trained ------------------------------------------------------------


def training_fingerprint(card: dict[str, Any]) -> dict[str, Any]:
    """The :data:`FINGERPRINT_KEYS` of the machine the model's data come from, from its card: ``gpu`` for
    GPU measurements (``sim`` otherwise), its GPU name and count."""
    backend = "gpu" if card.get("dataset", {}).get("backends") == ["gpu"] else "sim"
    hw = card["hardware"]
    return {"backend": backend, "gpu_name": hw["gpu_name"], "gpu_count": int(hw["gpu_count"])}


def trained_world_sizes(card: dict[str, Any]) -> tuple[int, ...]:
    """The world sizes a model was trained at: its card's ``world_sizes``, else its hardware's GPU count
    (the models registered before the field was recorded measured their whole machine)."""
    recorded = card.get("world_sizes")
    return tuple(int(w) for w in recorded) if recorded else (int(card["hardware"]["gpu_count"]),)


def check_measured(card: dict[str, Any], world_size: int, *, allow_simulated: bool) -> bool:
    """Whether an export at ``world_size`` is simulated (allowed by ``allow_simulated``); else
    :class:`ExportRefused` naming why: a world size the model was not trained at (whatever the flag), or
    training data that are not GPU measurements."""
    model = f"model {card['hardware_id']}/{card['version']}"
    sizes = trained_world_sizes(card)
    if world_size not in sizes:
        gpu = card["hardware"]["gpu_name"]
        fits = sorted((p.gpu_count, p.id) for p in KNOWN_HARDWARE.values()
                      if p.gpu_name == gpu and p.gpu_count >= world_size)  # fmt: skip
        target = fits[0][1] if fits else f"<a profile of {world_size} {gpu}>"
        raise ExportRefused(
            f"{model} was trained at world sizes {list(sizes)}, not {world_size}: a table never extrapolates "
            f"past them (--tp {' or '.join(map(str, sizes))}). Measure {world_size} GPUs (`ficco retrain "
            f"--hardware {target} --tp {world_size}` on such a machine), or train a simulated model "
            f"(`ficco retrain --backend sim --hardware {target} --tp {world_size}`) and export it with "
            f"`--hardware {registry_id(target, SIMULATED)} --allow-simulated`"
        )
    backends = card.get("dataset", {}).get("backends", [])
    if backends != ["gpu"] and not allow_simulated:
        raise ExportRefused(
            f"{model} cannot back a table: its training data come from backends {backends}, not GPU "
            "measurements. Measure this machine (`ficco retrain`), or pass --allow-simulated to export "
            "tables marked simulated"
        )
    return backends != ["gpu"]


def export_header(
    predictor: Any, fmt: str, *, world_size: int, mode: str, dtype: str, host_factor: float, simulated: bool,
    grid: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """The header every export file carries: format, device, (world size, mode, dtype), the hardware
    fingerprint, whether simulated, the model, its training datasets, the grid and the time."""
    card = predictor.card
    fields = training_fingerprint(card)
    data = card.get("dataset", {})
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
        "model": {
            "hardware_id": predictor.hardware_id,
            "version": predictor.version,
            "feature_schema": predictor.feature_schema,
            "objective": card.get("objective"),
            "policy": card.get("policy"),
            "host_factor": host_factor,
            "coverage": getattr(predictor, "coverage", None) is not None,
        },
        # the training datasets and their content hash (the card's: training.dataset_table.LoadedDataset.hash)
        "datasets": [{"path": data.get("path"), "hash": data.get("hash", card.get("dataset_hash"))}],
        "grid": grid,
        "neighbours": {"factor": NEIGHBOUR_FACTOR, "off_map_below": OFF_MAP_BELOW[mode]},
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "build_version": BUILD_VERSION,
    }


# Shapes ---------------------------------------------------------------------------------------------


def config_shapes(
    paths: Sequence[str | Path], *, tp: int, dtype: str, hardware: HardwareProfile
) -> list[Shape]:
    """Every (op, n, k, experts, top_k) of the layers of the Hugging Face configs in ``paths`` (files or
    directories, ``features.model_config``) at tensor-parallel degree ``tp``."""
    from ficco.features.model_config import config_paths, layer_pairs, load_model_config

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
    return [(op, n, k, 0, 0) for op in DENSE_OPS for n in GRID_SIZES for k in GRID_SIZES]


def trained_dtypes(predictor: Any) -> tuple[str, ...]:
    """The dtypes of a model's training rows (its coverage's; bf16 for a model without one)."""
    coverage = getattr(predictor, "coverage", None)
    if coverage is None or not len(coverage):
        return ("bf16",)
    return tuple(DTYPES[i] for i in sorted(set(coverage.rows[:, 3].tolist())))


def grid_requests(predictor: Any) -> list[dict[str, Any]]:
    """The grid tables a model serves (the service's ``GET /v1/tables``): per world size it was trained at,
    mode and training dtype, ``{"tp", "mode", "dtype", "allow_simulated"}`` (simulated models: True)."""
    simulated = predictor.card.get("dataset", {}).get("backends") != ["gpu"]
    return [
        {"tp": tp, "mode": mode, "dtype": dtype, "allow_simulated": simulated}
        for tp in trained_world_sizes(predictor.card)
        for mode in MODES
        for dtype in trained_dtypes(predictor)
    ]


def dataset_shapes(paths: Sequence[str | Path], *, tp: int, dtype: str) -> list[Shape]:
    """Every (op, n, k, experts, top_k) of the datasets in ``paths`` at world size ``tp`` and ``dtype``,
    each dataset read on its own (datasets that share scenarios give their shapes once)."""
    from ficco.features.dataset import load_datasets

    shapes: set[Shape] = set()
    for path in paths:
        df, _ = load_datasets([Path(path)])
        df = df[(df["world_size"] == tp) & (df["dtype"] == dtype)]
        keys = df[["op", "n", "k", "experts", "top_k"]].drop_duplicates().itertuples(index=False)
        shapes |= {(str(op), int(n), int(k), int(e), int(t)) for op, n, k, e, t in keys}
    return sorted(shapes)


def check_shapes(shapes: Sequence[Shape], *, world_size: int, dtype: str, hardware: HardwareProfile,
                 ops: Sequence[str]) -> None:  # fmt: skip
    """:class:`InvalidShapes` naming every shape of an op outside ``ops`` (the model's measured ops) or that
    no scenario of ``world_size`` and ``dtype`` on ``hardware`` can have (``features.Scenario``'s rules)."""
    errors = []
    for i, shape in enumerate(shapes):
        op, n, k, experts, top_k = shape
        try:
            Scenario(op=op, m=16 * world_size, n=n, k=k, dtype=dtype, world_size=world_size,
                     hardware=hardware, experts=experts, top_k=top_k)  # fmt: skip
        except (ValueError, TypeError) as err:
            errors.append((i, shape, str(err)))
            continue
        if op not in ops:
            errors.append((i, shape, f"the model has no measured data for op {op!r} (it has {list(ops)})"))
    if errors:
        raise InvalidShapes(errors)


def grid_scenarios(shape: Shape, grid: np.ndarray, *, world_size: int, dtype: str, hardware: HardwareProfile):
    """The scenarios of ``shape`` at every token count of ``grid`` it can run (MoE: ``m * top_k``
    divisible by the world size), and those token counts."""
    op, n, k, experts, top_k = shape
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


def class_residues(world_size: int, top_k: int) -> tuple[int, dict[int, list[int]]]:
    """The period ``P`` of the split classes over token counts (``16 * world_size``: rows split at most 8
    ways per rank) and, per class, the token counts ``m mod P`` in it, sorted (a scenario's rows divide
    among the ranks; MoE rows are ``m * top_k``)."""
    period = 2 * max(FINER_SPLITS) * world_size
    rows = [m * (top_k or 1) for m in range(period)]
    classes = [max_splits(r, world_size) if r % world_size == 0 else 0 for r in rows]  # 0: no scenario
    return period, {c: [m for m, found in enumerate(classes) if found == c] for c in SPLIT_CLASSES}


def next_in_class(x: int, period: int, residues: list[int]) -> int:
    """The smallest token count ``>= x`` whose residue mod ``period`` is one of ``residues`` (sorted)."""
    base, rest = divmod(x, period)
    i = bisect.bisect_left(residues, rest)
    return base * period + (residues[i] if i < len(residues) else period + residues[0])


def track_points(shape: Shape, world_size: int, *, per_octave: int, max_tokens: int) -> dict[int, list[int]]:
    """Per split class of ``shape``'s token counts, the counts it is first decided at: the class's count at
    or above every count below :data:`FINE_BELOW` and every :func:`token_grid` point, sorted."""
    period, residues = class_residues(world_size, shape[4])
    grid = token_grid(world_size, per_octave=per_octave, max_tokens=max_tokens).tolist()
    base = [*range(1, FINE_BELOW), *grid]
    return {c: sorted({next_in_class(x, period, r) for x in base}) for c, r in residues.items() if r}


@dataclass(eq=False)
class _Track:
    """One (shape, split class) while it is decided: the token counts asked and the answers."""

    shape: Shape
    max_splits: int
    period: int
    residues: list[int]
    """The class's token counts mod ``period``, sorted (:func:`class_residues`)."""
    answers: dict[int, tuple[int, np.ndarray, int]] = field(default_factory=dict)
    """Token count -> (recommended column, predicted speedups ``[S]``, neighbours; -1: not counted)."""

    def between(self, lo: int, hi: int) -> int | None:
        """A token count of this class strictly between ``lo`` and ``hi`` near half-way, or None."""
        for x in ((lo + hi) // 2, lo + 1):
            m = next_in_class(x, self.period, self.residues)
            if lo < m < hi:
                return m
        return None

    def key(self, m: int, mode: str) -> tuple[int, bool]:
        """What a range holds alike at token count ``m``: the pick, and whether it is off the measured map."""
        final, _, near = self.answers[m]
        return final, near >= 0 and off_map(near, mode)


def _ask(predictor: Any, asks: list[tuple[_Track, int]], *, world_size: int, mode: str, dtype: str,
         hardware: HardwareProfile, host_factor: float) -> None:  # fmt: skip
    """Decide every (track, token count) of ``asks`` into the tracks' answers, in batches of
    :data:`DECIDE_ROWS`."""
    coverage = getattr(predictor, "coverage", None)
    for start in range(0, len(asks), DECIDE_ROWS):
        part = asks[start : start + DECIDE_ROWS]
        scenarios = [
            Scenario(op=t.shape[0], m=m, n=t.shape[1], k=t.shape[2], dtype=dtype, world_size=world_size,
                     hardware=hardware, experts=t.shape[3], top_k=t.shape[4])
            for t, m in part
        ]  # fmt: skip
        d = predictor.decide(feature_matrix(scenarios), [mode] * len(part), host_factor=host_factor)
        near = np.full(len(part), -1)
        if coverage is not None:
            by_shape: dict[Shape, list[int]] = {}
            for i, (t, _) in enumerate(part):
                by_shape.setdefault(t.shape, []).append(i)
            for (op, n, k, _, _), index in by_shape.items():
                ms = np.array([part[i][1] for i in index])
                near[index] = coverage.count_tokens(op, mode, world_size, dtype, n, k, ms)
        for i, (t, m) in enumerate(part):
            t.answers[m] = (int(d.final[i]), d.speedups[i], int(near[i]))


def track_of(track: _Track, mode: str) -> Track:
    """The :class:`features.schedule_table.Track` of a decided track: ranges where the pick or whether it
    is off the measured map changes (``features.schedule.range_starts``), each with its stats."""
    ms = sorted(track.answers)
    final = np.array([track.answers[m][0] for m in ms])
    speedups = np.stack([track.answers[m][1] for m in ms])
    near = np.array([track.answers[m][2] for m in ms])
    rows = np.arange(len(ms))
    pick = np.where(final == SERIAL_INDEX, 1.0, speedups[rows, final])
    others = speedups.copy()
    others[rows, final] = np.nan
    others = np.where(np.isnan(others), -np.inf, others)
    runner = others.argmax(axis=1)
    runner_speedup = others[rows, runner]
    margin = np.where(np.isfinite(runner_speedup), pick / runner_speedup - 1.0, np.inf)
    firsts, starts = range_starts(ms, [track.key(m, mode) for m in ms])
    ranges = []
    for a, b in zip(firsts, [*firsts[1:], len(ms)], strict=True):
        low = float(margin[a:b].min())
        ranges.append(
            Range(
                schedule=SCHEDULES[final[a]],
                predicted_speedup=round(float(pick[a]), 4),
                min_speedup=round(float(pick[a:b].min()), 4),
                runner_up=SCHEDULES[runner[a]] if np.isfinite(runner_speedup[a]) else None,
                margin=round(low, 4) if np.isfinite(low) else 1e9,
                confident=bool(low >= BEST_SET_FLOOR),
                neighbours=int(near[a:b].min()) if near[a] >= 0 else None,
            )
        )
    return Track(max_splits=track.max_splits, breakpoints=tuple(starts), ranges=tuple(ranges))


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
    """The schedule table of ``predictor`` (a ``training.predict.predictor.Predictor``) for ``shapes`` in one
    (world size, mode, dtype), on a machine of ``host_factor`` (None: the model's training data's). Raises
    :class:`ExportRefused` (:func:`check_measured`), :class:`InvalidShapes` (:func:`check_shapes`) and
    ``ValueError`` for an unknown mode or no shapes."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}; got {mode!r}")
    if not shapes:
        raise ValueError("no shapes to export: give model configs, datasets or --shape op:n:k")
    card = predictor.card
    simulated = check_measured(card, world_size, allow_simulated=allow_simulated)
    hardware = predictor.profile
    check_shapes(shapes, world_size=world_size, dtype=dtype, hardware=hardware,
                 ops=card.get("ops") or DENSE_OPS)  # fmt: skip
    factor = predictor.host_factor if host_factor is None else host_factor
    settings = dict(world_size=world_size, mode=mode, dtype=dtype, hardware=hardware, host_factor=factor)
    tracks, asks = [], []
    for shape in dict.fromkeys(shapes):
        period, residues = class_residues(world_size, shape[4])
        for c, points in track_points(
            shape, world_size, per_octave=per_octave, max_tokens=max_tokens
        ).items():
            track = _Track(shape=shape, max_splits=c, period=period, residues=residues[c])
            tracks.append(track)
            asks += [(track, m) for m in points]
    _ask(predictor, asks, **settings)
    # between neighbours whose answers differ, ask half-way until they are neighbours in their class
    pending = []
    for t in tracks:
        ms = sorted(t.answers)
        pending += [(t, a, b) for a, b in itertools.pairwise(ms) if t.key(a, mode) != t.key(b, mode)]
    while pending:
        halves = [(t, lo, t.between(lo, hi), hi) for t, lo, hi in pending]
        halves = [h for h in halves if h[2] is not None]
        _ask(predictor, [(t, mid) for t, _, mid, _ in halves], **settings)
        pending = [(t, a, b) for t, lo, mid, hi in halves for a, b in ((lo, mid), (mid, hi))
                   if t.key(a, mode) != t.key(b, mode)]  # fmt: skip
    entries: dict[Shape, list[Track]] = {}
    for track in tracks:
        entries.setdefault(track.shape, []).append(track_of(track, mode))
    grid = grid_description(world_size, per_octave, max_tokens)
    header = export_header(predictor, FORMAT, world_size=world_size, mode=mode, dtype=dtype,
                           host_factor=factor, simulated=simulated, grid=grid)  # fmt: skip
    table = {
        shape: Entry(op=shape[0], n=shape[1], k=shape[2], experts=shape[3], top_k=shape[4], tracks=tuple(ts))
        for shape, ts in entries.items()
    }
    return ScheduleTableFile(header=header, entries=table)


def packed(table: ScheduleTableFile) -> bytes:
    """A table as the service keeps and sends it: compact JSON, gzip-compressed (level 6, no timestamp)."""
    text = json.dumps(table.to_dict(), separators=(",", ":"))
    return gzip.compress(text.encode(), compresslevel=6, mtime=0)


def grid_table_path(version_dir: str | Path, predictor: Any, *, tp: int, mode: str, dtype: str) -> Path:
    """Where :func:`write_grid_tables` puts one grid table of the model registered in ``version_dir``."""
    name = artifact_name({"device_name": predictor.card["hardware"]["gpu_name"], "world_size": tp,
                          "mode": mode, "dtype": dtype})  # fmt: skip
    return Path(version_dir) / GRID_TABLES_DIR / f"op=tp_overlap,{name}.json.gz"


def write_grid_tables(predictor: Any, version_dir: str | Path) -> list[Path]:
    """Build every grid table of ``predictor`` (:func:`grid_requests`) and write each, :func:`packed`, into
    the model's registry folder ``version_dir``; the paths written."""
    paths = []
    for request in grid_requests(predictor):
        tp, mode, dtype = request["tp"], request["mode"], request["dtype"]
        table = build_schedule_table(predictor, grid_shapes(), world_size=tp, mode=mode, dtype=dtype,
                                     allow_simulated=request["allow_simulated"])  # fmt: skip
        path = grid_table_path(version_dir, predictor, tp=tp, mode=mode, dtype=dtype)
        path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(path) as tmp:
            tmp.write_bytes(packed(table))
        log.info("wrote %s", path)
        paths.append(path)
    return paths


def read_grid_table(
    version_dir: str | Path, predictor: Any, *, tp: int, mode: str, dtype: str
) -> bytes | None:
    """The grid table (:func:`packed`) written into the registry folder ``version_dir`` of ``predictor`` by
    :func:`write_grid_tables`, when it is the one :func:`build_schedule_table` would build now: the same
    model version, request, shapes and :data:`BUILD_VERSION`; None otherwise (absent, unreadable, stale)."""
    path = grid_table_path(version_dir, predictor, tp=tp, mode=mode, dtype=dtype)
    try:
        data = path.read_bytes()
        table = json.loads(gzip.decompress(data))
    except (OSError, ValueError, EOFError) as err:
        if path.exists():
            log.warning("%s cannot be read (%s); the table is built instead", path, err)
        return None
    found = (table.get("build_version"), table.get("model", {}).get("version"), table.get("world_size"),
             table.get("mode"), table.get("dtype"))  # fmt: skip
    wanted = (BUILD_VERSION, predictor.version, tp, mode, dtype)
    shapes = {
        (e["op"], e["n"], e["k"], e.get("experts", 0), e.get("top_k", 0)) for e in table.get("entries", [])
    }
    if found != wanted or shapes != set(grid_shapes()):
        log.warning("%s was built for %s, not %s (or for other shapes); the table is built instead", path,
                    found, wanted)  # fmt: skip
        return None
    return data


def export(
    predictor: Any,
    *,
    out: str | Path,
    shapes: Sequence[Shape],
    world_size: int,
    modes: Sequence[str] = MODES,
    dtype: str = "bf16",
    host_factor: float | None = None,
    allow_simulated: bool = False,
) -> list[Path]:
    """Write the schedule table of every mode of ``modes`` under ``out`` (:func:`build_schedule_table`);
    the paths written."""
    return [
        build_schedule_table(predictor, shapes, world_size=world_size, mode=mode, dtype=dtype,
                             host_factor=host_factor, allow_simulated=allow_simulated).write(Path(out))
        for mode in modes
    ]  # fmt: skip
