"""The dataset format, its one home: columns, manifest, label times, and reading a dataset.

One Parquet row per (scenario, schedule, mode) in append-only parts listed by a manifest; the harness writes
datasets, training reads them. Loading adds ``time_ms``, the label time (:data:`LABEL_STAT`). See
docs/protocol.md.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ficco.features.hardware import HardwareProfile
from ficco.features.scenario import MODES, SHAPE_FIELDS, Scenario

if TYPE_CHECKING:
    import pandas as pd

BASELINE_KEYS: tuple[str, ...] = ("gemm_alone_ms", "nccl_comm_ms", "dma_comm_ms", "async_tp_ms")
"""Per-scenario reference timings every ``ScenarioResult.baselines`` carries (NaN when not measured)."""
FORMAT = "ficco-dataset/2"
"""Manifest format tag; a different one is refused."""
MANIFEST = "manifest.json"
NOISE = "noise.parquet"
PLAN = "plan.json"
BACKENDS = ("gpu", "gloo", "sim")
HARDWARE_KEYS = ("gpu_name", "gpu_count", "interconnect", "world_size")
"""Fingerprint keys that datasets loaded together must share (with the hardware profile); driver and
software versions may differ."""
GRID_FAMILY = "grid"
"""The ``family`` of a sweep plan's synthetic shape grid (the other families are model-config names)."""

COLUMNS: dict[str, str] = {
    "scenario_id": "str",
    "family": "str",
    **{name: kind.__name__ for name, kind in SHAPE_FIELDS.items()},
    "schedule": "str",
    "mode": "str",
    "median_ms": "float",
    "p10_ms": "float",
    "p90_ms": "float",
    "round_ms": "list",
    "ok": "bool",
    "error": "str",
    "in_best_set": "bool",
    "backend": "str",
    "hardware_id": "str",
    **{key: "float" for key in BASELINE_KEYS},
}
"""Column name -> kind (str, int, float, bool), in file order."""
SCENARIO_COLUMNS = ("scenario_id", "family", *SHAPE_FIELDS, "hardware_id", "backend")
"""The per-scenario columns ``label_table`` keeps."""

LABEL_STAT: dict[str, str] = {"eager": "p10_ms", "graph": "median_ms"}
"""Per mode, the dataset column that is a schedule's time (docs/protocol.md)."""
QUANTILE: dict[str, float] = {"p10_ms": 0.10, "median_ms": 0.50}
"""The quantile over rounds each label column holds (``Measurement.from_rounds``)."""


def label_quantile(mode: str) -> float:
    """The quantile over rounds that is a schedule's time in ``mode`` (``LABEL_STAT``)."""
    try:
        return QUANTILE[LABEL_STAT[mode]]
    except KeyError:
        raise ValueError(f"mode must be one of {list(LABEL_STAT)}; got {mode!r}") from None


