"""Writing datasets (``ficco bench``): a measured scenario's rows, atomic writes of parts and manifests,
relabelling a stored dataset, and the per-scenario label table of the card. The format itself (columns,
manifest, label times, reading) is :mod:`ficco.features.dataset`'s, which training reads with too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ficco.features import Scenario
from ficco.features.dataset import (
    BACKENDS,
    BASELINE_KEYS,
    COLUMNS,
    NOISE,
    SCENARIO_COLUMNS,
    read_rows,
    require_manifest,
    with_label_times,
)
from ficco.files import replacing, write_text_atomic
from ficco.harness.backend import ScenarioResult
from ficco.harness.labels import relabel

if TYPE_CHECKING:
    import pandas as pd

PART_METADATA_KEY = "ficco"
"""Key of a part's Parquet key-value metadata (fingerprint, plan hash, code version, shard)."""


def result_rows(
    family: str, scenario: Scenario, result: ScenarioResult, backend: str
) -> list[dict[str, Any]]:
    """Dataset rows (dicts keyed by ``COLUMNS``) for one measured scenario, one per measurement (each
    with the baselines of its mode)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}; got {backend!r}")
    base = {
        "scenario_id": scenario.key(),
        "family": family,
        **scenario.shape_dict(),
        "backend": backend,
        "hardware_id": scenario.hardware.id,
    }
    nan = float("nan")
    return [
        {
            **base,
            **{key: float(result.baselines.get(m.mode, {}).get(key, nan)) for key in BASELINE_KEYS},
            "schedule": m.schedule,
            "mode": m.mode,
            "median_ms": float(m.median_ms) if m.ok else nan,
            "p10_ms": float(m.p10_ms) if m.ok else nan,
            "p90_ms": float(m.p90_ms) if m.ok else nan,
            "round_ms": [float(t) for t in m.round_ms] if m.ok else [],
            "ok": bool(m.ok),
            "error": m.error,
            "in_best_set": bool(m.in_best_set and m.ok),
        }
        for m in result.measurements
    ]


# Manifest -------------------------------------------------------------------------------------------------


def write_parquet_atomic(path: Path, frame: pd.DataFrame, metadata: dict[str, Any] | None = None) -> None:
    """Write the stored ``COLUMNS`` of dataset rows ``frame`` to ``path`` atomically; ``metadata``
    (JSON-serialisable) goes into the file's key-value metadata (read back by :func:`part_metadata`)."""
    with replacing(path) as tmp:
        if metadata is None:
            frame[list(COLUMNS)].to_parquet(tmp, index=False)
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pandas(frame[list(COLUMNS)], preserve_index=False)
        extra = {PART_METADATA_KEY.encode(): json.dumps(metadata, sort_keys=True).encode()}
        pq.write_table(table.replace_schema_metadata({**(table.schema.metadata or {}), **extra}), tmp)


def part_metadata(path: str | Path) -> dict[str, Any] | None:
    """The ``metadata`` a part was written with (:func:`write_parquet_atomic`), or None if none."""
    import pyarrow.parquet as pq

    raw = (pq.read_schema(path).metadata or {}).get(PART_METADATA_KEY.encode())
    return None if raw is None else json.loads(raw)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON to ``path`` so that readers see the old or the new file, never a part."""
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


# Loading ----------------------------------------------------------------------------------------------------


def relabel_dataset(directory: str | Path) -> int:
    """Recompute ``in_best_set`` of dataset ``directory`` (parts and re-measure) under the current label
    rule (``harness.labels.relabel``), rewriting each file that changes; returns how many rows changed."""
    directory = Path(directory)
    files = [directory / p["file"] for p in require_manifest(directory)["parts"]]
    changed = 0
    for path in [*files, directory / NOISE]:
        if not path.exists():
            continue
        stored = read_rows(path)
        fresh = relabel(stored)
        flips = int((fresh["in_best_set"].to_numpy() != stored["in_best_set"].to_numpy()).sum())
        if flips:
            write_parquet_atomic(path, fresh)
            changed += flips
    return changed


def label_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (scenario, mode) with an ok schedule: ``SCENARIO_COLUMNS`` + ``mode``,
    ``best_schedule``, ``best_ms``, ``serial_ms`` (``serial/sm``; NaN if it failed), ``speedup`` (serial over
    best), ``n_ok`` and ``best_set_size`` (schedules with ``in_best_set``).

    Failed schedules are never best; ties go to the schedule listed first (canonical order: serial first).
    Scenarios where every schedule of a mode failed have no label in that mode and are left out.
    """
    import numpy as np
    import pandas as pd

    key = ["scenario_id", "mode"]
    columns = [*SCENARIO_COLUMNS, "mode", "best_schedule", "best_ms", "serial_ms", "speedup", "n_ok"]
    df = with_label_times(df)
    ok = df[df["ok"].astype(bool) & np.isfinite(df["time_ms"].to_numpy(dtype=float))]
    if ok.empty:
        return pd.DataFrame(columns=[*columns, "best_set_size"])
    groups = ok.groupby(key, sort=False)
    best = ok.loc[groups["time_ms"].idxmin()]
    out = best[[*SCENARIO_COLUMNS, "mode"]].copy()
    out["best_schedule"] = best["schedule"].to_numpy()
    out["best_ms"] = best["time_ms"].to_numpy()
    serial = ok[ok["schedule"] == "serial/sm"].set_index(key)["time_ms"]
    index = pd.MultiIndex.from_frame(out[key])
    out["serial_ms"] = serial.reindex(index).to_numpy(dtype=float)
    out["speedup"] = out["serial_ms"] / out["best_ms"]
    out["n_ok"] = groups.size().reindex(index).to_numpy(dtype="int64")
    out["best_set_size"] = groups["in_best_set"].sum().reindex(index).to_numpy(dtype="int64")
    return out.reset_index(drop=True)
