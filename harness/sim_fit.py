"""Fitting the simulator to measured datasets, scoring its picks on measured times, and its error by term.

:func:`observations` reads a measured dataset as the rows the fit and the scores use (keeping only what the
current executor would measure the same way: :func:`current_rows`); :func:`fit` fits the constants
(``scipy.optimize.least_squares`` on log times, a host factor per dataset); :func:`pick_table` scores the
simulator's own picks; :func:`family_folds` and :func:`cross_validate` hold whole model families out of the
fit; :func:`term_errors` breaks the error down (GEMM, transfers, host, schedule families). ``calibrate`` and
``agreement`` serve ``ficco bench --calibrate-from`` and the dataset card. See docs/simulator.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ficco.features import MOE_OPS, HardwareProfile, Schedule
from ficco.features.dataset import (
    BASELINE_KEYS,
    dataset_hardware,
    host_factor_of,
    load_dataset,
    read_manifest,
    scenario_from_row,
    with_label_times,
)
from ficco.features.label_source import LABEL_VERSION, label_version_of
from ficco.harness.sim import (
    DEFAULT_CONSTANTS,
    UPPER_BOUND,
    SimConstants,
    _baselines_us,
    _encode,
    _schedule_us,
    host_price_us,
)

if TYPE_CHECKING:
    import pandas as pd

CHANGED_IN_V3 = ("serial/dma", "dma_comm_ms")
"""What label version 3 measures differently from earlier executors at any world size: copies with no GEMM
to overlap on the caller's stream (``serial/dma``, the copy-engine collective alone). The MoE ops' expert
GEMMs changed too (grouped): rows of an earlier version keep neither (:func:`current_rows`)."""
START = SimConstants(
    gemm_scale=1.0,
    gemm_eff=0.764,
    gemm_wave_half=0.0373,
    gemm_k_half=256.0,
    gemm_launch_us=4.0,
    split_loss=0.145,
    hbm_eff=0.9,
    nccl_latency_us=22.0,
    nccl_bw_frac=0.51,
    nccl_small_latency_us=9.0,
    nccl_small_bw_frac=0.19,
    nccl_peer_gain=0.27,
    nccl_peer_latency_us=4.0,
    p2p_latency_us=20.0,
    p2p_bw_frac=0.5,
    ce_latency_us=14.0,
    ce_bw_frac=0.82,
    ce_peer_loss=0.01,
    ce_copy_us=3.0,
    sm_gemm_slowdown=0.3,
    sm_comm_slowdown=0.2,
    dma_gemm_slowdown=0.05,
    dma_comm_slowdown=0.15,
    hp_comm_relief=0.475,
    hp_gemm_penalty=0.313,
    chunk_sync_us=2.0,
    graph_call_us=3.0,
    eager_call_us=10.0,
    eager_overlap=0.1,
    eager_overlap_dma=0.3,
    host_factor=1.0,
    host_call_us=30.0,
    host_gemm_us=14.5,
    host_kernel_us=14.5,
    host_collective_us=3.0,
    host_p2p_us=38.5,
    host_copy_us=4.5,
    host_sync_us=2.0,
    host_collective_peer_us=5.0,
    host_p2p_op_us=5.0,
    async_tp_overhead_us=208.0,
)
"""Where fits start: datasheet-like figures and the launch prices of ``features.launch_cost`` (the fidelity
report's ``before``)."""
PER_DATASET = ("host_factor", "eager_call_us")
"""Constants fitted per dataset: the measuring machine's host speed and what its eager protocol adds to a
call (the label statistic, CPU placement), not the model's."""
FIXED = ("gemm_eff", "gemm_wave_half", "gemm_k_half", "split_loss")
"""Constants the fit leaves alone: the roofline's, used only off the GEMM table."""
FITTED = tuple(f.name for f in dataclasses.fields(SimConstants) if f.name not in FIXED + PER_DATASET)
"""The constants :func:`fit` fits by default."""


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Observations:
    """One measured dataset as the fit and the scores read it: every ok (scenario, schedule, mode) row the
    current executor measures alike, encoded for the simulator, with its label time; and the baselines."""

    name: str
    """The dataset's name (its folder)."""
    machine: str
    """The machine it was measured on, by its dataset's name: the :data:`PER_DATASET` constants are the
    machine's (a benchmark shares them with the dataset of its machine)."""
    world_size: int
    hardware: HardwareProfile
    label_version: int
    host_factor: float
    """The measuring machine's host factor (``features.dataset.host_factor_of``; 1.0 where not measurable)."""
    x: dict[str, np.ndarray]
    """``harness.sim._encode`` of every row, ``[N]`` arrays (each in its own mode)."""
    log_us: np.ndarray
    """Log of each row's label time, us ``[N]``."""
    frame: pd.DataFrame
    """The rows themselves (scenario id, family, op, mode, schedule, time_ms), aligned with ``x``."""
    baselines: dict[str, tuple[dict[str, np.ndarray], np.ndarray, pd.DataFrame]]
    """Baseline key -> (encoded scenario rows, log measured us, their scenario rows), current ones only."""

    def every(self, n: int) -> Observations:
        """Every ``n``-th scenario of these observations (in their order): a lighter fit."""
        ids = set(self.frame["scenario_id"].drop_duplicates().to_numpy()[::n])
        return self.subset(self.frame["scenario_id"].isin(ids).to_numpy()) if n > 1 else self

    def subset(self, keep: np.ndarray) -> Observations:
        """The rows where ``keep`` (bool ``[N]`` over the rows) holds, and the baselines of every scenario
        not left out whole."""
        dropped = set(self.frame["scenario_id"][~keep]) - set(self.frame["scenario_id"][keep])
        base = {}
        for key, (x, y, rows) in self.baselines.items():
            on = ~rows["scenario_id"].isin(dropped).to_numpy()
            base[key] = ({k: v[on] for k, v in x.items()}, y[on], rows[on])
        return dataclasses.replace(
            self,
            x={k: v[keep] for k, v in self.x.items()},
            log_us=self.log_us[keep],
            frame=self.frame[keep],
            baselines=base,
        )


def current_rows(df: pd.DataFrame, label_version: int) -> pd.DataFrame:
    """The rows of a dataset of ``label_version`` that the current executor (:data:`LABEL_VERSION`) would
    measure the same way: all of a current dataset's; of an earlier one, neither the MoE ops (their expert
    GEMMs are grouped now) nor the schedules of :data:`CHANGED_IN_V3`."""
    if label_version >= LABEL_VERSION:
        return df
    return df[~df["op"].isin(MOE_OPS) & ~df["schedule"].isin(CHANGED_IN_V3)]


def observations(directory: str | Path, df: pd.DataFrame | None = None) -> Observations:
    """The :class:`Observations` of a measured dataset directory (or of ``df``, rows of it)."""
    directory = Path(directory)
    manifest = read_manifest(directory) or {}
    version = label_version_of(manifest.get("protocol") or {})
    df = load_dataset(directory) if df is None else df
    return frame_observations(df, dataset_hardware(directory), version, name=directory.name)


def frame_observations(
    df: pd.DataFrame,
    hardware: HardwareProfile,
    label_version: int = LABEL_VERSION,
    name: str = "dataset",
    host_factor: float | None = None,
    machine: str | None = None,
) -> Observations:
    """:class:`Observations` of dataset rows ``df`` measured on ``hardware`` under ``label_version`` (on
    ``machine``, default ``name``, of ``host_factor``; default: ``features.dataset.host_factor_of(df)``,
    else 1)."""
    factor = host_factor_of(df) if host_factor is None else host_factor
    df = current_rows(with_label_times(df), label_version)
    ok = df[df["ok"].astype(bool) & np.isfinite(df["time_ms"].to_numpy(dtype=float))]
    ok = ok.drop_duplicates(["scenario_id", "mode", "schedule"], keep="last").reset_index(drop=True)
    if df.empty:
        raise ValueError(f"{name}: no row the current executor measures alike")
    scenarios = {
        r.scenario_id: scenario_from_row(r, hardware) for r in df.drop_duplicates("scenario_id").itertuples()
    }
    pairs = [(scenarios[r.scenario_id], Schedule.parse(r.schedule)) for r in ok.itertuples()]
    x = _encode_modes(pairs, ok["mode"]) if pairs else {}
    baselines = {}
    first = df.drop_duplicates(["scenario_id", "mode"]).reset_index(drop=True)
    for key in BASELINE_KEYS:
        if key in CHANGED_IN_V3 and label_version < LABEL_VERSION:
            continue
        rows = first[np.isfinite(first[key].to_numpy(dtype=float)) & (first[key] > 0)].reset_index(drop=True)
        if not rows.empty:
            xb = _encode_modes(
                [(scenarios[r.scenario_id], Schedule()) for r in rows.itertuples()], rows["mode"]
            )
            baselines[key] = (xb, np.log(rows[key].to_numpy(dtype=float) * 1e3), rows)
    return Observations(
        name=name,
        machine=machine or name,
        world_size=int(df["world_size"].iloc[0]),
        hardware=hardware,
        label_version=label_version,
        host_factor=float(factor) if np.isfinite(factor) else 1.0,
        x=x,
        log_us=np.log(ok["time_ms"].to_numpy(dtype=float) * 1e3),
        frame=ok[["scenario_id", "family", "op", "mode", "schedule", "world_size", "time_ms"]],
        baselines=baselines,
    )


def _encode_modes(pairs: list, modes: pd.Series) -> dict[str, np.ndarray]:
    """``harness.sim._encode`` of ``pairs``, each in its mode (``modes`` aligned with them)."""
    modes = modes.to_numpy()
    parts = {m: np.flatnonzero(modes == m) for m in sorted(set(modes))}
    encoded = {m: _encode([pairs[i] for i in idx], m) for m, idx in parts.items()}
    order = np.concatenate(list(parts.values()))
    out = {}
    for key in next(iter(encoded.values())):
        stacked = np.concatenate([encoded[m][key] for m in parts])
        out[key] = np.empty_like(stacked)
        out[key][order] = stacked
    return out


# Fitting --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Fit:
    """Fitted constants and the :data:`PER_DATASET` constants fitted for each dataset (by name)."""

    constants: SimConstants
    per_dataset: dict[str, dict[str, float]]
    cost: float
    """Final value of the least-squares objective (half the sum of squared weighted residuals)."""

    def for_dataset(self, obs: Observations) -> SimConstants:
        """The constants with ``obs``'s machine's per-dataset ones (fitted, else its measured host factor)."""
        own = self.per_dataset.get(obs.machine, {"host_factor": obs.host_factor})
        return dataclasses.replace(self.constants, **own)


def fit(
    data: Sequence[Observations],
    *,
    start: SimConstants = DEFAULT_CONSTANTS,
    free: Collection[str] = FITTED,
    relative_weight: float = 0.7,
    baseline_weight: float = 0.3,
    prior_weight: float = 1e-3,
    time_weight: float = 0.3,
    lsq_iterations: int = 8,
    regret_iterations: int = 25,
    verbose: int = 0,
) -> Fit:
    """Fit ``free`` constants, and :data:`PER_DATASET` ones for each dataset (from its measured host factor
    and ``start``), to ``data``, on each constant's logarithm, each world size weighing the same in all
    (:func:`_dataset_weights`), in two stages:

    1. times: least squares on log times (``scipy.optimize.least_squares``, trust region with bounds,
       ``lsq_iterations`` at most): every row, and ``relative_weight`` of it on residuals relative to the
       (scenario, mode)'s measured best's, weighted towards the best's rivals (:func:`_top_weights`: the
       pick depends on them); baselines at ``baseline_weight``; a weak pull to the start;
    2. picks: the simulator's expected regret (:func:`_expected_regret`: its pick as a softmin over its
       times, scored on the measured ones) plus ``time_weight`` times stage 1's mean squared residual
       (``scipy.optimize.minimize``, L-BFGS-B with bounds, ``regret_iterations`` at most).
    """
    from scipy.optimize import least_squares, minimize

    names = [f.name for f in dataclasses.fields(SimConstants)]
    unknown = sorted(set(free) - set(names))
    if unknown:
        raise ValueError(f"fit: free names {unknown} are not SimConstants fields; allowed: {names}")
    if not data:
        raise ValueError("fit needs at least one dataset")
    free = [n for n in names if n in set(free) and n not in PER_DATASET]
    values = start.to_dict()
    machines = list(dict.fromkeys(o.machine for o in data))
    slot = [machines.index(o.machine) for o in data]
    own = [{"host_factor": next(o.host_factor for o in data if o.machine == m),
            "eager_call_us": values["eager_call_us"]} for m in machines]  # fmt: skip
    theta0 = np.log(
        [max(values[n], 1e-3) for n in free] + [max(d[k], 1e-3) for d in own for k in PER_DATASET]
    )
    upper = np.log([UPPER_BOUND.get(n, np.inf) for n in free] + [np.inf] * (len(PER_DATASET) * len(own)))
    theta0 = np.minimum(theta0, upper - 1e-9)
    weights = _dataset_weights(data)
    tops = [_top_weights(o) if len(o.log_us) else (None, None, None) for o in data]

    def per_dataset(theta: np.ndarray, i: int) -> dict[str, float]:
        at = len(free) + len(PER_DATASET) * i
        return dict(zip(PER_DATASET, np.exp(theta[at : at + len(PER_DATASET)]).tolist(), strict=True))

    def constants(theta: np.ndarray, i: int) -> SimConstants:
        fitted = dict(zip(free, np.exp(theta[: len(free)]).tolist(), strict=True))
        return SimConstants(**{**values, **fitted, **per_dataset(theta, slot[i])})

    def terms(theta: np.ndarray) -> tuple[np.ndarray, float]:
        """Stage 1's residuals and the weighted expected regret."""
        parts, regret = [], 0.0
        for i, (obs, weight, (best, near, group)) in enumerate(zip(data, weights, tops, strict=True)):
            c = constants(theta, i)
            for key, (x, y, _) in obs.baselines.items():
                rb = np.log(_baselines_us(c, x, (key,))[key]) - y
                parts.append(math.sqrt(weight * baseline_weight) * rb)
            if not len(obs.log_us):  # a benchmark of collectives alone
                continue
            log_sim = np.log(_schedule_us(c, obs.x))
            r = log_sim - obs.log_us
            parts += [
                math.sqrt(weight * (1 - relative_weight)) * r * near,
                math.sqrt(weight * relative_weight) * near * (r - r[best]),
            ]
            regret += weight * len(r) * _expected_regret(log_sim, obs.log_us - obs.log_us[best], group)
        parts.append(math.sqrt(prior_weight) * (theta - theta0))
        out = np.concatenate(parts)
        return np.where(np.isfinite(out), out, 0.0), regret / sum(len(o.log_us) for o in data)

    bounds = (np.full_like(upper, -np.inf), upper)
    theta = theta0
    if lsq_iterations:
        theta = least_squares(lambda t: terms(t)[0], theta0, bounds=bounds, max_nfev=lsq_iterations,
                              x_scale="jac", verbose=verbose).x  # fmt: skip
    n_res = len(terms(theta0)[0])

    def objective(t: np.ndarray) -> float:
        r, regret = terms(t)
        return regret + time_weight * float(r @ r) / n_res

    if regret_iterations:
        options = {"maxiter": regret_iterations, "eps": 1e-3, "disp": bool(verbose)}
        box = list(zip(*bounds, strict=True))
        theta = minimize(objective, theta, method="L-BFGS-B", bounds=box, options=options).x
    fitted = {n: float(f"{v:.4g}") for n, v in zip(free, np.exp(theta[: len(free)]).tolist(), strict=True)}
    own_fitted = {
        m: {k: float(f"{v:.4g}") for k, v in per_dataset(theta, j).items()} for j, m in enumerate(machines)
    }
    return Fit(constants=SimConstants(**{**values, **fitted}), per_dataset=own_fitted, cost=objective(theta))


SOFTMIN = 0.03
"""Temperature of the softmin pick of :func:`_expected_regret`, in log time: schedules simulated within about
3% of the fastest share the pick."""


def _expected_regret(log_sim: np.ndarray, log_regret: np.ndarray, group: np.ndarray) -> float:
    """Mean over groups (each (scenario, mode), ``group`` ``[N]``) of the measured log regret (``[N]``) of
    the simulator's pick, taken as a softmin (:data:`SOFTMIN`) over its log times ``log_sim`` ``[N]``."""
    score = -log_sim / SOFTMIN
    top = np.full(group.max() + 1, -np.inf)
    np.maximum.at(top, group, score)
    p = np.exp(score - top[group])
    total = np.bincount(group, p)
    return float(np.mean(np.bincount(group, p * log_regret) / total))


NEAR_BEST = 0.1
"""Relative residuals weigh ``1 / (1 + (t / t_best - 1) / NEAR_BEST)``: a schedule measured 10% slower than
its scenario's best half as much as the best's rivals, 100% slower a tenth."""


def _top_weights(obs: Observations) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each row of ``obs``: the row of its (scenario, mode)'s measured best, int ``[N]``, the weight of
    its residuals (:data:`NEAR_BEST`), ``[N]``, and its (scenario, mode) group, int ``[N]``."""
    group = obs.frame.groupby(["scenario_id", "mode"], sort=False).ngroup().to_numpy()
    order = np.lexsort((obs.log_us, group))
    first = order[np.r_[True, group[order][1:] != group[order][:-1]]]
    best = first[np.argsort(group[first])][group]
    gap = np.exp(obs.log_us - obs.log_us[best]) - 1.0
    return best, 1.0 / (1.0 + gap / NEAR_BEST), group


def _dataset_weights(data: Sequence[Observations]) -> list[float]:
    """Each dataset's weight per row: every world size weighs the same in all, shared by its datasets'
    rows alike (a world size's rows weigh ``1 / its rows``), scaled to a mean of 1 over the rows."""
    rows_of: dict[int, int] = {}
    for obs in data:
        rows_of[obs.world_size] = rows_of.get(obs.world_size, 0) + len(obs.log_us)
    raw = [1.0 / rows_of[obs.world_size] for obs in data]
    total = sum(len(o.log_us) for o in data)
    scale = total / sum(w * len(o.log_us) for w, o in zip(raw, data, strict=True))
    return [w * scale for w in raw]


# Scoring the simulator's picks ----------------------------------------------------------------------------


PICK_COLUMNS = ("scenario_id", "family", "op", "mode", "world_size", "pick", "best", "regret",
                "serial_regret",
                "sim_gain", "slower_than_serial")  # fmt: skip
"""The columns of :func:`pick_table`."""


def pick_table(obs: Observations, constants: SimConstants) -> pd.DataFrame:
    """The simulator's own pick in every (scenario, mode) of ``obs``, among the schedules measured there,
    scored on the measured label times: one row per (scenario, mode) with ``family``, ``op``, ``mode``,
    ``world_size``, ``pick``, ``best``, ``regret`` (``t_pick / t_best - 1``) and ``slower_than_serial``
    (the pick over 2% slower than the measured ``serial/sm``, where measured)."""
    import pandas as pd

    if not len(obs.log_us):
        return pd.DataFrame(columns=list(PICK_COLUMNS)).astype(dict.fromkeys(("regret", "sim_gain"), float))
    frame = obs.frame.assign(sim_us=_schedule_us(constants, obs.x))
    rows = []
    for (sid, mode), g in frame.groupby(["scenario_id", "mode"], sort=False):
        pick, best = g.loc[g["sim_us"].idxmin()], g.loc[g["time_ms"].idxmin()]
        serial = g[g["schedule"] == "serial/sm"]
        serial_ms = float(serial["time_ms"].iloc[0]) if len(serial) else float("nan")
        rows.append(
            {
                "scenario_id": sid,
                "family": pick["family"],
                "op": pick["op"],
                "mode": mode,
                "world_size": int(pick["world_size"]),
                "pick": pick["schedule"],
                "best": best["schedule"],
                "regret": float(pick["time_ms"] / best["time_ms"] - 1.0),
                "serial_regret": serial_ms / float(best["time_ms"]) - 1.0,
                "sim_gain": float(serial["sim_us"].iloc[0] / pick["sim_us"]) - 1.0 if len(serial) else 0.0,
                "slower_than_serial": bool(pick["time_ms"] > 1.02 * serial_ms),
            }
        )
    return pd.DataFrame(rows)


GUARD_GRID: tuple[float | None, ...] = (None, 0.0, 0.01, 0.02, 0.03, 0.05, 0.1)
"""Candidate guards (:func:`choose_guard`), the laxest first."""


def guarded(picks: pd.DataFrame, min_gain: float | None) -> pd.DataFrame:
    """``picks`` (:func:`pick_table`) with every pick the simulator predicts less than ``min_gain`` faster
    than serial/sm replaced by serial/sm (where measured); None: as they are."""
    if min_gain is None:
        return picks
    fall = (
        (picks["sim_gain"] < min_gain) & (picks["pick"] != "serial/sm") & np.isfinite(picks["serial_regret"])
    )
    return picks.assign(
        pick=picks["pick"].where(~fall, "serial/sm"),
        regret=picks["regret"].where(~fall, picks["serial_regret"]),
        slower_than_serial=picks["slower_than_serial"] & ~fall,
    )


def choose_guard(picks: pd.DataFrame) -> dict[str, float | None]:
    """Per mode, the guard of :data:`GUARD_GRID` whose :func:`guarded` picks have the lowest mean serial-safe
    loss (``training.metrics.pick_loss``: the log regret, plus the log slowdown against serial again), ties
    to the laxest: the never-slower-than-serial guard of a simulated model's answers."""
    out = {}
    for mode, g in picks.groupby("mode"):
        losses = []
        for min_gain in GUARD_GRID:
            q = guarded(g, min_gain)
            t = np.log1p(q["regret"].to_numpy())
            s = np.log1p(q["serial_regret"].to_numpy())
            losses.append(float(np.nanmean(t + np.maximum(0.0, t - s))))
        out[str(mode)] = GUARD_GRID[int(np.argmin(np.round(losses, 6)))]
    return out


def regret_summary(picks: pd.DataFrame, by: Sequence[str] = ("world_size", "mode")) -> list[dict]:
    """Geometric-mean regret, top-1 share, scenarios and slow picks of pick tables, per ``by`` group."""
    out = []
    for key, g in picks.groupby(list(by), sort=True):
        key = key if isinstance(key, tuple) else (key,)
        out.append(
            {
                **dict(zip(by, [k.item() if hasattr(k, "item") else k for k in key], strict=True)),
                "geomean_regret": round(float(np.expm1(np.mean(np.log1p(g["regret"].to_numpy(float))))), 5),
                "top1": round(float(np.mean(g["pick"] == g["best"])), 4),
                "n_scenarios": len(g),
                "n_slower_than_serial_2pct": int(g["slower_than_serial"].sum()),
            }
        )
    return out


# Holding model families out -------------------------------------------------------------------------------


def family_folds(data: Sequence[Observations], k: int = 5) -> list[tuple[str, ...]]:
    """Model families in ``k`` folds of about equal rows: the largest family first, each into the fold with
    fewest rows so far (deterministic). A family is one fold at every world size and in every dataset."""
    sizes: dict[str, int] = {}
    for obs in data:
        for family, n in obs.frame["family"].value_counts().items():
            sizes[family] = sizes.get(family, 0) + int(n)
    folds: list[list[str]] = [[] for _ in range(k)]
    load = [0] * k
    for family in sorted(sizes, key=lambda f: (-sizes[f], f)):
        i = load.index(min(load))
        folds[i].append(family)
        load[i] += sizes[family]
    return [tuple(sorted(f)) for f in folds if f]


def cross_validate(
    data: Sequence[Observations],
    folds: Sequence[Collection[str]],
    thin: dict[str, int] | None = None,
    fit_map: Callable = map,
    **fit_options,
) -> tuple[pd.DataFrame, list[Fit]]:
    """Fit on every fold's complement (each dataset's every ``thin[name]``-th scenario of it; the fits
    through ``fit_map``, e.g. a process pool's ``map``), score the simulator's picks on the fold's families
    (their datasets' fitted host factors from the rest of their rows): the held-out pick table of every
    scenario, and the fits."""
    import pandas as pd

    trains = []
    for held in folds:
        kept = [o.subset(~o.frame["family"].isin(set(held)).to_numpy()).every((thin or {}).get(o.name, 1))
                for o in data]  # fmt: skip
        trains.append([o for o in kept if len(o.log_us) or o.baselines])
    fits = list(fit_map(functools.partial(fit, **fit_options), trains))
    tables = []
    for held, fitted in zip(folds, fits, strict=True):
        for obs in data:
            test = obs.frame["family"].isin(set(held)).to_numpy()
            if test.any():
                tables.append(pick_table(obs.subset(test), fitted.for_dataset(obs)).assign(dataset=obs.name))
    return pd.concat(tables, ignore_index=True), fits


# The error by term ------------------------------------------------------------------------------------------


def schedule_family(schedule: str) -> str:
    """A schedule's family for the error breakdown: ``granularity/executor`` plus the grain of ``finer``
    (``finer/dma/chunk``); splits and priority pooled."""
    s = Schedule.parse(schedule)
    return f"{s.granularity}/{s.executor}" + (f"/{s.grain}" if s.granularity == "finer" else "")


def _stats(err: np.ndarray) -> dict[str, float | int]:
    """Median (bias), median and 90th percentile of ``|err|`` of log errors, as ratios minus one."""
    err = err[np.isfinite(err)]
    if not len(err):
        return {"n": 0}
    return {
        "n": len(err),
        "bias": round(float(np.expm1(np.median(err))), 4),
        "median_abs": round(float(np.expm1(np.median(np.abs(err)))), 4),
        "p90_abs": round(float(np.expm1(np.percentile(np.abs(err), 90))), 4),
    }


def term_errors(obs: Observations, constants: SimConstants) -> list[dict]:
    """The simulator's error on ``obs`` by term, each row ``{term, op, mode, world_size, ...stats}``: the
    baselines (GEMM alone, NCCL collective alone, copy engines alone, async-TP), the host-bound eager calls
    (``host``: the launch price times the host factor above the device timeline), and every schedule family
    (time, and ``.../relative``: with each scenario's mean error removed, what ranking sees)."""
    out = []
    for key, (x, y, rows) in obs.baselines.items():
        err = np.log(_baselines_us(constants, x, (key,))[key]) - y
        for (op, mode), idx in rows.groupby(["op", "mode"]).indices.items():
            out.append({"term": key.removesuffix("_ms"), "op": op, "mode": mode, **_stats(err[idx])})
    if not len(obs.log_us):
        return [{**row, "world_size": obs.world_size, "dataset": obs.name} for row in out]
    sim = _schedule_us(constants, obs.x)
    err = np.log(sim) - obs.log_us
    frame = obs.frame.assign(err=err, family_=[schedule_family(s) for s in obs.frame["schedule"]])
    group = frame.groupby(["scenario_id", "mode"], sort=False)["err"]
    frame = frame.assign(relative=frame["err"] - group.transform("mean"))
    gpu = _schedule_us(dataclasses.replace(constants, host_factor=0.0), obs.x)
    host = constants.host_factor * host_price_us(constants, obs.x["launch"])
    frame = frame.assign(host_bound=(obs.x["graph"] == 0) & (host > gpu))
    for (op, mode), g in frame.groupby(["op", "mode"]):
        if mode == "eager":
            out.append(
                {"term": "host", "op": op, "mode": mode, **_stats(g.loc[g["host_bound"], "err"].to_numpy())}
            )
        for fam, f in g.groupby("family_"):
            out.append({"term": fam, "op": op, "mode": mode, **_stats(f["err"].to_numpy())})
            out.append(
                {"term": f"{fam}/relative", "op": op, "mode": mode, **_stats(f["relative"].to_numpy())}
            )
    return [{**row, "world_size": obs.world_size, "dataset": obs.name} for row in out]


# The dataset card and ficco bench --calibrate-from ---------------------------------------------------------


def calibrate(
    df: pd.DataFrame,
    hardware: HardwareProfile,
    *,
    start: SimConstants = DEFAULT_CONSTANTS,
    iterations: int = 10,
) -> SimConstants:
    """The constants refitted to one measured dataset's rows ``df`` (:func:`fit`'s first stage,
    ``iterations`` at most; its host factor and eager call time included: the constants answer for that
    machine). ValueError when ``df`` has no usable row."""
    obs = frame_observations(df, hardware)
    fitted = fit([obs], start=start, lsq_iterations=iterations, regret_iterations=0)
    return fitted.for_dataset(obs)


def agreement(
    df: pd.DataFrame,
    hardware: HardwareProfile,
    constants: SimConstants = DEFAULT_CONSTANTS,
    *,
    tolerance: float = 0.0,
) -> float:
    """Fraction of ``df``'s (scenario, mode) rows where the simulator's pick (its fastest among the schedules
    measured ok) is the measured best, or with ``tolerance`` > 0 measured within ``1 + tolerance`` of the
    best (both label times). NaN for a dataset without an ok row."""
    try:
        picks = pick_table(frame_observations(df, hardware), constants)
    except ValueError:
        return float("nan")
    if tolerance > 0:
        return float(np.mean(picks["regret"] <= tolerance))
    return float(np.mean(picks["pick"] == picks["best"]))
