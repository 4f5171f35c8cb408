"""Two datasets side by side (``ficco dataset compare A B``): where they measured the same or neighbouring
scenarios, how their best schedules and time ratios differ, against the run-to-run noise of their
re-measures. This is how a user learns that an executor or protocol change moved the truth.

The **time ratio** of a schedule is its time over ``serial/sm``'s in the same scenario and mode: ratios
carry across neighbouring sizes and host speeds far better than times. Two comparisons:

- **Matched pairs** (:func:`match_scenarios`): each scenario of A with its nearest scenario of B of the same
  op, world size, dtype, expert count and imbalance whose split rows (``Scenario.rows``: m, or m * top_k for
  the MoE ops), n and k each lie within a factor ``within`` (2) of A's, nearest in log2 space, the same
  scenario id first. Per pair and mode: each schedule's ratio in A and in B (:func:`pair_shifts`), and the
  fastest schedules: how often they agree and what A's fastest costs on B (:func:`pick_table`).
- **Work classes** (:func:`class_summary`): every scenario of each dataset, unpaired, in its class of GEMM
  work (``Scenario.gemm_flops``, decades: ``WORK_EDGES``): the median ratio in A against the median in B.
  It works where the two datasets hold no neighbours (a coverage sweep placed between the measured shapes),
  at the price of comparing other shapes of the same work.

Both are broken down by op group (dense; MoE, and MoE by expert count), mode, schedule family
(:func:`family_of`: ``granularity/executor``, the ``/hp`` twins apart) and work class. A pair of one
scenario id also compares two times (which compare only at the same shape): ``serial/sm``'s and the GEMM
alone's (the ``gemm_alone_ms`` baseline: where an executor change made the GEMM itself faster, e.g. grouped
expert GEMMs).

The **noise band** is how far a re-measure of the same scenarios moves the same measure: the 10th to 90th
percentile of ``log(value_2 / value_1)`` over every (scenario, schedule) of the datasets' ``noise.parquet``
re-measures (pooled), per mode, measure and work class (:func:`noise_bands`). A shift is **beyond noise**
when the median shift (pairs) or the shift of the medians (classes) lies outside that band, from at least
``MIN_SCENARIOS`` scenarios on each side. See docs/protocol.md, "Comparing datasets".
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ficco.features import MOE_OPS, SERIAL, Schedule, all_schedules
from ficco.features.dataset import check_same_hardware, dataset_hardware, load_datasets, scenario_from_row
from ficco.features.label_source import LABEL_VERSIONS, LabelSource
from ficco.harness.card import dataset_label_source
from ficco.tables import text_table

if TYPE_CHECKING:
    import pandas as pd

    from ficco.features import HardwareProfile

WITHIN = 2.0
"""Default neighbourhood: B's scenario neighbours A's when rows, n and k each lie within this factor."""
MATCH_KEYS: tuple[str, ...] = ("op", "world_size", "dtype", "experts", "imbalance")
"""Scenario fields two matched scenarios share exactly."""
SIZE_AXES: tuple[str, ...] = ("rows", "n", "k")
"""Scenario sizes a neighbour may differ in (by at most ``within`` each): split rows, n, k."""
WORK_EDGES: tuple[float, ...] = (1e10, 1e11, 1e12, 1e13)
"""Edges (FLOPs of one rank's GEMM work, ``Scenario.gemm_flops``) of the work classes."""
WORK_CLASSES: tuple[str, ...] = (
    "< 10 GFLOP", "10-100 GFLOP", "0.1-1 TFLOP", "1-10 TFLOP", ">= 10 TFLOP",
)  # fmt: skip
"""The classes ``WORK_EDGES`` bound, smallest first."""
ALL_SIZES = "all sizes"
SIZES: tuple[str, ...] = (ALL_SIZES, *WORK_CLASSES)
"""What a shift is told by, in order: all sizes, then each work class."""
BAND_QUANTILES = (0.1, 0.9)
"""The noise band: these quantiles of a re-measure's shifts."""
MIN_BAND_PAIRS = 20
"""A work class with fewer re-measured pairs of a mode and measure takes its band over all sizes."""
MIN_SCENARIOS = 3
"""Scenarios (on each side) a shift needs before it is called beyond noise or not."""
SERIAL_TIME = f"{SERIAL} ms"
"""The family under which ``serial/sm`` compares its time itself (pairs of one scenario id only)."""
GEMM_ALONE = "GEMM alone ms"
"""The family under which the ``gemm_alone_ms`` baseline compares (pairs of one scenario id only)."""
MEASURES: dict[str, str] = {SERIAL_TIME: "time", GEMM_ALONE: "time"}
"""The measure of a family that is not a time ratio (every other family's is ``ratio``)."""
MOE = "moe"
"""The op group of every MoE scenario (beside one group per expert count)."""
KEYS = ["group", "mode", "family", "size"]
"""What a shift is broken down by."""


@dataclass(frozen=True)
class Side:
    """One dataset of a comparison."""

    path: Path
    rows: pd.DataFrame
    """Its rows without superseded schedules, with ``time_ms`` (``features.dataset.load_datasets``)."""
    noise: pd.DataFrame | None
    """Its re-measured rows (``noise.parquet``), None without one."""
    source: LabelSource
    hardware: HardwareProfile


def load_side(path: str | Path) -> Side:
    """Dataset directory ``path`` as a :class:`Side`; ``ValueError`` naming the path when it is missing, not
    a dataset or empty."""
    path = Path(path)
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is a file"
        raise ValueError(f"{path} {what}: give a dataset directory (written by `ficco bench`)")
    rows, noise = load_datasets([path])
    if rows.empty:
        raise ValueError(f"{path} holds no measured rows: nothing to compare")
    return Side(path, rows, noise, dataset_label_source(path, rows), dataset_hardware(path))


def check_comparable(a: Side, b: Side, *, other_hardware: bool = False) -> None:
    """Raise ``ValueError`` when ``a`` and ``b`` cannot be compared: another world size (scenarios match only
    at one), or other hardware unless ``other_hardware`` (then their time ratios are compared): for two
    measured datasets the machine (``features.dataset.check_same_hardware``), for a simulated one the
    hardware profile (its fingerprint names no machine)."""
    if a.source.world_size != b.source.world_size:
        raise ValueError(
            f"{a.path} was measured at world size {a.source.world_size} and {b.path} at "
            f"{b.source.world_size}: scenarios compare only at one world size (at another, a collective "
            "moves another share of the data); give two datasets of one world size"
        )
    if other_hardware:
        return
    advice = "Datasets of one machine compare by default; add --other-hardware to compare their time ratios"
    if not (a.source.measured and b.source.measured):
        if a.hardware != b.hardware:
            raise ValueError(
                f"{a.path} and {b.path} are of other hardware profiles ({a.hardware.id} vs {b.hardware.id}). "
                + advice
            )
        return
    try:
        check_same_hardware([a.path, b.path])
    except ValueError as err:
        raise ValueError(f"{err}. {advice}") from None


def setting_changes(first: dict[str, Any], second: dict[str, Any]) -> list[str]:
    """``key: first -> second`` for every protocol setting (``LabelSource.settings``) that differs, but
    ``modes`` (which modes were timed moves no label)."""
    return [f"{key}: {first.get(key)} -> {second.get(key)}" for key in sorted(set(first) | set(second))
            if key != "modes" and first.get(key) != second.get(key)]  # fmt: skip


@functools.cache
def family_of(schedule: str) -> str:
    """A schedule's family with the ``/hp`` twins apart: ``finer/dma/s4/chunk/hp`` -> ``finer/dma/hp``."""
    parsed = Schedule.parse(schedule)
    return parsed.family + ("/hp" if parsed.priority == "high" else "")


FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(family_of(str(s)) for s in all_schedules()))
"""Every family of :func:`family_of`, in canonical schedule order (``serial/sm`` first)."""


