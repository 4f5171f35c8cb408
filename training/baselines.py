"""Baselines the model has to beat: fixed schedules and a size-threshold heuristic after the FiCCO paper.

- ``always_serial``: serial/sm, what a framework without overlap does.
- ``always_shard_dma``: shard/dma, ficco's executor doing what PyTorch async-TP does (one chunk per peer,
  moved by the copy engines while the GEMM runs on the previous chunk).
- ``always_async_tp``: PyTorch's own async-TP (the dataset's ``async_tp_ms``), scored in
  ``training.evaluate`` from that column.
- ``always_shard_sm``: shard/sm, the same overlap with NCCL kernels on the SMs (TransformerEngine-like).
- ``best_fixed``: the one schedule with the lowest loss on the training folds.
- ``size_heuristic``: FiCCO's heuristics pick a schedule from static operator sizes (their thresholds are
  not published); ours is a three-tier rule on the roofline times of the GEMM and the collective, with
  thresholds fitted on the training folds:

      if t_gemm + t_comm < a  or  t_comm / t_gemm < b:  best serial schedule (too small or too little to hide)
      elif shard_rows >= c:                            best finer schedule  (rows to spare for splitting)
      else:                                            best shard schedule

A fixed schedule that cannot run a scenario (finer splits the rows do not divide) falls back to serial/sm.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ficco.features import roofline_comm_us, roofline_gemm_us
from ficco.training.metrics import mean_loss, pick_loss
from ficco.training.model import SCHEDULE_INDEX, SCHEDULES, SERIAL_INDEX, valid_mask
from ficco.training.table import ScheduleTable

FIXED: dict[str, str] = {
    "always_serial": "serial/sm",
    "always_shard_dma": "shard/dma",
    "always_shard_sm": "shard/sm",
}
"""The fixed-schedule baselines, by name."""
_GRID_LEVELS = 9
"""Candidate thresholds per heuristic feature: the 0, 1/8, ..., 1 quantiles of the training rows."""


def fixed_picks(table: ScheduleTable, schedule: int) -> np.ndarray:
    """Pick ``schedule`` (a column index) for every scenario it can run and serial/sm elsewhere: ``[n]``."""
    return np.where(valid_mask(table.X)[:, schedule], schedule, SERIAL_INDEX)


def fit_best_fixed(table: ScheduleTable, among: tuple[str, ...] = SCHEDULES) -> int:
    """Column index of the schedule in ``among`` of lowest mean loss on ``table`` (ties: canonical order)."""
    losses = [mean_loss(table, fixed_picks(table, SCHEDULE_INDEX[s])) for s in among]
    return SCHEDULE_INDEX[among[int(np.argmin(losses))]]


def _heuristic_features(table: ScheduleTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """log2 of (roofline t_gemm + t_comm in us, t_comm / t_gemm, shard rows), each ``[n]``."""
    gemm = np.array([roofline_gemm_us(s) for s in table.scenarios])
    comm = np.array([roofline_comm_us(s) for s in table.scenarios])
    rows = np.array([s.rows // s.world_size for s in table.scenarios], dtype=np.float64)
    return np.log2(gemm + comm), np.log2(comm / gemm), np.log2(rows)


@dataclass(frozen=True, kw_only=True, slots=True)
class SizeHeuristic:
    """The three-tier rule of the module docstring; thresholds are log2 values."""

    min_log2_total_us: float
    """Serial below this roofline time of GEMM + collective (log2 microseconds)."""
    min_log2_comm_ratio: float
    """Serial below this roofline ratio t_comm / t_gemm (log2)."""
    min_log2_shard_rows: float
    """Finer from this many rows per shard (log2) on."""
    serial: int
    """Column index of the schedule of the bottom tier (serial/sm or serial/dma)."""
    shard: int
    """Column index of the schedule of the middle tier."""
    finer: int
    """Column index of the schedule of the top tier (shard where it cannot run)."""

    def picks(self, table: ScheduleTable) -> np.ndarray:
        """The rule's schedule column index for every scenario of ``table``, ``[n]``."""
        total, ratio, rows = _heuristic_features(table)
        serial = (total < self.min_log2_total_us) | (ratio < self.min_log2_comm_ratio)
        finer = (rows >= self.min_log2_shard_rows) & valid_mask(table.X)[:, self.finer]
        return np.where(serial, self.serial, np.where(finer, self.finer, self.shard))


def fit_size_heuristic(table: ScheduleTable) -> SizeHeuristic:
    """Choose the tier schedules, then the three thresholds, by exhaustive search for the lowest mean loss.

    The tier schedules are the best fixed serial, shard and finer schedules; the thresholds range over the
    0, 1/8, ..., 1 quantiles of each feature on ``table`` and +-inf (a rule always or never applies), so
    the best serial schedule alone is one of the candidates.
    """
    serial, shard, finer = (
        fit_best_fixed(table, tuple(s for s in SCHEDULES if s.startswith(f"{granularity}/")))
        for granularity in ("serial", "shard", "finer")
    )
    t_best, t_serial = table.best_ms, table.serial_ms
    finer_ok = valid_mask(table.X)[:, finer]
    loss = {
        name: pick_loss(table.time_of(np.full(len(table), index))[0], t_best, t_serial)
        for name, index in (("serial", serial), ("shard", shard), ("finer", finer))
    }
    loss["finer"] = np.where(finer_ok, loss["finer"], loss["shard"])
    levels = np.linspace(0.0, 1.0, _GRID_LEVELS)
    total, ratio, rows = _heuristic_features(table)
    grid = [np.concatenate([[-np.inf], np.quantile(f, levels), [np.inf]]) for f in (total, ratio, rows)]
    best_key, best_value = None, np.inf
    for c in grid[2]:
        overlapped = np.where(rows >= c, loss["finer"], loss["shard"])
        for a in grid[0]:
            for b in grid[1]:
                value = np.where((total < a) | (ratio < b), loss["serial"], overlapped).mean()
                if value < best_value - 1e-12:
                    best_key, best_value = (a, b, c), value
    a, b, c = best_key
    return SizeHeuristic(
        min_log2_total_us=float(a), min_log2_comm_ratio=float(b), min_log2_shard_rows=float(c),
        serial=serial, shard=shard, finer=finer,
    )  # fmt: skip


def baseline_picks(train: ScheduleTable, test: ScheduleTable) -> dict[str, np.ndarray]:
    """Every baseline fitted on ``train`` and applied to ``test``: name -> column indices ``[n_test]``."""
    picks = {name: fixed_picks(test, SCHEDULE_INDEX[s]) for name, s in FIXED.items()}
    picks["best_fixed"] = fixed_picks(test, fit_best_fixed(train))
    picks["size_heuristic"] = fit_size_heuristic(train).picks(test)
    return picks
