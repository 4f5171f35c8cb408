"""Baselines the model has to beat: fixed schedules, a size-threshold heuristic after the FiCCO paper, and
the peer rules that choose between serial/sm and PyTorch async-TP (True = async-TP). See docs/training.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ficco.features import roofline_comm_us, roofline_gemm_us
from ficco.features.launch_cost import host_over_gpu
from ficco.training.dataset_table import DatasetTable
from ficco.training.metrics import mean_loss, pick_loss
from ficco.training.model import SCHEDULE_INDEX, SCHEDULES, SERIAL_INDEX, valid_mask
from ficco.training.peer_rules import pytorch_autoheuristic, vllm_sp_rule

FIXED: dict[str, str] = {
    "always_serial": "serial/sm",
    "always_shard_dma": "shard/dma",
    "always_shard_sm": "shard/sm",
}
"""The fixed-schedule baselines, by name."""
_GRID_LEVELS = 9
"""Candidate thresholds per heuristic feature: the 0, 1/8, ..., 1 quantiles of the training rows."""


def fixed_picks(table: DatasetTable, schedule: int) -> np.ndarray:
    """Pick ``schedule`` (a column index) for every scenario it can run and serial/sm elsewhere: ``[n]``."""
    return np.where(valid_mask(table.X)[:, schedule], schedule, SERIAL_INDEX)


def fit_best_fixed(table: DatasetTable, among: tuple[str, ...] = SCHEDULES) -> int:
    """Column index of the schedule in ``among`` of lowest mean loss on ``table`` (ties: canonical order)."""
    losses = [mean_loss(table, fixed_picks(table, SCHEDULE_INDEX[s])) for s in among]
    return SCHEDULE_INDEX[among[int(np.argmin(losses))]]


def _heuristic_features(table: DatasetTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """log2 of (roofline t_gemm + t_comm in us, t_comm / t_gemm, shard rows), each ``[n]``."""
    gemm = np.array([roofline_gemm_us(s) for s in table.scenarios])
    comm = np.array([roofline_comm_us(s) for s in table.scenarios])
    rows = np.array([s.rows // s.world_size for s in table.scenarios], dtype=np.float64)
    return np.log2(gemm + comm), np.log2(comm / gemm), np.log2(rows)


@dataclass(frozen=True, kw_only=True, slots=True)
class SizeHeuristic:
    """The three-tier size rule (docs/training.md); thresholds are log2 values."""

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

    def picks(self, table: DatasetTable) -> np.ndarray:
        """The rule's schedule column index for every scenario of ``table``, ``[n]``."""
        total, ratio, rows = _heuristic_features(table)
        serial = (total < self.min_log2_total_us) | (ratio < self.min_log2_comm_ratio)
        finer = (rows >= self.min_log2_shard_rows) & valid_mask(table.X)[:, self.finer]
        return np.where(serial, self.serial, np.where(finer, self.finer, self.shard))


def fit_size_heuristic(table: DatasetTable) -> SizeHeuristic:
    """The tier schedules (the best fixed serial, shard and finer ones), then the three thresholds of lowest
    mean loss over the 0, 1/8, ..., 1 quantiles of each feature on ``table`` and +-inf (docs/training.md)."""
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


def baseline_picks(train: DatasetTable, test: DatasetTable) -> dict[str, np.ndarray]:
    """Every baseline fitted on ``train`` and applied to ``test``: name -> column indices ``[n_test]``."""
    picks = {name: fixed_picks(test, SCHEDULE_INDEX[s]) for name, s in FIXED.items()}
    picks["best_fixed"] = fixed_picks(test, fit_best_fixed(train))
    picks["size_heuristic"] = fit_size_heuristic(train).picks(test)
    return picks


# The peer rules: serial or PyTorch async-TP -------------------------------------------------------------

PEER_RULES: tuple[str, ...] = (
    "vllm_sp_rule", "pytorch_autoheuristic", "ficco_async_tp_threshold", "oracle_serial_or_async_tp",
)  # fmt: skip
"""The serial-or-async-TP pickers :func:`serial_or_async_tp` returns, in report order."""


def async_tp_matrix(X: np.ndarray, modes: np.ndarray, host_factor: float | np.ndarray) -> np.ndarray:
    """:class:`AsyncTPModel`'s inputs: the scenario features ``X`` ``[n, F]``, whether the row is replayed
    from a CUDA graph, and the eager host time of a shard schedule over the GPU work (0 in graph mode),
    float32 ``[n, F + 2]``."""
    graph = (np.asarray(modes) == "graph").astype(np.float64)
    host = host_over_gpu(X, host_factor)[:, SCHEDULE_INDEX["shard/sm"]] * (1.0 - graph)
    return np.column_stack([X, graph, host]).astype(np.float32)


MIN_GAINS: tuple[float, ...] = (0.0, 0.01, 0.02, 0.03, 0.05)
"""Candidate gains :class:`AsyncTPModel` asks of async-TP before it leaves serial (``POLICY_GRID`` without
"never fall back")."""
_INNER_FOLDS = 3
"""Folds of :class:`AsyncTPModel`'s choice of ``min_gain`` (model families held out)."""


