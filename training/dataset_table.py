"""The dataset table: a measured dataset reshaped to one row per (scenario, mode), the form training needs.

The columns of ``times_ms`` are every schedule in canonical order (serial/sm first), NaN where the schedule
was not measured, failed or cannot run; a scenario's label is its fastest measured schedule (ties: the
canonical order, so serial wins a tie).
"""

from __future__ import annotations

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
    load_datasets,
    load_repeats,
    scenario_from_row,
    with_label_times,
)
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
    dropped: dict[str, int] = field(default_factory=dict)
    """Scenarios of the dataset left out, by reason."""
    host_factor: float = 1.0
    """The measuring machine's host factor (``features.dataset.host_factor_of`` its sweep; 1 when not
    measurable): the scale of the eager host-time pair feature of every row."""

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
            host_factor=self.host_factor,
        )


def build_table(
    df: pd.DataFrame,
    hardware: HardwareProfile,
    modes: Sequence[str] | None = None,
    repeats: Sequence[pd.DataFrame] = (),
) -> DatasetTable:
    """Reshape dataset rows (``features.dataset``) into one row per (scenario, mode) of ``modes`` (default:
    every mode the dataset has).

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
        dropped={"no successful serial/sm measurement": int((~keep).sum())} if not keep.all() else {},
        host_factor=_host_factor(df),
    )


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


def load_dataset_table(*paths: str | Path, repeats: Sequence[str | Path] = ()) -> LoadedDataset:
    """Read dataset directories ``paths`` (several: same hardware, disjoint scenarios) into one
    :class:`LoadedDataset`, the repeat sweeps ``repeats`` pooled into the times (:func:`build_table`).
    ``ValueError`` (from ``features.dataset``) names what is wrong with the data."""
    paths = tuple(Path(p) for p in paths)
    repeats = tuple(Path(p) for p in repeats)
    df, noise_df = load_datasets(paths)
    repeat_dfs = load_repeats(df, repeats, like=paths[0])
    hardware = dataset_hardware(paths[0])
    table = build_table(df, hardware, repeats=repeat_dfs)
    noise = None if noise_df is None or noise_df.empty else build_table(noise_df, hardware)
    digest = frame_hash(df)
    if repeats:
        digest = hashlib.sha256("+".join([digest, *map(frame_hash, repeat_dfs)]).encode()).hexdigest()
    info = {
        "path": " + ".join(map(str, paths)),
        **({"repeats": [str(p) for p in repeats]} if repeats else {}),
        "hash": digest,
        "hardware_id": hardware.id,
        "backends": sorted(set(df["backend"])),
        "n_rows": len(df),
        "n_scenarios": len(set(table.scenario_ids)),
        "n_rows_by_mode": {m: int(np.sum(table.modes == m)) for m in sorted(set(table.modes))},
        "n_noise_scenarios": 0 if noise is None else len(set(noise.scenario_ids)),
        "families": sorted(set(table.families)),
        "dropped": table.dropped,
    }
    return LoadedDataset(paths=paths, table=table, noise=noise, hardware=hardware, hash=digest, info=info)