def with_label_times(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (dataset rows) with ``time_ms``: each row's label time, its mode's ``LABEL_STAT`` column."""
    time_ms = np.full(len(df), np.nan)
    for mode, column in LABEL_STAT.items():
        rows = (df["mode"] == mode).to_numpy()
        time_ms[rows] = df.loc[rows, column].to_numpy(dtype=float)
    return df.assign(time_ms=time_ms)


def rows_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """A DataFrame with exactly ``COLUMNS``, in order, with their dtypes (an empty list is fine)."""
    import pandas as pd

    kinds = {"str": "object", "int": "int64", "float": "float64", "bool": "bool", "list": "object"}
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    return frame.astype({name: kinds[kind] for name, kind in COLUMNS.items()})


def validate_frame(df: pd.DataFrame, source: str = "dataset") -> pd.DataFrame:
    """``df`` once it has every column of ``COLUMNS`` with the right kind and known backends and modes;
    else ``ValueError`` naming ``source`` and the missing, mistyped or unknown values."""
    from pandas.api import types

    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{source} is missing column(s) {missing}; a dataset has {list(COLUMNS)}")
    checks = {
        "str": lambda s: types.is_string_dtype(s) or types.is_object_dtype(s),
        "int": types.is_integer_dtype,
        "float": types.is_float_dtype,
        "bool": types.is_bool_dtype,
        "list": types.is_object_dtype,
    }
    bad = [f"{c} ({df[c].dtype}, expected {kind})" for c, kind in COLUMNS.items() if not checks[kind](df[c])]
    if bad:
        raise ValueError(f"{source} has column(s) of the wrong dtype: {', '.join(bad)}")
    for column, allowed in (("backend", BACKENDS), ("mode", MODES)):
        unknown = sorted(set(df[column]) - set(allowed))
        if unknown:
            raise ValueError(f"{source} has unknown {column} value(s) {unknown}; allowed: {list(allowed)}")
    return df


# Manifest and loading --------------------------------------------------------------------------------------


def read_manifest(directory: str | Path) -> dict[str, Any] | None:
    """The manifest of dataset ``directory``, or None if it has none; raise ``ValueError`` if unreadable."""
    path = Path(directory) / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path} has format {manifest.get('format')!r}; this ficco reads {FORMAT!r}")
    return manifest


def require_manifest(directory: str | Path) -> dict[str, Any]:
    manifest = read_manifest(directory)
    if manifest is None:
        raise ValueError(
            f"{directory} is not a ficco dataset: it has no {MANIFEST} (run `ficco bench --out`)"
        )
    return manifest


def read_rows(path: Path) -> pd.DataFrame:
    """The dataset rows of one Parquet file, schema-checked (``validate_frame``, naming ``path``)."""
    import pandas as pd

    return validate_frame(pd.read_parquet(path), str(path))


def load_dataset(path: str | Path) -> pd.DataFrame:
    """The measurement rows of a dataset directory (the parts its manifest lists, in order) or of one
    Parquet file, schema-checked (see ``validate_frame``), with their label times (``time_ms``)."""
    import pandas as pd

    path = Path(path)
    if path.is_file():
        return with_label_times(read_rows(path))
    frames = [read_rows(path / p["file"]) for p in require_manifest(path)["parts"]]
    return with_label_times(pd.concat(frames, ignore_index=True) if frames else rows_frame([]))


def load_noise(directory: str | Path) -> pd.DataFrame | None:
    """The re-measured rows of ``directory`` (``noise.parquet``) with their label times, or None if none
    were taken."""
    path = Path(directory) / NOISE
    return with_label_times(read_rows(path)) if path.exists() else None


def dataset_hardware(path: str | Path) -> HardwareProfile:
    """The hardware profile a dataset directory was measured or simulated on (from its manifest)."""
    return HardwareProfile.from_dict(require_manifest(path)["hardware"])


def load_datasets(paths: Sequence[str | Path]) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The measurement rows and the re-measured rows (None if none) of one or more datasets
    (:func:`load_each`), concatenated in the order given."""
    import pandas as pd

    each = load_each(paths)
    noise = [n for _, n in each if n is not None]
    frames = [frame for frame, _ in each]
    return (
        frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True),
        (noise[0] if len(noise) == 1 else pd.concat(noise, ignore_index=True)) if noise else None,
    )


def load_each(paths: Sequence[str | Path]) -> list[tuple[pd.DataFrame, pd.DataFrame | None]]:
    """The measurement rows and re-measured rows (None if none) of each dataset of ``paths``, without their
    ``superseded`` schedules. One path may be a Parquet file; several must be directories of the same
    hardware with no scenario id in common (``ValueError`` names the difference)."""
    if not paths:
        raise ValueError("no dataset given; pass at least one dataset directory")
    if len(paths) == 1 and not Path(paths[0]).is_dir():
        return [(load_dataset(paths[0]), None)]
    check_same_hardware(paths)
    frames = [_current(load_dataset(p), p) for p in paths]
    for i, frame in enumerate(frames):
        for j in range(i):
            shared = sorted(set(frames[j]["scenario_id"]) & set(frame["scenario_id"]))
            if shared:
                raise ValueError(
                    f"{paths[j]} and {paths[i]} share {len(shared)} scenario id(s), e.g. {shared[:3]}; "
                    "each scenario must come from one dataset (a second sweep of the same scenarios is a "
                    "repeat: load_repeats)"
                )
    return [(frame, _current(load_noise(p), p)) for frame, p in zip(frames, paths, strict=True)]


def load_repeats(rows: pd.DataFrame, paths: Sequence[str | Path], like: str | Path) -> list[pd.DataFrame]:
    """The rows of repeat sweeps ``paths`` (independent re-measures of scenarios ``rows`` holds, on the
    hardware of dataset ``like``), one frame per sweep without its ``superseded`` schedules; ``ValueError``
    for a repeat of other hardware or one holding scenarios ``rows`` lacks."""
    out = []
    known = set(rows["scenario_id"])
    for path in paths:
        check_same_hardware([like, path])
        frame = _current(load_dataset(path), path)
        extra = sorted(set(frame["scenario_id"]) - known)
        if extra:
            raise ValueError(
                f"repeat {path} holds {len(extra)} scenario id(s) the datasets do not, e.g. {extra[:3]}; a "
                "repeat sweep only re-measures their scenarios"
            )
        out.append(frame)
    return out


