"""The schedule table: a measured dataset reshaped to one row per scenario, the form training needs.

Rows are scenarios; the columns of ``times_ms`` are every schedule of the design space in canonical order
(``training.model.SCHEDULES``, serial/sm first), NaN where the schedule was not measured, failed or
cannot run the scenario. The label of a scenario is its fastest measured schedule (ties: canonical
order, so serial wins a tie).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from ficco.features import HardwareProfile, Scenario, feature_matrix
from ficco.training.model import SCHEDULES, SERIAL_INDEX, schedule_indices

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class ScheduleTable:
    """Per-scenario arrays of a dataset. ``n`` scenarios, ``S = len(SCHEDULES)`` schedules."""

    scenario_ids: np.ndarray
    """Scenario keys, str ``[n]``."""
    families: np.ndarray
    """Model-config name or ``"grid"`` of each scenario, str ``[n]``."""
    scenarios: tuple[Scenario, ...]
    """The scenarios themselves, ``[n]``."""
    X: np.ndarray
    """Feature matrix, float64 ``[n, len(FEATURE_NAMES)]``."""
    times_ms: np.ndarray
    """Median time of each schedule, ms, float64 ``[n, S]``; NaN = no successful measurement."""
    dropped: dict[str, int] = field(default_factory=dict)
    """Scenarios of the dataset left out, by reason."""

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
    def labels(self) -> np.ndarray:
        """Best schedule string of each scenario, ``[n]``."""
        return np.asarray(SCHEDULES, dtype=object)[self.best]

    def time_of(self, picks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Measured time of schedule ``picks[i]`` (column index) on scenario ``i``, ms ``[n]``.

        A pick without a successful measurement is charged the scenario's slowest measured time (the
        pessimistic choice); the second array flags those picks, bool ``[n]``.
        """
        t = self.times_ms[np.arange(len(self)), picks]
        unmeasured = np.isnan(t)
        return np.where(unmeasured, np.nanmax(self.times_ms, axis=1), t), unmeasured

    def subset(self, index: np.ndarray) -> ScheduleTable:
        """The rows ``index`` (int indices or a bool mask) as a new table."""
        index = np.flatnonzero(index) if np.asarray(index).dtype == bool else np.asarray(index)
        return ScheduleTable(
            scenario_ids=self.scenario_ids[index],
            families=self.families[index],
            scenarios=tuple(self.scenarios[i] for i in index),
            X=self.X[index],
            times_ms=self.times_ms[index],
        )


def build_table(df: pd.DataFrame, hardware: HardwareProfile, mode: str = "eager") -> ScheduleTable:
    """Reshape dataset rows of one execution ``mode`` (one per scenario and schedule, the
    ``harness.dataset`` schema) into a table.

    Scenarios without a successful serial/sm measurement are dropped (every metric is relative to it)
    and counted in ``dropped``. Raises ``ValueError`` for a schedule string outside the design space or
    a dataset left with no scenario.
    """
    from ficco.harness.dataset import scenario_from_row

    df = df[df["mode"] == mode]
    ok = df[df["ok"].astype(bool) & np.isfinite(df["median_ms"].to_numpy(dtype=np.float64))]
    ok = ok.drop_duplicates(["scenario_id", "schedule"], keep="last")  # a re-measured pair: the latest row
    ids = np.asarray(sorted(df["scenario_id"].unique()), dtype=object)
    times = np.full((len(ids), len(SCHEDULES)), np.nan)
    row_of = {sid: i for i, sid in enumerate(ids)}
    rows = np.fromiter((row_of[s] for s in ok["scenario_id"]), dtype=np.int64, count=len(ok))
    cols = schedule_indices(ok["schedule"].tolist())
    times[rows, cols] = ok["median_ms"].to_numpy(dtype=np.float64)
    keep = ~np.isnan(times[:, SERIAL_INDEX])
    if not keep.any():
        raise ValueError(
            f"the dataset has no scenario with a successful serial/sm measurement ({len(ids)} scenarios, "
            f"{len(ok)} successful rows of {len(df)}); nothing to learn from"
        )
    first = df.drop_duplicates("scenario_id").set_index("scenario_id").loc[ids[keep]].reset_index()
    scenarios = tuple(scenario_from_row(row, hardware) for _, row in first.iterrows())
    return ScheduleTable(
        scenario_ids=ids[keep],
        families=first["family"].astype(str).to_numpy(dtype=object),
        scenarios=scenarios,
        X=feature_matrix(scenarios),
        times_ms=times[keep],
        dropped={"no successful serial/sm measurement": int((~keep).sum())} if not keep.all() else {},
    )


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class LoadedDataset:
    """A dataset directory read for training: its table, hardware profile and identity."""

    path: Path
    """The dataset directory (or Parquet file)."""
    table: ScheduleTable
    """One row per scenario."""
    hardware: HardwareProfile
    """The profile the dataset was measured or simulated on."""
    hash: str
    """Content hash of the measurement rows (``harness.dataset.dataset_hash``)."""
    info: dict[str, Any]
    """What the model card records about the dataset (path, hash, backends, sizes, families)."""


def load_dataset_table(path: str | Path) -> LoadedDataset:
    """Read dataset directory ``path`` (``ficco bench --out``) into a :class:`LoadedDataset`.

    Raises ``ValueError`` (from ``harness.dataset``) naming a missing manifest or bad columns.
    """
    from ficco.harness.dataset import dataset_hardware, dataset_hash, load_dataset

    path = Path(path)
    df = load_dataset(path)
    hardware = dataset_hardware(path)
    table = build_table(df, hardware)
    digest = dataset_hash(path)
    info = {
        "path": str(path),
        "hash": digest,
        "hardware_id": hardware.id,
        "backends": sorted(set(df["backend"])),
        "n_rows": len(df),
        "n_scenarios": len(table),
        "families": sorted(set(table.families)),
        "dropped": table.dropped,
    }
    return LoadedDataset(path=path, table=table, hardware=hardware, hash=digest, info=info)