def _fit_regressor(table: DatasetTable, *, seed: int, n_jobs: int) -> Any:
    """XGBoost regressor of ``log(t_async_tp / t_serial)`` on :func:`async_tp_matrix` of ``table``'s rows
    (all measured async-TP), with the pair model's time-ratio hyper-parameters."""
    import xgboost as xgb

    from ficco.training.fit import RATIO_CONFIG as c

    model = xgb.XGBRegressor(
        n_estimators=c.n_estimators, max_depth=c.max_depth, learning_rate=c.learning_rate,
        random_state=seed, n_jobs=n_jobs, tree_method="hist", verbosity=0,
    )  # fmt: skip
    y = np.log(table.async_tp_ms / table.serial_ms)
    model.fit(async_tp_matrix(table.X, table.modes, table.host_factors), y)
    return model


@dataclass(kw_only=True, slots=True)
class AsyncTPModel:
    """ficco's model of the serial-or-async-TP choice: one regressor of ``log(t_async_tp / t_serial)`` over
    both modes (``training.fit.RATIO_CONFIG``), and per mode the least predicted gain that leaves serial,
    ``min_gain_``, of :data:`MIN_GAINS` by grouped cross-validation (docs/training.md)."""

    seed: int = 0
    n_jobs: int = 1
    regressor_: Any = None
    """The fitted regressor (None before :meth:`fit`)."""
    min_gain_: dict[str, float] = field(default_factory=dict)
    """Per mode: async-TP runs where its predicted speedup over serial is at least ``1 + min_gain_``
    (a mode without training rows: 0)."""

    def fit(self, table: DatasetTable) -> AsyncTPModel:
        """Learn from ``table``'s rows that measured async-TP; ValueError when none did."""
        from ficco.training.crossval import cv_folds, cv_groups

        has = np.isfinite(table.async_tp_ms)
        if not has.any():
            raise ValueError("no row of the table measured PyTorch async-TP (async_tp_ms); nothing to fit")
        sub = table.subset(has)
        groups = cv_groups(sub)
        self.min_gain_ = {}
        if len(set(groups)) >= 2:
            folds = cv_folds(groups, _INNER_FOLDS)
            log_ratio = np.zeros(len(sub))
            for fold in sorted(set(folds.tolist())):
                held = folds == fold
                inner = _fit_regressor(sub.subset(~held), seed=self.seed, n_jobs=self.n_jobs)
                rows = async_tp_matrix(sub.X[held], sub.modes[held], sub.host_factors[held])
                log_ratio[held] = inner.predict(rows)
            for mode in sorted(set(sub.modes.tolist())):
                on = sub.modes == mode
                picked = [np.where(-log_ratio[on] >= np.log1p(g), sub.async_tp_ms[on], sub.serial_ms[on])
                          for g in MIN_GAINS]  # fmt: skip
                losses = [pick_loss(t, sub.best_ms[on], sub.serial_ms[on]).mean() for t in picked]
                self.min_gain_[mode] = MIN_GAINS[int(np.argmin(losses))]
        self.regressor_ = _fit_regressor(sub, seed=self.seed, n_jobs=self.n_jobs)
        return self

    def predict_log_ratio(self, X: np.ndarray, modes: np.ndarray, host_factor: float) -> np.ndarray:
        """Predicted ``log(t_async_tp / t_serial)`` of feature rows ``X`` ``[n, F]`` in ``modes`` ``[n]``."""
        if self.regressor_ is None:
            raise ValueError("AsyncTPModel is not fitted; call fit(table) first")
        if not len(X):
            return np.empty(0)
        return np.asarray(self.regressor_.predict(async_tp_matrix(X, modes, host_factor)), dtype=np.float64)

    def fuses(self, log_ratio: np.ndarray, modes: np.ndarray) -> np.ndarray:
        """True where a predicted ``log(t_async_tp / t_serial)`` ``[n]`` is a speedup of at least
        ``1 + min_gain_`` of the row's mode (``modes`` ``[n]``), bool ``[n]``."""
        gain = np.array([self.min_gain_.get(m, 0.0) for m in np.asarray(modes).tolist()], dtype=np.float64)
        return -log_ratio >= np.log1p(gain)

    def fuse_rows(self, X: np.ndarray, modes: np.ndarray, host_factor: float) -> np.ndarray:
        """:meth:`fuses` at the predicted ratios of feature rows ``X [n, F]`` in ``modes``, bool ``[n]``."""
        return self.fuses(self.predict_log_ratio(X, modes, host_factor), modes)

    def fuse(self, table: DatasetTable) -> np.ndarray:
        """:meth:`fuse_rows` of ``table``'s rows at its host factor, bool ``[n]``."""
        return self.fuse_rows(table.X, table.modes, table.host_factors)


def serial_or_async_tp(train: DatasetTable, test: DatasetTable, *, seed: int = 0) -> dict[str, np.ndarray]:
    """Every peer rule (:data:`PEER_RULES`) on ``test``'s rows, ficco's fitted on ``train``: name -> bool
    ``[n_test]``, True = async-TP. The oracle reads ``test``'s own times (False where async-TP was not
    measured); ficco's rule is serial everywhere when ``train`` measured no async-TP."""
    has_train = np.isfinite(train.async_tp_ms).any()
    ficco = AsyncTPModel(seed=seed).fit(train).fuse(test) if has_train else np.zeros(len(test), dtype=bool)
    with np.errstate(invalid="ignore"):
        oracle = test.async_tp_ms < test.serial_ms
    return {
        "vllm_sp_rule": vllm_sp_rule(test.scenarios),
        "pytorch_autoheuristic": pytorch_autoheuristic(test.scenarios),
        "ficco_async_tp_threshold": ficco,
        "oracle_serial_or_async_tp": oracle,
    }