def op_group(op: str, experts: int) -> str:
    """``dense`` for the tensor-parallel ops, ``moe, <experts> experts`` for the MoE ops."""
    return f"{MOE}, {experts} experts" if op in MOE_OPS else "dense"


def work_class(flops: float) -> str:
    """The work class (``WORK_CLASSES``) of one rank's GEMM work ``flops``."""
    return WORK_CLASSES[int(np.searchsorted(WORK_EDGES, flops, side="right"))]


def scenario_table(rows: pd.DataFrame, hardware: HardwareProfile) -> pd.DataFrame:
    """One row per scenario of dataset ``rows``: ``scenario_id``, ``MATCH_KEYS``, ``SIZE_AXES``, ``group``
    (:func:`op_group`), ``flops`` (``Scenario.gemm_flops``) and ``size`` (its work class)."""
    import pandas as pd

    first = rows.drop_duplicates("scenario_id")
    scenarios = [scenario_from_row(row, hardware) for row in first.itertuples()]
    return pd.DataFrame(
        {
            "scenario_id": first["scenario_id"].to_numpy(),
            **{key: first[key].to_numpy() for key in MATCH_KEYS},
            "rows": [s.rows for s in scenarios],
            "n": first["n"].to_numpy(),
            "k": first["k"].to_numpy(),
            "group": [op_group(s.op, s.experts) for s in scenarios],
            "flops": [s.gemm_flops for s in scenarios],
            "size": [work_class(s.gemm_flops) for s in scenarios],
        }
    )


def match_scenarios(a: pd.DataFrame, b: pd.DataFrame, within: float = WITHIN) -> pd.DataFrame:
    """For each scenario of ``a`` (:func:`scenario_table`), its nearest scenario of ``b`` with the same
    ``MATCH_KEYS`` and each of ``SIZE_AXES`` within a factor ``within`` (>= 1; ``math.inf``: any size): the
    same scenario id first, then the least ``distance`` (``sqrt(sum log2(b / a)**2)``), ties to the first id.
    Columns ``a_id``, ``b_id``, ``group``, ``size`` (A's), ``distance``, ``spread`` (the largest factor
    between them on one axis) and ``exact`` (same id); scenarios of ``a`` without a neighbour are left out."""
    if not within >= 1.0:
        raise ValueError(f"within must be a factor >= 1 (1: the same sizes only); got {within!r}")
    pairs = a.merge(b.drop(columns=["group", "size"]), on=list(MATCH_KEYS), suffixes=("_a", "_b"))
    logs = np.abs(np.stack([np.log2(pairs[f"{x}_b"] / pairs[f"{x}_a"]).to_numpy(float) for x in SIZE_AXES]))
    pairs = pairs.assign(
        a_id=pairs["scenario_id_a"],
        b_id=pairs["scenario_id_b"],
        distance=np.sqrt((logs**2).sum(axis=0)),
        spread=np.exp2(logs.max(axis=0, initial=0.0)),
        exact=pairs["scenario_id_a"] == pairs["scenario_id_b"],
    )
    pairs = pairs[pairs["spread"] <= within * (1 + 1e-9)]
    nearest = pairs.sort_values(["a_id", "exact", "distance", "b_id"], ascending=[True, False, True, True])
    columns = ["a_id", "b_id", "group", "size", "distance", "spread", "exact"]
    return nearest.drop_duplicates("a_id")[columns].reset_index(drop=True)


