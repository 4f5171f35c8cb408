"""The dataset table: a measured dataset reshaped to one row per (scenario, mode), the form training needs.

The columns of ``times_ms`` are every schedule in canonical order (serial/sm first), NaN where the schedule
was not measured, failed or cannot run; a scenario's label is its fastest measured schedule (ties: the
canonical order, so serial wins a tie).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ficco.features import MOE_OPS, HardwareProfile, Scenario, feature_matrix
from ficco.features.dataset import (
    dataset_hardware,
    frame_hash,
    host_factor_of,
    load_each,
    load_repeats,
    read_manifest,
    scenario_from_row,
    with_label_times,
)
from ficco.features.label_source import LabelSource, label_source, same_times
from ficco.training.model import SCHEDULES, SERIAL_INDEX, schedule_indices

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class DatasetTable:
    """Per-(scenario, mode) arrays of a dataset. ``n`` rows, ``S = len(SCHEDULES)`` schedules."""

    scenario_ids: np.ndarray
    """Scenario keys, str ``[n]`` (a scenario measured in both modes has two rows)."""
    modes: np.ndarray
    """Execution mode of each row, ``"eager"`` or ``"graph"``, str ``[n]``."""
    families: np.ndarray
    """Model-config name or ``features.dataset.GRID_FAMILY`` of each scenario, str ``[n]``."""
    scenarios: tuple[Scenario, ...]
    """The scenarios themselves, ``[n]``."""
    X: np.ndarray
    """Feature matrix, float64 ``[n, len(FEATURE_NAMES)]``."""
    times_ms: np.ndarray
    """Label time (``time_ms``) of each schedule, ms, float64 ``[n, S]``; NaN = no successful measurement."""
    in_best: np.ndarray
    """Whether each schedule is in the row's best set (cannot be told from the fastest), bool ``[n, S]``."""
    async_tp_ms: np.ndarray
    """PyTorch async-TP's time on the row's scenario and mode, ms ``[n]`` (NaN: not measured)."""
    host_factors: np.ndarray = None  # type: ignore[assignment]  # filled in __post_init__
    """Host factor of the machine that measured each row (``features.dataset.host_factor_of`` its sweep; 1
    when not measurable): the scale of the row's eager host-time pair feature, float64 ``[n]`` (default:
    1 everywhere)."""
    sources: np.ndarray = None  # type: ignore[assignment]  # filled in __post_init__
    """Index of each row's label source in :attr:`label_sources`, int ``[n]`` (default: 0 everywhere)."""
    label_sources: tuple[LabelSource, ...] = ()
    """What produced the labels (``features.label_source``), one per source the rows come from."""
    target: np.ndarray | None = None
    """Which rows belong to the target datasets, bool ``[n]``: evaluation scores them and takes its folds
    and groups from them alone; the other rows (``ficco train --extra``) are only learned from. None: all."""
    dropped: dict[str, int] = field(default_factory=dict)
    """Scenarios of the dataset left out, by reason."""

    def __post_init__(self) -> None:
        if self.host_factors is None:
            object.__setattr__(self, "host_factors", np.ones(len(self)))
        if self.sources is None:
            object.__setattr__(self, "sources", np.zeros(len(self), dtype=np.int64))

    def __len__(self) -> int:
        return len(self.scenario_ids)

    @property
    def best(self) -> np.ndarray:
        """Index of the fastest measured schedule of each scenario, int ``[n]``."""
        return np.nanargmin(self.times_ms, axis=1)

    @property
    def best_ms(self) -> np.ndarray:
        """Time of the fastest measured schedule, ms, ``[n]``."""
        return np.nanmin(self.times_ms, axis=1)

    @property
    def serial_ms(self) -> np.ndarray:
        """Time of serial/sm, ms, ``[n]`` (always measured in a table)."""
        return self.times_ms[:, SERIAL_INDEX]

    @property
    def op_groups(self) -> np.ndarray:
        """``"moe"`` for rows of an expert-parallel op, else ``"dense"``, str ``[n]``."""
        return np.asarray(["moe" if s.op in MOE_OPS else "dense" for s in self.scenarios], dtype=object)

    @property
    def labels(self) -> np.ndarray:
        """Best schedule string of each scenario, ``[n]``."""
        return np.asarray(SCHEDULES, dtype=object)[self.best]

    def time_of(self, picks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Measured time of schedule ``picks[i]`` (column index) on scenario ``i``, ms ``[n]``, the scenario's
        slowest for a pick without a successful measurement; and which picks those are, bool ``[n]``."""
        t = self.times_ms[np.arange(len(self)), picks]
        unmeasured = np.isnan(t)
        return np.where(unmeasured, np.nanmax(self.times_ms, axis=1), t), unmeasured

    def subset(self, index: np.ndarray) -> DatasetTable:
        """The rows ``index`` (int indices or a bool mask) as a new table."""
        index = np.flatnonzero(index) if np.asarray(index).dtype == bool else np.asarray(index)
        return DatasetTable(
            scenario_ids=self.scenario_ids[index],
            modes=self.modes[index],
            families=self.families[index],
            scenarios=tuple(self.scenarios[i] for i in index),
            X=self.X[index],
            times_ms=self.times_ms[index],
            in_best=self.in_best[index],
            async_tp_ms=self.async_tp_ms[index],
            host_factors=self.host_factors[index],
            sources=self.sources[index],
            label_sources=self.label_sources,
            target=None if self.target is None else self.target[index],
        )

    @property
    def is_target(self) -> np.ndarray:
        """:attr:`target` with None as all rows, bool ``[n]``."""
        return np.ones(len(self), dtype=bool) if self.target is None else self.target

    @property
    def label_versions(self) -> np.ndarray:
        """The executor label version of each row's label (``features.label_source``), float64 ``[n]``: a
        measured source's version, 0 for simulated rows and rows of no recorded version."""
        versions = [
            float(s.label_version) if s.measured and isinstance(s.label_version, int) else 0.0
            for s in self.label_sources
        ]
        return np.asarray(versions or [0.0], dtype=np.float64)[self.sources]

    @property
    def host_factor(self) -> float:
        """The host factor the rows were measured at: one machine's, or the median over rows of several."""
        return float(np.median(self.host_factors)) if len(self) else 1.0


def concat_tables(*tables: DatasetTable) -> DatasetTable:
    """The rows of ``tables`` in order, as one table whose label sources are theirs in order of first
    appearance (equal sources merged), each row keeping its own host factor."""
    sources: list[LabelSource] = []
    remap = []
    for table in tables:
        index = []
        for source in table.label_sources:
            if source not in sources:
                sources.append(source)
            index.append(sources.index(source))
        remap.append(np.asarray(index, dtype=np.int64))
    dropped: dict[str, int] = {}
    for table in tables:
        for reason, count in table.dropped.items():
            dropped[reason] = dropped.get(reason, 0) + count
    return DatasetTable(
        scenario_ids=np.concatenate([t.scenario_ids for t in tables]),
        modes=np.concatenate([t.modes for t in tables]),
        families=np.concatenate([t.families for t in tables]),
        scenarios=tuple(s for t in tables for s in t.scenarios),
        X=np.concatenate([t.X for t in tables]),
        times_ms=np.concatenate([t.times_ms for t in tables]),
        in_best=np.concatenate([t.in_best for t in tables]),
        async_tp_ms=np.concatenate([t.async_tp_ms for t in tables]),
        host_factors=np.concatenate([t.host_factors for t in tables]),
        sources=np.concatenate([r[t.sources] for t, r in zip(tables, remap, strict=True)]),
        label_sources=tuple(sources),
        target=np.concatenate([t.is_target for t in tables]),
        dropped=dropped,
    )


def build_table(
    df: pd.DataFrame,
    hardware: HardwareProfile,
    modes: Sequence[str] | None = None,
    repeats: Sequence[pd.DataFrame] = (),
    source: LabelSource | None = None,
) -> DatasetTable:
    """Reshape dataset rows (``features.dataset``) into one row per (scenario, mode) of ``modes`` (default:
    every mode the dataset has), every row of label source ``source`` (default: the rows' backend on
    ``hardware``, label version ``unrecorded``) at the rows' host factor.

    With ``repeats`` (independent sweeps of the same scenarios) a schedule's time is the geometric mean of
    its ``time_ms`` over the sweeps (docs/training.md), and it is in the best set if any sweep's is (or it
    is the pooled fastest). Rows without a successful serial/sm are dropped and counted in ``dropped``.
    ``ValueError`` for a schedule outside the design space or a dataset left with no row.
    """
    if modes is not None:
        df = df[df["mode"].isin(list(modes))]
    keys = sorted(set(zip(df["scenario_id"], df["mode"], strict=True)))
    ok = _pooled([_successful(frame) for frame in (df, *repeats)])
    if repeats:  # a repeat's modes may be more than asked for
        wanted = set(keys)
        ok = ok[[k in wanted for k in zip(ok["scenario_id"], ok["mode"], strict=True)]]
    row_of = {key: i for i, key in enumerate(keys)}
    times = np.full((len(keys), len(SCHEDULES)), np.nan)
    in_best = np.zeros(times.shape, dtype=bool)
    rows = np.fromiter(
        (row_of[k] for k in zip(ok["scenario_id"], ok["mode"], strict=True)), np.int64, len(ok)
    )
    cols = schedule_indices(ok["schedule"].tolist())
    times[rows, cols] = ok["time_ms"].to_numpy(dtype=np.float64)
    in_best[rows, cols] = ok["in_best_set"].to_numpy(dtype=bool)
    measured = ~np.isnan(times).all(axis=1)
    in_best[np.flatnonzero(measured), np.nanargmin(times[measured], axis=1)] = True
    keep = ~np.isnan(times[:, SERIAL_INDEX])
    if not keep.any():
        raise ValueError(
            f"the dataset has no scenario with a successful serial/sm measurement ({len(keys)} scenario-mode "
            f"rows, {len(ok)} successful rows of {len(df)}); nothing to learn from"
        )
    kept = [k for k, flag in zip(keys, keep, strict=True) if flag]
    first = df.drop_duplicates(["scenario_id", "mode"]).set_index(["scenario_id", "mode"]).loc[kept]
    first = first.reset_index()
    by_id = {sid: scenario_from_row(row, hardware) for sid, row in first.drop_duplicates("scenario_id")
             .set_index("scenario_id").iterrows()}  # fmt: skip
    scenarios = tuple(by_id[sid] for sid, _ in kept)
    X_by_id = dict(zip(by_id, feature_matrix(by_id.values()), strict=True))
    X = np.stack([X_by_id[sid] for sid, _ in kept])
    return DatasetTable(
        scenario_ids=np.asarray([sid for sid, _ in kept], dtype=object),
        modes=np.asarray([mode for _, mode in kept], dtype=object),
        families=first["family"].astype(str).to_numpy(dtype=object),
        scenarios=scenarios,
        X=X,
        times_ms=times[keep],
        in_best=in_best[keep],
        async_tp_ms=first["async_tp_ms"].to_numpy(dtype=np.float64),
        host_factors=np.full(len(kept), factor := _host_factor(df)),
        sources=np.zeros(len(kept), dtype=np.int64),
        label_sources=(source or _unrecorded_source(df, hardware, factor),),
        dropped={"no successful serial/sm measurement": int((~keep).sum())} if not keep.all() else {},
    )


def _unrecorded_source(df: pd.DataFrame, hardware: HardwareProfile, host_factor: float) -> LabelSource:
    """The label source of rows read without their manifest: their backend on ``hardware``."""
    backends = sorted(set(df["backend"])) or ["gpu"]
    return LabelSource(
        backend=backends[0], label_version="unrecorded", gpu_name=hardware.gpu_name,
        world_size=int(df["world_size"].iloc[0]) if len(df) else hardware.gpu_count,
        host_factor=host_factor, settings={}, fingerprint={},
    )  # fmt: skip


def _host_factor(df: pd.DataFrame) -> float:
    """``features.dataset.host_factor_of`` the sweep's rows; 1.0, with a log line, when no eager time is
    host-bound (graph rows only, large shapes only): the prices as they are."""
    factor = host_factor_of(df)
    if np.isfinite(factor):
        return factor
    log.info("no host-bound eager time to estimate the host factor from; using 1.0")
    return 1.0


def _successful(df: pd.DataFrame) -> pd.DataFrame:
    """The successful rows of one sweep, one per (scenario, mode, schedule): a scenario re-measured within
    the sweep (a resumed run) keeps its latest row."""
    df = with_label_times(df)
    ok = df[df["ok"].astype(bool) & np.isfinite(df["time_ms"].to_numpy(dtype=np.float64))]
    return ok.drop_duplicates(["scenario_id", "mode", "schedule"], keep="last")


def _pooled(sweeps: list[pd.DataFrame]) -> pd.DataFrame:
    """One row per (scenario, mode, schedule) over ``sweeps``: geometric-mean ``time_ms``, ``in_best_set``
    if in any sweep's best set (:func:`build_table`)."""
    if len(sweeps) == 1:
        return sweeps[0]
    import pandas as pd

    both = pd.concat([s[["scenario_id", "mode", "schedule", "time_ms", "in_best_set"]] for s in sweeps])
    both = both.assign(log_ms=np.log(both["time_ms"].to_numpy(dtype=np.float64)))
    grouped = both.groupby(["scenario_id", "mode", "schedule"], sort=False)
    pooled = grouped.agg(log_ms=("log_ms", "mean"), in_best_set=("in_best_set", "any")).reset_index()
    return pooled.assign(time_ms=np.exp(pooled["log_ms"]))


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class LoadedDataset:
    """One or more dataset directories read for training: their table, hardware profile and identity."""

    paths: tuple[Path, ...]
    """The dataset directories (or one Parquet file), in the order their rows were concatenated."""
    table: DatasetTable
    """One row per (scenario, mode)."""
    noise: DatasetTable | None
    """The independent re-measures (``noise.parquet``) as a table; None if no dataset has one."""
    hardware: HardwareProfile
    """The profile the datasets were measured or simulated on."""
    hash: str
    """Content hash of the measurement rows (``features.dataset.frame_hash``)."""
    info: dict[str, Any]
    """What the model card records about the data (path(s) joined by " + ", hash, backends, sizes,
    families)."""


def load_dataset_table(
    *paths: str | Path, repeats: Sequence[str | Path] = (), extra: Sequence[str | Path] = ()
) -> LoadedDataset:
    """Read the target datasets ``paths`` (several: same hardware, disjoint scenarios) and the ``extra``
    datasets (more rows to learn from: other label sources, machines or world sizes) into one
    :class:`LoadedDataset`. Each dataset keeps its label source (``features.label_source``) and host factor;
    the repeat sweeps ``repeats`` are pooled into the target's times (:func:`build_table`) and must share
    its label source. ``ValueError`` (also from ``features.dataset``) names what is wrong with the data."""
    import pandas as pd

    paths = tuple(Path(p) for p in paths)
    repeats = tuple(Path(p) for p in repeats)
    extra = tuple(Path(p) for p in extra)
    frames = load_each(paths)  # checks hardware and disjoint scenarios
    df = pd.concat([frame for frame, _ in frames], ignore_index=True) if len(frames) > 1 else frames[0][0]
    noises = [n for _, n in frames if n is not None and not n.empty]
    noise_df = pd.concat(noises, ignore_index=True) if noises else None
    repeat_dfs = load_repeats(df, repeats, like=paths[0])
    hardware = dataset_hardware(paths[0])
    tables = [
        _source_table(path, frame, hardware, [_only(r, frame) for r in repeat_dfs])
        for path, (frame, _) in zip(paths, frames, strict=True)
    ]
    _check_repeats(paths, tables, repeats, repeat_dfs)
    extra_frames = [load_each([p])[0][0] for p in extra]
    extras = [
        _source_table(path, frame, dataset_hardware(path))
        for path, frame in zip(extra, extra_frames, strict=True)
    ]
    table = concat_tables(*tables, *extras)
    if extras:
        table = dataclasses.replace(table, target=np.arange(len(table)) < sum(len(t) for t in tables))
    noise = None if noise_df is None or noise_df.empty else build_table(noise_df, hardware)
    parts = [
        frame_hash(df),
        *map(frame_hash, repeat_dfs),
        *map(frame_hash, extra_frames),
    ]
    digest = parts[0] if len(parts) == 1 else hashlib.sha256("+".join(parts).encode()).hexdigest()
    info = {
        "path": " + ".join(map(str, paths)),
        **({"repeats": [str(p) for p in repeats]} if repeats else {}),
        **({"extra": [str(p) for p in extra]} if extra else {}),
        **({"extra_backends": sorted({b for f in extra_frames for b in f["backend"]})} if extra else {}),
        "hash": digest,
        "hardware_id": hardware.id,
        "backends": sorted(set(df["backend"])),
        "n_rows": len(df),
        "n_scenarios": len(set(table.scenario_ids[table.is_target])),
        "n_rows_by_mode": {
            m: int(np.sum(table.modes[table.is_target] == m)) for m in sorted(set(table.modes))
        },
        "n_noise_scenarios": 0 if noise is None else len(set(noise.scenario_ids)),
        "families": sorted(set(table.families[table.is_target])),
        "dropped": table.dropped,
        "host_factor": round(_host_factor(df), 4),
        "sources": [
            {"path": str(p), "role": role, **t.label_sources[0].to_dict()}
            for role, group in (
                ("target", zip(paths, tables, strict=True)),
                ("extra", zip(extra, extras, strict=True)),
            )
            for p, t in group
        ],
    }
    return LoadedDataset(paths=paths, table=table, noise=noise, hardware=hardware, hash=digest, info=info)


def _source_table(
    path: Path, frame: pd.DataFrame, hardware: HardwareProfile, repeats: Sequence[pd.DataFrame] = ()
) -> DatasetTable:
    """One dataset's table, its rows of the label source its manifest names at its own host factor."""
    manifest = read_manifest(path) if path.is_dir() else None
    factor = _host_factor(frame)
    source = label_source(manifest, factor) if manifest is not None else None
    return build_table(frame, hardware, repeats=repeats, source=source)


def _only(repeat: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``repeat`` whose scenario ``frame`` holds."""
    return repeat[repeat["scenario_id"].isin(set(frame["scenario_id"]))]


def _check_repeats(
    paths: Sequence[Path],
    tables: Sequence[DatasetTable],
    repeats: Sequence[Path],
    frames: Sequence[pd.DataFrame],
) -> None:
    """Raise ``ValueError`` for a repeat sweep of another label source than the datasets it repeats, naming
    both and the settings that differ (pooling them would mix two executors' labels); label versions that
    time the same thing (``features.label_source.same_times``: only the round counts changed) pool, with a
    log line."""
    for path, frame in zip(repeats, frames, strict=True):
        manifest = read_manifest(path)
        if manifest is None:
            continue
        mine = label_source(manifest, 1.0)
        for dataset, table in zip(paths, tables, strict=True):
            if not set(frame["scenario_id"]) & set(table.scenario_ids):
                continue
            theirs = table.label_sources[0]
            if same_times(mine.label_version, theirs.label_version) and mine.key() != theirs.key():
                settle = dataclasses.replace(mine, label_version=theirs.label_version)
                if settle.key() == theirs.key():
                    log.info(
                        "repeat %s (label version %s) pools into %s (version %s): only round counts differ",
                        path, mine.label_version, dataset, theirs.label_version,
                    )  # fmt: skip
                    continue
            if mine.key() != theirs.key():
                raise ValueError(
                    f"repeat {path} and dataset {dataset} have different label sources "
                    f"({'; '.join(theirs.differences(mine))}): a repeat is pooled into the labels, so it "
                    "must come from the same executor and machine; pass it with --extra instead"
                )


def trained_on(record: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """The dataset paths a model card's ``dataset`` record names, as recorded: (target paths, repeats,
    extra)."""
    targets = [p for p in str(record.get("path", "")).split(" + ") if p]
    return targets, list(record.get("repeats", [])), list(record.get("extra", []))


def load_trained_on(record: dict[str, Any], root: str | Path = ".") -> LoadedDataset:
    """The datasets a model card's ``dataset`` record names (:func:`trained_on`, relative to ``root``), loaded
    as training loaded them, so that their hash is the card's while they are unchanged."""
    root = Path(root)
    targets, repeats, extra = ([root / p for p in paths] for paths in trained_on(record))
    return load_dataset_table(*targets, repeats=repeats, extra=extra)