def superseded(directory: str | Path) -> dict[str, str]:
    """The schedules dataset ``directory``'s manifest marks as measured with a replaced executor -> why."""
    return dict(require_manifest(directory).get("superseded", {}))


def _current(frame: pd.DataFrame | None, directory: str | Path) -> pd.DataFrame | None:
    """``frame`` without the rows of the schedules ``directory`` lists as superseded."""
    gone = superseded(directory)
    if frame is None or not gone:
        return frame
    return frame[~frame["schedule"].isin(list(gone))].reset_index(drop=True)


def hardware_identity(directory: str | Path) -> dict[str, Any]:
    """What datasets loaded together must share: the fingerprint's ``HARDWARE_KEYS`` and every field of
    the hardware profile, as ``fingerprint.<key>`` / ``hardware.<key>`` -> value (absent keys: None)."""
    manifest = require_manifest(directory)
    fingerprint = manifest.get("fingerprint", {})
    return {
        **{f"fingerprint.{key}": fingerprint.get(key) for key in HARDWARE_KEYS},
        **{f"hardware.{key}": value for key, value in manifest["hardware"].items()},
    }


def check_same_hardware(paths: Sequence[str | Path]) -> None:
    """Raise ``ValueError`` naming every key of :func:`hardware_identity` on which a dataset of ``paths``
    differs from the first, with both values."""
    first = hardware_identity(paths[0])
    for path in paths[1:]:
        other = hardware_identity(path)
        diffs = [
            f"{key} {first.get(key)!r} in {paths[0]} vs {other.get(key)!r} in {path}"
            for key in sorted(set(first) | set(other))
            if first.get(key) != other.get(key)
        ]
        if diffs:
            raise ValueError(
                f"datasets measured on different hardware cannot be combined: {'; '.join(diffs)}"
            )


def dataset_hash(path: str | Path) -> str:
    """SHA-256 of the measurement rows, independent of part boundaries and row order."""
    return frame_hash(load_dataset(path))


def frame_hash(df: pd.DataFrame) -> str:
    """SHA-256 of measurement rows ``df`` (their stored ``COLUMNS``), independent of row order (see
    :func:`dataset_hash`)."""
    df = df[list(COLUMNS)].sort_values(["scenario_id", "mode", "schedule"], kind="stable")
    df["round_ms"] = [" ".join(f"{t:.9g}" for t in r) for r in df["round_ms"]]
    text = df.to_csv(index=False, float_format="%.9g", lineterminator="\n")
    return hashlib.sha256(text.encode()).hexdigest()


def scenario_from_row(row: Any, hardware: HardwareProfile) -> Scenario:
    """Rebuild the ``Scenario`` of a dataset row (a Series, a namedtuple from ``itertuples`` or a dict)."""
    # A namedtuple needs getattr; a Series or dict needs [] (Series.dtype is an attribute of its own).
    get = (lambda key: getattr(row, key)) if hasattr(row, "_fields") else row.__getitem__
    return Scenario(hardware=hardware, **{name: kind(get(name)) for name, kind in SHAPE_FIELDS.items()})


def host_factor_of(df: pd.DataFrame) -> float:
    """The measuring machine's host factor (``features.launch_cost.estimate_host_factor``) from dataset rows:
    the eager and graph times of each (scenario, schedule) measured ok in both modes against its host price;
    NaN when no eager time is host-bound."""
    from ficco.features import SCHEDULE_INDEX
    from ficco.features.launch_cost import estimate_host_factor, op_prices

    timed = with_label_times(df[df["ok"].astype(bool)])
    keys = ["scenario_id", "schedule", "op", "world_size", "experts"]
    pairs = timed[timed["mode"] == "eager"][[*keys, "time_ms"]].merge(
        timed[timed["mode"] == "graph"][["scenario_id", "schedule", "time_ms"]],
        on=["scenario_id", "schedule"], suffixes=("_eager", "_graph"),
    )  # fmt: skip
    price = np.array([
        op_prices(op, int(world), int(experts))[SCHEDULE_INDEX[schedule]]
        for op, world, experts, schedule in zip(
            pairs["op"], pairs["world_size"], pairs["experts"], pairs["schedule"], strict=True
        )
    ])  # fmt: skip
    return estimate_host_factor(pairs["time_ms_eager"].to_numpy(), pairs["time_ms_graph"].to_numpy(), price)