def ratio_table(rows: pd.DataFrame, scenarios: pd.DataFrame) -> pd.DataFrame:
    """One row per (scenario, mode, schedule) of dataset ``rows`` measured ok where ``serial/sm`` was too:
    ``scenario_id``, ``mode``, ``schedule``, ``family`` (:func:`family_of`), ``time_ms``, ``serial_ms``,
    ``value`` (the time ratio ``time_ms / serial_ms``), ``in_best_set``, ``gemm_alone_ms``, and the
    scenario's ``group``, ``flops`` and ``size`` (of ``scenarios``, :func:`scenario_table`)."""
    import pandas as pd

    ok = rows[rows["ok"].astype(bool) & np.isfinite(rows["time_ms"].to_numpy(float))]
    key = ["scenario_id", "mode"]
    serial = ok[ok["schedule"] == str(SERIAL)].set_index(key)["time_ms"]
    serial_ms = serial.reindex(pd.MultiIndex.from_frame(ok[key])).to_numpy(float)
    out = ok[[*key, "schedule", "time_ms", "in_best_set", "gemm_alone_ms"]].assign(serial_ms=serial_ms)
    out = out[np.isfinite(out["serial_ms"].to_numpy(float))]
    out = out.assign(value=out["time_ms"] / out["serial_ms"], family=out["schedule"].map(family_of))
    return out.merge(scenarios[["scenario_id", "group", "flops", "size"]], on="scenario_id")


def value_table(ratios: pd.DataFrame) -> pd.DataFrame:
    """What shifts are measured on, from ``ratio_table`` ``ratios``: per (scenario, mode) each schedule's
    time ratio but ``serial/sm``'s (family :func:`family_of`), and two times in ms: ``serial/sm``'s
    (``schedule`` and family ``SERIAL_TIME``) and the GEMM alone's (``GEMM_ALONE``, where measured); columns
    ``scenario_id``, ``group``, ``size``, ``mode``, ``schedule``, ``family``, ``value``."""
    import pandas as pd

    serial = ratios[ratios["schedule"] == str(SERIAL)]
    gemm = serial[np.isfinite(serial["gemm_alone_ms"].to_numpy(float)) & (serial["gemm_alone_ms"] > 0)]
    parts = [
        ratios[ratios["schedule"] != str(SERIAL)],
        serial.assign(schedule=SERIAL_TIME, family=SERIAL_TIME, value=serial["serial_ms"]),
        gemm.assign(schedule=GEMM_ALONE, family=GEMM_ALONE, value=gemm["gemm_alone_ms"]),
    ]
    columns = ["scenario_id", "group", "size", "mode", "schedule", "family", "value"]
    return pd.concat([p[columns] for p in parts], ignore_index=True)


def pair_shifts(va: pd.DataFrame, vb: pd.DataFrame, matches: pd.DataFrame) -> pd.DataFrame:
    """Per matched pair (``matches``), mode and ``value_table`` row of both (``va`` of A, ``vb`` of B; the
    times only for a pair of one scenario id): ``a_id``, ``b_id``, ``group``, ``size`` (A's),
    ``mode``, ``family``, ``value_a``, ``value_b`` and ``shift`` (``log(value_b / value_a)``)."""
    left = matches[["a_id", "b_id", "group", "size", "exact"]].merge(
        va.drop(columns=["group", "size"]), left_on="a_id", right_on="scenario_id"
    )
    both = left.merge(
        vb[["scenario_id", "mode", "schedule", "value"]],
        left_on=["b_id", "mode", "schedule"],
        right_on=["scenario_id", "mode", "schedule"],
        suffixes=("_a", "_b"),
    )
    both = both[both["exact"].to_numpy(bool) | ~both["family"].isin(list(MEASURES)).to_numpy()]
    out = both[["a_id", "b_id", "group", "size", "mode", "family", "value_a", "value_b"]]
    return out.assign(shift=np.log(out["value_b"] / out["value_a"])).reset_index(drop=True)


def fastest(ratios: pd.DataFrame) -> pd.DataFrame:
    """The row of ``ratio_table`` ``ratios`` of each (scenario, mode)'s fastest schedule (ties: the first)."""
    return ratios.loc[ratios.groupby(["scenario_id", "mode"], sort=False)["time_ms"].idxmin()]


