"""``ficco export --format vllm|autoheuristic``: ficco's model restricted to serial or PyTorch async-TP, as
drop-in artifacts for runtimes that can only choose between the two (``docs/tables.md``).

- ``vllm``: per (hidden size, tp, dtype) the fewest tokens from which PyTorch async-TP is predicted faster
  than serial for the hidden size's GEMMs from there on, the numbers that replace vLLM's
  ``SP_MIN_HIDDEN_SIZE`` and ``SP_MIN_PER_GPU_SIZE_MB`` for this machine (None: never).
- ``autoheuristic``: a plain Python module, ``should_fuse(op, m, n, k) -> bool``, the fuse/no-fuse decision
  of PyTorch's micro-pipeline pass, from the same model per (op, n, k) over the token grid.

Both come from ``training.baselines.AsyncTPModel`` (what ``ficco evaluate`` scores as
``ficco_async_tp_threshold``) fitted on the model's own training datasets, and carry in their header their
evaluation on ficco's data next to vLLM's rule and the per-scenario oracle. Training code (scikit-learn,
pandas): the schedule tables (``training.export``) need neither.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ficco.features import HardwareProfile, Scenario, feature_matrix, roofline_comm_us, roofline_gemm_us
from ficco.features.schedule_table import artifact_name
from ficco.files import write_text_atomic
from ficco.training.export import (
    ExportRefused,
    Shape,
    check_measured,
    export_header,
    grid_description,
    grid_scenarios,
    token_grid,
)


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
                hardware: HardwareProfile, host_factor: float) -> FuseRanges:  # fmt: skip
    """``model`` (a fitted ``training.baselines.AsyncTPModel``) over the token grid of every dense shape."""
    grid = token_grid(world_size)
    starts, fuse, ratios, grids = {}, {}, {}, {}
    for shape in shapes:
        if shape[3]:  # MoE: PyTorch has no async-TP for an all-to-all
            continue
        scs, ms = grid_scenarios(shape, grid, world_size=world_size, dtype=dtype, hardware=hardware)
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
    from ficco.training.dataset_table import load_dataset_table

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
    from ficco.training.dataset_table import load_dataset_table
    from ficco.training.evaluate import serial_or_async_tp_score
    from ficco.training.peer_rules import vllm_sp_rule

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


def write_vllm(model: Any, ranges: FuseRanges, header: dict[str, Any], out: Path, score_on: Sequence,
               hardware: HardwareProfile) -> Path:  # fmt: skip
    """The vLLM thresholds file of one (tp, mode, dtype) (module docstring), evaluated on ``score_on``."""
    from ficco.training.peer_rules import rule_hidden_size

    w, mode, dtype = header["world_size"], header["mode"], header["dtype"]
    scenarios_of = {key: grid_scenarios((*key, 0, 0), ranges.grid[key], world_size=w, dtype=dtype,
                                        hardware=hardware)[0] for key in ranges.grid}  # fmt: skip
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


def write_dropin(
    predictor: Any,
    fmt: str,
    *,
    out: Path,
    shapes: Sequence[Shape],
    world_size: int,
    modes: Sequence[str],
    dtype: str,
    host_factor: float | None,
    allow_simulated: bool,
    score_on: Sequence[str | Path],
) -> list[Path]:
    """Write the ``fmt`` (``vllm`` or ``autoheuristic``) file of every mode of ``modes`` under ``out``."""
    if fmt not in ("vllm", "autoheuristic"):
        raise ValueError(f"a drop-in format is vllm or autoheuristic; got {fmt!r}")
    simulated = check_measured(predictor.card, world_size, allow_simulated=allow_simulated)
    factor = predictor.host_factor if host_factor is None else host_factor
    model, _ = fit_async_tp_model(predictor.card)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for mode in modes:
        ranges = fuse_ranges(model, shapes, world_size=world_size, mode=mode, dtype=dtype,
                             hardware=predictor.profile, host_factor=factor)  # fmt: skip
        header = export_header(
            predictor, f"ficco-{fmt}", world_size=world_size, mode=mode, dtype=dtype, host_factor=factor,
            simulated=simulated, grid=grid_description(world_size),
        )  # fmt: skip
        header["model"]["async_tp_min_gain"] = model.min_gain_.get(mode, 0.0)
        if fmt == "vllm":
            written.append(write_vllm(model, ranges, header, out, score_on, predictor.profile))
        else:
            written.append(write_autoheuristic(ranges, header, out, score_on))
    return written