def pick_table(ra: pd.DataFrame, rb: pd.DataFrame, matches: pd.DataFrame) -> pd.DataFrame:
    """Per matched pair and mode measured in both (``ratio_table`` ``ra`` of A, ``rb`` of B): ``a_id``,
    ``b_id``, ``group``, ``size`` (A's), ``mode``, ``best_a``/``best_b`` (each side's fastest schedule),
    ``family_a``/``family_b``, ``in_set`` (A's fastest is in B's best set) and ``loss`` (B's time of A's
    fastest over B's fastest, minus 1; NaN where A's fastest was not measured ok in B)."""
    import pandas as pd

    columns = ["scenario_id", "mode", "schedule", "family", "time_ms"]
    left = matches[["a_id", "b_id", "group", "size"]].merge(
        fastest(ra)[columns], left_on="a_id", right_on="scenario_id"
    )
    both = left.merge(
        fastest(rb)[columns],
        left_on=["b_id", "mode"],
        right_on=["scenario_id", "mode"],
        suffixes=("_a", "_b"),
    )
    index = pd.MultiIndex.from_arrays([both["b_id"], both["mode"], both["schedule_a"]])
    a_pick_on_b = rb.set_index(["scenario_id", "mode", "schedule"]).reindex(index)
    out = both[["a_id", "b_id", "group", "size", "mode"]].assign(
        best_a=both["schedule_a"],
        best_b=both["schedule_b"],
        family_a=both["family_a"],
        family_b=both["family_b"],
        in_set=a_pick_on_b["in_best_set"].fillna(False).astype(bool).to_numpy(),
        loss=a_pick_on_b["time_ms"].to_numpy(float) / both["time_ms_b"].to_numpy(float) - 1.0,
    )
    return out.reset_index(drop=True)


def remeasure(side: Side) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """``pair_shifts`` and ``pick_table`` of ``side``'s sweep against its re-measure (each re-measured
    scenario paired with itself), or None without a re-measure."""
    if side.noise is None or side.noise.empty:
        return None
    scenarios = scenario_table(side.rows, side.hardware)
    again = scenarios[scenarios["scenario_id"].isin(side.noise["scenario_id"])]
    matches = match_scenarios(again, again, within=1.0)
    ra, rb = ratio_table(side.rows, again), ratio_table(side.noise, again)
    return pair_shifts(value_table(ra), value_table(rb), matches), pick_table(ra, rb, matches)


def _measure(family: pd.Series) -> pd.Series:
    """The measure of each family: ``MEASURES``'s, else ``ratio``."""
    return family.map(MEASURES).fillna("ratio")


def noise_bands(shifts: pd.DataFrame) -> pd.DataFrame:
    """The noise band of re-measure shifts ``shifts`` (``pair_shifts``): per ``mode``, ``measure`` and
    ``size`` (each work class and ``ALL_SIZES``), ``lo``/``hi`` (``BAND_QUANTILES`` of the shifts, log units)
    and ``pairs``; a class with fewer than ``MIN_BAND_PAIRS`` pairs takes its band over all sizes."""
    import pandas as pd

    shifts = shifts.assign(measure=_measure(shifts["family"]))
    grouped = pd.concat([shifts, shifts.assign(size=ALL_SIZES)]).groupby(["mode", "measure", "size"])["shift"]
    lo, hi = BAND_QUANTILES
    bands = pd.DataFrame({"lo": grouped.quantile(lo), "hi": grouped.quantile(hi), "pairs": grouped.size()})
    overall = bands.xs(ALL_SIZES, level="size")
    few = (bands["pairs"] < MIN_BAND_PAIRS).to_numpy()
    for name in ("lo", "hi"):
        fallback = overall[name].reindex(bands.index.droplevel("size")).to_numpy()
        bands[name] = np.where(few, fallback, bands[name])
    return _order(bands.reset_index())


def _with_totals(frame: pd.DataFrame, all_sizes: bool = True) -> pd.DataFrame:
    """``frame`` (rows with ``group`` and ``size``) plus its rows again under the group ``MOE`` where it holds
    more than one MoE group, and (``all_sizes``) under ``ALL_SIZES``."""
    import pandas as pd

    moe = frame[frame["group"].str.startswith(MOE)]
    frame = pd.concat([frame, moe.assign(group=MOE)]) if moe["group"].nunique() > 1 else frame
    return pd.concat([frame.assign(size=ALL_SIZES), frame]) if all_sizes else frame


def _group_key(group: str) -> tuple[int, int]:
    """Sort key of an op group: dense, ``MOE``, then the MoE groups by expert count."""
    if group.startswith(f"{MOE}, "):
        return (1, int(group.split()[1]))
    return {"dense": (0, 0), MOE: (1, 0)}.get(group, (2, 0))


def _order(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` sorted by those of group, mode, measure, family and size it has, each in natural order."""
    families = [SERIAL_TIME, GEMM_ALONE, *FAMILIES]
    keys = {"group": _group_key, "family": families.index, "size": SIZES.index}
    columns = [c for c in ("group", "mode", "measure", "family", "size") if c in frame.columns]
    ordered = frame.sort_values(
        columns, key=lambda s: s.map(keys[s.name]) if s.name in keys else s, kind="stable"
    )
    return ordered.reset_index(drop=True)


def _verdict(summary: pd.DataFrame, bands: pd.DataFrame | None) -> pd.DataFrame:
    """``summary`` (rows of ``KEYS``, ``shift``, ``scenarios_a``, ``scenarios_b``) with ``band_lo`` and
    ``band_hi`` (its mode, measure and work class's noise band, log units; NaN without one) and ``beyond``:
    the shift outside the band (None without a band or with fewer than ``MIN_SCENARIOS`` scenarios on a
    side)."""
    summary = summary.assign(measure=_measure(summary["family"]))
    if bands is None:
        summary = summary.assign(band_lo=np.nan, band_hi=np.nan)
    else:
        band = bands.rename(columns={"lo": "band_lo", "hi": "band_hi"})
        summary = summary.merge(
            band[["mode", "measure", "size", "band_lo", "band_hi"]],
            on=["mode", "measure", "size"],
            how="left",
        )
    judged = np.isfinite(summary["band_lo"].to_numpy(float)) & (
        summary[["scenarios_a", "scenarios_b"]].min(axis=1).to_numpy() >= MIN_SCENARIOS
    )
    outside = (summary["shift"] < summary["band_lo"]) | (summary["shift"] > summary["band_hi"])
    summary["beyond"] = np.where(judged, outside, None)
    return _order(summary.drop(columns="measure"))


def pair_summary(shifts: pd.DataFrame, bands: pd.DataFrame | None) -> pd.DataFrame:
    """Per ``KEYS`` of ``pair_shifts`` rows (with ``ALL_SIZES`` and the ``MOE`` total): ``pairs``,
    ``scenarios_a``/``scenarios_b`` (A's and B's scenarios among them), ``value_a``/``value_b`` (medians),
    ``shift`` (the median shift, log units), the noise band and ``beyond`` (:func:`_verdict`)."""
    summary = (
        _with_totals(shifts)
        .groupby(KEYS)
        .agg(
            pairs=("shift", "size"),
            scenarios_a=("a_id", "nunique"),
            scenarios_b=("b_id", "nunique"),
            value_a=("value_a", "median"),
            value_b=("value_b", "median"),
            shift=("shift", "median"),
        )
    )
    return _verdict(summary.reset_index(), bands)


def _common_groups(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``a`` and ``b`` (rows with ``group``) without the rows of the groups only one of them holds."""
    common = list(set(a["group"]) & set(b["group"]))
    return a[a["group"].isin(common)], b[b["group"].isin(common)]


def class_summary(va: pd.DataFrame, vb: pd.DataFrame, bands: pd.DataFrame | None) -> pd.DataFrame:
    """Per ``KEYS`` in both ``value_table`` ``va`` (A) and ``vb`` (B), each scenario in its work class (with
    the ``MOE`` total over the expert counts both hold; not over all sizes, whose mix differs; time ratios
    only): ``scenarios_a``/``scenarios_b``, ``value_a``/``value_b`` (the medians), ``shift``
    (``log(value_b / value_a)``), the noise band and ``beyond`` (:func:`_verdict`)."""
    sides = [
        _with_totals(v[~v["family"].isin(list(MEASURES))], all_sizes=False)
        .groupby(KEYS)
        .agg(scenarios=("scenario_id", "nunique"), value=("value", "median"))
        for v in _common_groups(va, vb)
    ]
    summary = sides[0].merge(sides[1], left_index=True, right_index=True, suffixes=("_a", "_b")).reset_index()
    return _verdict(summary.assign(shift=np.log(summary["value_b"] / summary["value_a"])), bands)


def _family_shares(frame: pd.DataFrame, column: str) -> dict[str, float]:
    """The share of ``frame``'s rows whose ``column`` is each of ``FAMILIES``."""
    shares = frame[column].value_counts(normalize=True)
    return {family: float(shares.get(family, 0.0)) for family in FAMILIES}


def pick_summary(picks: pd.DataFrame) -> pd.DataFrame:
    """Per ``group`` (and the ``MOE`` total) and ``mode`` of ``pick_table`` rows: ``pairs``, ``same`` (the
    share with the same fastest schedule), ``same_family``, ``in_set`` (the share where A's fastest is in B's
    best set), ``loss_median``, ``loss_p90`` and ``a``/``b``: the share of pairs whose fastest is in each
    family (a dict)."""
    import pandas as pd

    rows = []
    for (group, mode), part in _with_totals(picks, all_sizes=False).groupby(["group", "mode"]):
        loss = part["loss"].dropna()
        rows.append({
            "group": group,
            "mode": mode,
            "pairs": len(part),
            "same": float((part["best_a"] == part["best_b"]).mean()),
            "same_family": float((part["family_a"] == part["family_b"]).mean()),
            "in_set": float(part["in_set"].mean()),
            "loss_median": float(loss.median()) if len(loss) else math.nan,
            "loss_p90": float(loss.quantile(0.9)) if len(loss) else math.nan,
            "a": _family_shares(part, "family_a"),
            "b": _family_shares(part, "family_b"),
        })  # fmt: skip
    return _order(pd.DataFrame(rows)) if rows else pd.DataFrame(rows)


def best_summary(ra: pd.DataFrame, rb: pd.DataFrame) -> pd.DataFrame:
    """Per ``group`` (and the ``MOE`` total over the expert counts both hold), ``mode`` and work class in
    both ``ratio_table`` ``ra`` (A) and ``rb`` (B), unpaired: ``scenarios_a``/``scenarios_b`` and ``a``/``b``,
    the share of its scenarios whose fastest schedule is in each family (a dict)."""
    import pandas as pd

    keys = ["group", "mode", "size"]
    sides = [_with_totals(fastest(r), all_sizes=False).groupby(keys) for r in _common_groups(ra, rb)]
    rows = [
        {**dict(zip(keys, key, strict=True)), "scenarios_a": len(part), "scenarios_b": len(other),
         "a": _family_shares(part, "family"), "b": _family_shares(other, "family")}
        for key, part in sides[0]
        if key in sides[1].groups and len(other := sides[1].get_group(key))
    ]  # fmt: skip
    return _order(pd.DataFrame(rows)) if rows else pd.DataFrame(rows)


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """``frame``'s rows as JSON-ready dicts: numpy scalars as Python's, NaN as None."""

    def plain(value: Any) -> Any:
        value = value.item() if isinstance(value, np.generic) else value
        return None if isinstance(value, float) and not math.isfinite(value) else value

    return [{k: plain(v) for k, v in row.items()} for row in frame.to_dict("records")]


def _side_info(side: Side) -> dict[str, Any]:
    """What the comparison says of one dataset: path, size, re-measure and label source."""
    version = side.source.label_version
    return {
        "path": str(side.path),
        "scenarios": int(side.rows["scenario_id"].nunique()),
        "remeasured_scenarios": 0 if side.noise is None else int(side.noise["scenario_id"].nunique()),
        "source": side.source.describe(),
        "measured": side.source.measured,
        "label_version": version,
        "label_history": LABEL_VERSIONS.get(version) if isinstance(version, int) else None,
        "host_factor": side.source.host_factor,
        "settings": side.source.settings,
    }


def matching_summary(a: pd.DataFrame, b: pd.DataFrame, matches: pd.DataFrame) -> pd.DataFrame:
    """Per group of ``a``'s scenarios (``scenario_table``, matched to ``b``'s as ``matches``):
    ``scenarios_a``, ``matched``, ``same_id``, ``median_distance`` (as a factor) and ``nearest_spread``: the
    median over its scenarios of the least ``within`` that would give each a neighbour (NaN where ``b`` has
    no scenario of its ``MATCH_KEYS``)."""
    nearest = match_scenarios(a, b, within=math.inf)
    groups = a.groupby("group").size().rename("scenarios_a").to_frame()
    groups = groups.join(
        matches.groupby("group").agg(
            matched=("a_id", "size"), same_id=("exact", "sum"), median_distance=("distance", "median")
        )
    ).join(nearest.groupby("group")["spread"].median().rename("nearest_spread"))
    groups[["matched", "same_id"]] = groups[["matched", "same_id"]].fillna(0).astype(int)
    groups["median_distance"] = np.exp2(groups["median_distance"])
    return _order(groups.reset_index())


def compare(
    a_path: str | Path, b_path: str | Path, *, within: float = WITHIN, other_hardware: bool = False
) -> dict[str, Any]:
    """Dataset ``a_path`` (A) against ``b_path`` (B), as one JSON-ready dict: both label sources and how
    they differ, the matched scenarios per group, the noise bands, the matched pairs' fastest schedules and
    shifts (with the re-measures' own picks, for scale), and the work classes' (module doc)."""
    import pandas as pd

    a, b = load_side(a_path), load_side(b_path)
    check_comparable(a, b, other_hardware=other_hardware)
    scenarios_a, scenarios_b = scenario_table(a.rows, a.hardware), scenario_table(b.rows, b.hardware)
    matches = match_scenarios(scenarios_a, scenarios_b, within)
    ra, rb = ratio_table(a.rows, scenarios_a), ratio_table(b.rows, scenarios_b)
    va, vb = value_table(ra), value_table(rb)
    noise = {name: part for name, side in (("A", a), ("B", b)) if (part := remeasure(side)) is not None}
    bands = noise_bands(pd.concat([s for s, _ in noise.values()])) if noise else None
    shifts, picks = pair_shifts(va, vb, matches), pick_table(ra, rb, matches)
    again = pd.concat([p for _, p in noise.values()]) if noise else picks.iloc[:0]
    return {
        "a": _side_info(a),
        "b": _side_info(b),
        "differences": a.source.differences(b.source),
        "setting_changes": setting_changes(a.source.settings, b.source.settings),
        "within": within,
        "matching": _records(matching_summary(scenarios_a, scenarios_b, matches)),
        "noise_from": list(noise),
        "noise_bands": [] if bands is None else _records(bands),
        "pairs": {
            "picks": _records(pick_summary(picks)),
            "remeasure_picks": _records(pick_summary(again)),
            "shifts": _records(pair_summary(shifts, bands)) if len(shifts) else [],
        },
        "classes": {
            "best": _records(best_summary(ra, rb)),
            "shifts": _records(class_summary(va, vb, bands)),
        },
    }


# Rendering ---------------------------------------------------------------------------------------------

TOP_SHIFTS = 12
"""How many of the largest shifts beyond noise the text ends with."""
PAIRED_ENOUGH = 0.5
"""The text shows a group's work classes when fewer than this share of A's scenarios found a neighbour."""


def _value(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _share(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}%}"


def _band(row: dict[str, Any]) -> str:
    lo, hi = row.get("band_lo", row.get("lo")), row.get("band_hi", row.get("hi"))
    return "-" if lo is None else f"{math.exp(lo):.3f}-{math.exp(hi):.3f}"


def _sides(result: dict[str, Any]) -> str:
    """The two datasets, their label sources and what differs between them."""
    lines = []
    for name in ("a", "b"):
        side = result[name]
        again = side["remeasured_scenarios"]
        noise = f"{again} re-measured" if again else "no re-measure"
        kind = "" if side["measured"] else " (SIMULATED: not a measurement)"
        lines.append(
            f"{name.upper()}: {side['path']}: {side['source']}{kind}; {side['scenarios']} scenarios, {noise}"
        )
    if result["differences"]:
        lines.append("label sources differ: " + "; ".join(result["differences"]))
        history = {result[n]["label_version"]: result[n]["label_history"] for n in ("a", "b")}
        lines += [f"  label version {v}: {text}" for v, text in history.items() if text]
    else:
        lines.append("label sources: the same backend, label version, GPU and world size")
    if result["setting_changes"] and result["a"]["label_version"] == result["b"]["label_version"]:
        lines.append("protocol settings that differ, A -> B: " + "; ".join(result["setting_changes"]))
    return "\n".join(lines)


def _matching_text(result: dict[str, Any]) -> str:
    rows = [
        [g["group"], str(g["scenarios_a"]), str(g["matched"]), str(g["same_id"]),
         "-" if g["median_distance"] is None else f"{g['median_distance']:.2f}x",
         "-" if g["nearest_spread"] is None else f"{g['nearest_spread']:.2f}x"]
        for g in result["matching"]
    ]  # fmt: skip
    header = ["group", "A scenarios", "with a neighbour in B", "same id", "median distance", "nearest at"]
    text = (
        f"Matched pairs: each scenario of A with its nearest of B of the same op, world size, dtype, experts "
        f"and imbalance, rows (m, or m * top_k), n and k each within {result['within']:g}x (distance: the "
        "log2 norm of the three size ratios, as a factor; nearest at: the median factor within which A's "
        "scenarios would find one)\n" + text_table(header, rows, align="<>>>>>")
    )
    if not result["pairs"]["shifts"]:
        text += f"\nNo scenario of A has a neighbour within {result['within']:g}x in B: see the size classes."
    return text


def _bands_text(result: dict[str, Any]) -> str:
    bands = result["noise_bands"]
    if not bands:
        return "Noise band: neither dataset holds a re-measure (noise.parquet), so no shift is judged."
    sizes = [s for s in SIZES if any(b["size"] == s for b in bands)]
    cells = {(b["mode"], b["measure"], b["size"]): b for b in bands}

    def cell(key: tuple[str, str, str]) -> str:
        return f"{_band(cells[key])} ({cells[key]['pairs']})" if key in cells else "-"

    rows = [
        [
            mode,
            {"ratio": "t/t_serial", "time": "times (ms)"}[measure],
            *(cell((mode, measure, s)) for s in sizes),
        ]
        for mode, measure in dict.fromkeys((b["mode"], b["measure"]) for b in bands)
    ]
    lo, hi = BAND_QUANTILES
    return (
        f"Noise band: the {lo:.0%}-{hi:.0%} range of a re-measure's shift (second run over first, same "
        f"scenario and schedule; pairs), from {' and '.join(result['noise_from'])}'s noise.parquet; a "
        f"work class of fewer than {MIN_BAND_PAIRS} pairs takes the band of all sizes\n"
        + text_table(["mode", "measure", *sizes], rows)
    )


def _picks_text(result: dict[str, Any]) -> str:
    header = [
        "group",
        "mode",
        "pairs",
        "same fastest",
        "same family",
        "A's in B's best set",
        "loss median",
        "p90",
    ]
    pairs = result["pairs"]
    rows = [
        [f"{p['group']}{suffix}", p["mode"], str(p["pairs"]), _share(p["same"]), _share(p["same_family"]),
         _share(p["in_set"]), _share(p["loss_median"], 1), _share(p["loss_p90"], 1)]
        for picks, suffix in ((pairs["picks"], ""), (pairs["remeasure_picks"], " re-measure"))
        for p in picks
    ]  # fmt: skip
    return (
        "Fastest schedules of the matched pairs (loss: B's time of A's fastest over B's fastest; "
        "'re-measure': each sweep against its own re-measure, for scale)\n"
        + text_table(header, rows, align="<<>>>>>>")
        + "\n\n"
        + _shares_text(
            "Fastest schedule's family, share of the matched pairs, A -> B", result["pairs"]["picks"]
        )
    )


def _shares_text(title: str, summary: list[dict[str, Any]]) -> str:
    """``summary`` rows (``pick_summary`` or ``best_summary``) as a table of the fastest schedule's family
    shares, ``A -> B``, one column per family some side picks."""
    families = [f for f in FAMILIES if any(row["a"][f] or row["b"][f] for row in summary)]
    sized = "size" in summary[0]
    rows = [
        [row["group"], row["mode"],
         *([row["size"], f"{row['scenarios_a']}/{row['scenarios_b']}"] if sized else []),
         *(f"{row['a'][f]:.0%} -> {row['b'][f]:.0%}" for f in families)]
        for row in summary
    ]  # fmt: skip
    header = ["group", "mode", *(["size", "scenarios A/B"] if sized else []), *families]
    return f"{title}\n" + text_table(header, rows)


def _shift_tables(title: str, summary: list[dict[str, Any]]) -> str:
    """One table per (group, mode) of ``summary`` rows: a family per row, a work class per column, each cell
    ``A->B`` medians with ``*`` where beyond noise; the header gives the scenarios of each class."""
    blocks = []
    for group, mode in dict.fromkeys((s["group"], s["mode"]) for s in summary):
        part = [s for s in summary if s["group"] == group and s["mode"] == mode]
        sizes = [s for s in SIZES if any(row["size"] == s for row in part)]
        count = {
            size: max((r["scenarios_a"], r["scenarios_b"]) for r in part if r["size"] == size)
            for size in sizes
        }
        cells = {(r["family"], r["size"]): r for r in part}
        rows = [
            [family, *(_cell(cells.get((family, size))) for size in sizes)]
            for family in dict.fromkeys(r["family"] for r in part)
        ]
        header = ["family", *(f"{size} ({count[size][0]}/{count[size][1]})" for size in sizes)]
        blocks.append(f"{group}, {mode}\n" + text_table(header, rows))
    return title + "\n\n" + "\n\n".join(blocks)


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return ""
    return f"{_value(row['value_a'])}->{_value(row['value_b'])}{'*' if row['beyond'] else ''}"


def _largest(result: dict[str, Any], classes: list[dict[str, Any]]) -> str:
    """The largest shifts beyond noise of the pairs and of the work-class rows ``classes``, one per line."""
    if not result["pairs"]["shifts"] and not classes:
        return (
            "Nothing compared: no scenario of A has a neighbour in B, and no group, mode and work class "
            "holds scenarios of both."
        )
    if not result["noise_bands"]:
        return "Shifts beyond noise: not judged (no re-measure)."
    found = [
        (basis, s)
        for basis, summary in (("pairs", result["pairs"]["shifts"]), ("classes", classes))
        for s in summary
        if s["beyond"] and s["group"] != MOE
    ]
    if not found:
        return "Shifts beyond noise: none; every shift lies within the noise band."
    found.sort(key=lambda item: -abs(item[1]["shift"]))
    rows = [
        [basis, s["group"], s["mode"], s["family"], s["size"], f"{s['scenarios_a']}/{s['scenarios_b']}",
         f"{_value(s['value_a'])} -> {_value(s['value_b'])}", f"{math.exp(s['shift']):.3g}x", _band(s)]
        for basis, s in found[:TOP_SHIFTS]
    ]  # fmt: skip
    header = [
        "basis",
        "group",
        "mode",
        "family",
        "A's size",
        "scenarios A/B",
        "A -> B",
        "shift",
        "noise band",
    ]
    return f"Largest shifts beyond noise ({len(found)} in all)\n" + text_table(header, rows)


def _unpaired(result: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The work-class summaries of ``result`` (``best``, ``shifts``) of the groups whose scenarios of A
    mostly (``PAIRED_ENOUGH``) found no neighbour: the text shows classes only where pairs are lacking."""
    lacking = {g["group"] for g in result["matching"] if g["matched"] < PAIRED_ENOUGH * g["scenarios_a"]}
    if any(group.startswith(f"{MOE}, ") for group in lacking):
        lacking.add(MOE)
    return {
        name: [row for row in rows if row["group"] in lacking] for name, rows in result["classes"].items()
    }


def render(result: dict[str, Any]) -> str:
    """The comparison ``result`` (:func:`compare`) as text for the terminal."""
    sections = [_sides(result), _matching_text(result), _bands_text(result)]
    pairs, classes = result["pairs"], _unpaired(result)
    if pairs["shifts"]:
        sections += [
            _picks_text(result),
            _shift_tables(
                "Matched pairs, median A -> B: t/t_serial per family and (same scenario ids only) the "
                "serial/sm and GEMM-alone times (columns: A's GEMM work, scenarios of A/B; * the median "
                "shift lies beyond the noise band)",
                pairs["shifts"],
            ),
        ]
    if classes["shifts"]:
        sections += [
            _shares_text(
                "Fastest schedule's family, share of all scenarios of a work class, A -> B (unpaired)",
                classes["best"],
            ),
            _shift_tables(
                "Work classes, unpaired: t/t_serial, the median over all scenarios of A -> of B of a class "
                "of GEMM work, for the groups whose scenarios mostly lack a neighbour (columns: scenarios of "
                "A/B; * the shift lies beyond the noise band; other shapes of the same work: a shift may be "
                "the shapes')",
                classes["shifts"],
            ),
        ]
    return "\n\n".join([*sections, _largest(result, classes["shifts"])])
