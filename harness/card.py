"""The dataset card: ``card.md`` and one PNG per op and mode of the best schedule over the (m, n*k) plane.

``write_card(directory)`` reads only the dataset directory (manifest, parts, ``noise.parquet``,
``plan.json``), so ``ficco dataset card`` regenerates it at any time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ficco.features import MODES, SCHEDULE_FAMILIES, SERIAL, Schedule
from ficco.features.dataset import (
    PLAN,
    dataset_hardware,
    dataset_hash,
    host_factor_of,
    label_quantile,
    load_dataset,
    load_noise,
    read_manifest,
    require_manifest,
    with_label_times,
)
from ficco.features.label_source import LABEL_VERSIONS, LabelSource, label_source
from ficco.harness.dataset import label_table
from ficco.harness.labels import best_set
from ficco.tables import markdown_table

if TYPE_CHECKING:
    import pandas as pd

CARD = "card.md"
_COLORS = dict(
    zip(SCHEDULE_FAMILIES, ("#7f7f7f", "#bcbd22", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"), strict=True)
)
"""Plot colours: one per schedule family (granularity/executor)."""


def schedule_family(schedule: str) -> str:
    """``granularity/executor`` of a canonical schedule string (``finer/dma/s4/chunk`` -> ``finer/dma``)."""
    return Schedule.parse(schedule).family


def dataset_label_source(directory: str | Path, rows: pd.DataFrame) -> LabelSource:
    """The ``LabelSource`` of dataset ``directory`` (its manifest) with the host factor of its ``rows``
    (``host_factor_of``; 1.0 where no eager time is host-bound, e.g. simulated rows)."""
    factor = host_factor_of(rows)
    return label_source(require_manifest(directory), factor if np.isfinite(factor) else 1.0)


def write_card(directory: str | Path) -> Path:
    """Write ``card.md`` and ``best-<op>.png`` into dataset ``directory``; return the card's path. A measured
    dataset's card says how often the simulator picks the measured best schedule, with its default constants
    and calibrated on the other half of the scenarios."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest is None:
        raise ValueError(f"{directory} is not a ficco dataset: it has no manifest.json")
    df = load_dataset(directory)
    labels = label_table(df)
    plan_path = directory / PLAN
    plan = json.loads(plan_path.read_text()) if plan_path.exists() else None
    noise = load_noise(directory)
    plots = [
        _plot_best(labels[labels["mode"] == mode], op, mode, directory)
        for mode in MODES
        if (labels["mode"] == mode).any()
        for op in sorted(labels["op"].unique())
    ]
    sections = [
        _header(manifest, df, directory),
        _measurement(manifest, plan, labels),
        _label_source(manifest, dataset_label_source(directory, df)),
        _fingerprint(manifest),
        _size(manifest, df),
        _failures(df),
        _label_distribution(labels),
        _best_sets(df, labels),
        _noise(df, noise),
        _host_speed(df),
    ]
    if "gathered" in manifest:  # a dataset of shards (`ficco dataset gather`): after the fingerprint
        sections.insert(4, shards_section(manifest))
    if manifest["backend"] != "sim" and not labels.empty:
        sections.append(_agreement(df, noise, directory))
    sections.append(
        "## Best schedule over the (m, n*k) plane\n\n" + "\n".join(f"![{p.stem}]({p.name})" for p in plots)
    )
    path = directory / CARD
    path.write_text("\n\n".join(sections) + "\n")
    return path


def _header(manifest: dict, df: pd.DataFrame, directory: Path) -> str:
    hw = manifest["hardware"]
    kind = {"gpu": "measured on GPUs", "gloo": "measured on CPUs (gloo)", "sim": "simulated (backend=sim)"}
    return (
        f"# Dataset card: {hw['id']}, {kind[manifest['backend']]}\n\n"
        f"{df['scenario_id'].nunique()} scenarios x every candidate schedule x modes "
        f"{sorted(df['mode'].unique())} = {len(df)} rows. "
        f"Content hash (`harness.dataset.dataset_hash`): `{dataset_hash(directory)[:16]}`. "
        f"Created {manifest['created']}, last written {manifest['updated']}."
    )


def _measurement(manifest: dict, plan: dict | None, labels: pd.DataFrame) -> str:
    queued = manifest.get("protocol", {}).get("graph_rounds") == "queued"
    eager_factor = manifest.get("protocol", {}).get("eager_timed_factor", 1.0)  # 1 before it was recorded
    alignment = (
        "eager blocks start from ranks aligned on the host (an all-reduce and a host synchronisation, "
        "outside the timed region); graph-mode rounds are queued on the device behind a spin kernel, each "
        "block after a one-element all-reduce on the stream, so the ranks start it together and no host "
        "launch latency lands inside it"
        if queued
        else "the ranks aligned before each timed block (an all-reduce and a host synchronisation, outside "
        "the timed region)"
    )
    protocol = (
        "checked against the serial result on poisoned buffers (in graph mode: the captured graph's "
        "replay too), then timed in interleaved rounds: every round visits every schedule and baseline of "
        f"a mode in a fresh shuffled order, the modes taking turns; {alignment}; a block is a fixed number "
        "of calls per scenario and mode (about `block_ms` of serial calls) over rotating input sets, so "
        "small GEMMs do not run from L2; the first round's length sets the number of rounds (about "
        f"`timed_ms` of timed work, {eager_factor:g}x that in eager mode, between `rounds` and "
        "`max_rounds`: short scenarios, the noisiest, get the most); a round's time is the block's "
        "per-call time, the maximum over ranks; `median_ms` is the median over rounds and `p10_ms` the "
        "10th percentile, and every round's time is kept (`round_ms`); a schedule's time (`time_ms`, what "
        "the labels, the best sets and the noise figures below use) is the 10th percentile in eager mode "
        "and the median in graph mode (`features.dataset.LABEL_STAT`)"
    )
    how = {
        "gpu": "One process per GPU under torchrun; every schedule run by the executor in eager mode and "
        f"replayed from a CUDA graph (graph mode), {protocol}",
        "gloo": "One CPU process per rank under torchrun (gloo); the executor's CPU path (eager only), "
        f"{protocol}",
        "sim": "The simulator of `harness/sim.py` (GEMM times measured on one GPU, transfer, contention and "
        "host terms fitted to the 2- and 4-GPU measurements; its fidelity, the held-out regret of its own "
        "picks, is in `benchmarks/results/sim-fidelity.md`), version "
        f"`{(manifest.get('fingerprint') or {}).get('sim_model', '?')}`; no hardware was used, and the rows "
        "are not measurements",
    }[manifest["backend"]]
    text = f"## How it was measured\n\n{how}."
    if "protocol" in manifest:
        text += " Protocol: " + ", ".join(f"{k}={v}" for k, v in sorted(manifest["protocol"].items())) + "."
    if plan:
        s = plan["settings"]
        moe = "included" if s["include_moe"] else "not included"
        text += (
            f"\n\nPlan (`plan.json`): tensor-parallel degree {s['tp']}, tokens {s['tokens']}, dtype "
            f"{s['dtype']}, configs {', '.join(s['configs'])}; a seeded log-uniform grid of {s['grid_size']} "
            f"shapes (seed {s['seed']}); real-model scenarios with a simulated serial time above "
            f"{s['max_serial_ms']} ms left out ({len(plan['dropped'])}); MoE pairs {moe}."
        )
        if "estimated_minutes" in s:
            text += f" Estimated before the sweep (simulator): {s['estimated_minutes']:.1f} min."
        shared = plan["shared"]
        if shared:
            text += f" {len(shared)} scenarios occur in more than one family; each is listed under its first."
    counts = labels.drop_duplicates("scenario_id").groupby("family").size().sort_values(ascending=False)
    text += "\n\n" + markdown_table(["family", "scenarios"], [[f, n] for f, n in counts.items()])
    return text


def _label_source(manifest: dict, source: LabelSource) -> str:
    """The card's "Label source" section: what produced the labels (``features.label_source``), the label
    version with its history line, and the settings that move labels, marking those the manifest lacks."""
    text = (
        f"## Label source\n\n`{source.describe()}` (`features.label_source`). Datasets of another backend, "
        "label version, GPU or world size are other sources of labels: training does not pool them silently, "
        "and `ficco dataset compare` sets two datasets side by side."
    )
    if source.backend == "sim":
        constants = source.settings.get("sim_constants")
        return (
            f"{text}\n\nSimulated: the model `{source.label_version}`, constants `{constants}`; no GPU ran."
        )
    recorded = manifest.get("protocol", {})
    how = "recorded by the sweep" if "label_version" in recorded else "derived from its protocol settings"
    history = LABEL_VERSIONS.get(source.label_version, "newer than this ficco's history")
    rows = [
        [
            name,
            f"`{value}`" + ("" if name in recorded else " (not recorded: measured before it was a setting)"),
        ]
        for name, value in sorted(source.settings.items())
        if name != "modes"
    ]
    return (
        f"{text}\n\nLabel version **{source.label_version}** ({how}): {history}.\n\nThe settings that move a "
        "schedule's measured time, as this dataset was measured:\n\n"
        + markdown_table(["setting", "value"], rows)
    )


def _fingerprint(manifest: dict) -> str:
    fp = manifest["fingerprint"]
    return "## Fingerprint\n\n" + markdown_table(["key", "value"], [[k, f"`{fp[k]}`"] for k in sorted(fp)])


def _size(manifest: dict, df: pd.DataFrame) -> str:
    seconds = manifest["seconds"]
    rate = len(df) / (seconds / 60) if seconds > 0 else float("nan")
    return (
        "## Size and speed\n\n"
        + markdown_table(
            ["rows", "scenarios", "ok rows", "failed rows", "sweep time (measuring)", "rows per minute"],
            [
                [
                    len(df),
                    df["scenario_id"].nunique(),
                    int(df["ok"].sum()),
                    int((~df["ok"]).sum()),
                    f"{seconds / 60:.1f} min ({seconds:.0f} s)",
                    f"{rate:.0f}",
                ]
            ],
        )
        + f"\n\nWritten in {len(manifest['parts'])} append-only parts."
    )


def _failures(df: pd.DataFrame) -> str:
    failed = df[~df["ok"]]
    if failed.empty:
        return "## Failed schedules\n\nNone."
    top = failed.groupby(["schedule", "error"]).size().sort_values(ascending=False).head(10)
    rows = [[f"`{s}`", e[:120].replace("|", "/"), n] for (s, e), n in top.items()]
    return (
        f"## Failed schedules\n\n{len(failed)} of {len(df)} rows failed (never chosen as best); "
        "most frequent:\n\n" + markdown_table(["schedule", "error", "rows"], rows)
    )


def _label_distribution(labels: pd.DataFrame) -> str:
    parts = ["## Labels (best schedule per scenario and mode)"]
    for mode, sub in labels.groupby("mode", sort=False):
        counts = sub["best_schedule"].value_counts()
        rows = [[f"`{s}`", n, f"{n / len(sub):.0%}"] for s, n in counts.head(12).items()]
        speed = [
            [
                op,
                len(g),
                f"{g['speedup'].median():.2f}x",
                f"{g['speedup'].quantile(0.9):.2f}x",
                f"{g['speedup'].max():.2f}x",
                f"{(g['best_schedule'] == 'serial/sm').mean():.0%}",
            ]
            for op, g in sub.groupby("op")
        ]
        parts.append(
            f"### {mode}\n\n"
            + markdown_table(["best schedule", "scenarios", "share"], rows)
            + "\n\nSpeed-up of the best schedule over `serial/sm`:\n\n"
            + markdown_table(["op", "scenarios", "median", "p90", "max", "serial is best"], speed)
        )
    return "\n\n".join(parts)


def _best_sets(df: pd.DataFrame, labels: pd.DataFrame) -> str:
    """Best-set sizes per mode, and how often a ``/hp`` twin differs from its normal-priority twin."""
    sizes = [
        [
            mode,
            len(g),
            f"{g['best_set_size'].median():.0f}",
            f"{g['best_set_size'].quantile(0.9):.0f}",
            f"{(g['best_set_size'] == 1).mean():.0%}",
        ]
        for mode, g in labels.groupby("mode", sort=False)
    ]
    twins = [[mode, *_twin_row(g, mode)] for mode, g in df.groupby("mode", sort=False)]
    return (
        "## Labels with confidence (best sets)\n\n`in_best_set`: the schedules of a scenario and mode that "
        "cannot be told apart from the fastest (`harness.labels`: a paired bootstrap over the rounds, never "
        "narrower than 1%).\n\n"
        + markdown_table(["mode", "scenarios", "median size", "p90 size", "one schedule alone"], sizes)
        + "\n\nHigh-priority twins (`.../hp` against the same schedule at normal priority), pairs ok in "
        "both; 'differ' = one of the two leaves the best set of the pair (same test):\n\n"
        + markdown_table(
            ["mode", "pairs", "differ beyond noise", "hp faster by > 1%", "hp slower by > 1%"], twins
        )
    )


def _twin_row(df: pd.DataFrame, mode: str) -> list[str]:
    """[pairs, share differing beyond noise, share hp faster by > 1%, share hp slower by > 1%]."""
    ok = with_label_times(df[df["ok"]])
    quantile = label_quantile(mode)
    hp = ok[ok["schedule"].str.endswith("/hp")]
    normal = ok.set_index(["scenario_id", "schedule"])
    differ = faster = slower = pairs = 0
    for row in hp.itertuples():
        key = (row.scenario_id, row.schedule.removesuffix("/hp"))
        if key not in normal.index:
            continue
        twin = normal.loc[key]
        pairs += 1
        both = np.array([list(twin["round_ms"]), list(row.round_ms)])
        differ += not best_set(both, quantile=quantile).all()
        ratio = row.time_ms / twin["time_ms"]
        faster += ratio < 0.99
        slower += ratio > 1.01
    if not pairs:
        return ["0", "-", "-", "-"]
    return [str(pairs), f"{differ / pairs:.0%}", f"{faster / pairs:.0%}", f"{slower / pairs:.0%}"]


def noise_summary(df: pd.DataFrame, noise: pd.DataFrame) -> dict[str, float]:
    """Run-to-run noise of the re-measured scenarios, rows of one mode: the relative differences of the
    label times of the pairs ok in both runs (median, p90, max), the share of scenarios whose second-run
    fastest lies in the first run's best set, the first run's median best-set size, and the share whose
    fastest changed with the median loss of keeping the first run's pick."""
    keys = ["scenario_id", "schedule"]
    df, noise = with_label_times(df), with_label_times(noise)
    both = _both_ok(df, noise)
    rel = (both["time_ms_2"] - both["time_ms"]).abs() / both["time_ms"]
    first = label_table(df[df["scenario_id"].isin(noise["scenario_id"])]).set_index("scenario_id")
    second = label_table(noise).set_index("scenario_id")
    common = first.index.intersection(second.index)
    changed = first.loc[common, "best_schedule"] != second.loc[common, "best_schedule"]
    second_times = noise.set_index(keys)["time_ms"]
    loss = [
        second_times.get((sid, first.at[sid, "best_schedule"]), np.nan) / second.at[sid, "best_ms"] - 1.0
        for sid in common[changed.to_numpy()]
    ]
    in_set = df[df["in_best_set"]].set_index(keys).index
    hits = [(sid, second.at[sid, "best_schedule"]) in in_set for sid in common]
    return {
        "scenarios": float(len(common)),
        "pairs": float(len(both)),
        "rel_diff_median": float(rel.median()),
        "rel_diff_p90": float(rel.quantile(0.9)),
        "rel_diff_max": float(rel.max()),
        "second_best_in_first_set": float(np.mean(hits)) if hits else float("nan"),
        "best_set_size_median": float(first.loc[common, "best_set_size"].median()),
        "best_changed": float(changed.mean()) if len(common) else float("nan"),
        "loss_when_changed_median": float(np.nanmedian(loss)) if loss else 0.0,
    }


def _both_ok(df: pd.DataFrame, noise: pd.DataFrame) -> pd.DataFrame:
    """The (scenario, schedule) pairs ok in both runs: ``time_ms`` of the first run, ``time_ms_2`` of the
    second."""
    keys = ["scenario_id", "schedule"]
    both = df[[*keys, "time_ms", "ok"]].merge(noise[[*keys, "time_ms", "ok"]], on=keys, suffixes=("", "_2"))
    return both[both["ok"] & both["ok_2"]]


NOISE_SIZE_EDGES_MS: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0)
"""Serial-time edges (ms, the first run's ``serial/sm`` in that mode) of the card's noise-by-size table:
sub-millisecond eager times are mostly host time, whose speed drifts between runs."""


def noise_by_size(df: pd.DataFrame, noise: pd.DataFrame) -> list[dict[str, float]]:
    """Run-to-run relative difference (median, p90) of the re-measured pairs, rows of one mode, by the
    scenario's first-run serial time (``NOISE_SIZE_EDGES_MS``); also with each scenario's median shift
    between the runs taken out (``shifted``: what a drift of the whole scenario, e.g. the host's speed,
    leaves), and that shift (``shift_median``: the bucket's median second-run over first-run time)."""
    df, noise = with_label_times(df), with_label_times(noise)
    both = _both_ok(df, noise).copy()
    log_ratio = np.log(both["time_ms_2"] / both["time_ms"])
    both["rel"] = np.abs(np.expm1(log_ratio))
    shift = log_ratio.groupby(both["scenario_id"]).transform("median")
    both["shifted"] = np.abs(np.expm1(log_ratio - shift))
    serial = df[df["schedule"] == str(SERIAL)].set_index("scenario_id")["time_ms"]
    serial_ms = both["scenario_id"].map(serial).to_numpy()
    both["size"] = np.searchsorted(NOISE_SIZE_EDGES_MS, serial_ms, side="right")
    both["shift"] = shift
    out = []
    for size, part in both.groupby("size"):
        scenario_shift = part.groupby("scenario_id")["shift"].first()
        out.append(
            {
                "size": int(size),
                "scenarios": float(part["scenario_id"].nunique()),
                "rel_median": float(part["rel"].median()),
                "rel_p90": float(part["rel"].quantile(0.9)),
                "shifted_median": float(part["shifted"].median()),
                "shifted_p90": float(part["shifted"].quantile(0.9)),
                "shift_median": float(np.exp(scenario_shift.median())),
            }
        )
    return out


def size_label(size: int) -> str:
    """The serial-time range of ``noise_by_size``'s bucket ``size``, e.g. ``0.1-0.3 ms``."""
    edges = NOISE_SIZE_EDGES_MS
    if size == 0:
        return f"< {edges[0]:g} ms"
    if size == len(edges):
        return f">= {edges[-1]:g} ms"
    return f"{edges[size - 1]:g}-{edges[size]:g} ms"


_NOISE_COLUMNS = (
    ("scenarios", "scenarios", int),
    ("schedule pairs", "pairs", int),
    ("median rel. diff", "rel_diff_median", ".2%"),
    ("p90 rel. diff", "rel_diff_p90", ".2%"),
    ("max rel. diff", "rel_diff_max", ".1%"),
    ("2nd run's fastest in 1st run's best set", "second_best_in_first_set", ".0%"),
    ("median best-set size", "best_set_size_median", ".0f"),
    ("fastest changed", "best_changed", ".0%"),
    ("median loss of 1st pick when changed", "loss_when_changed_median", ".2%"),
)
"""The noise table's columns after the mode: (header, ``noise_summary`` key, format spec or function)."""
_NOISE_BY_SIZE_COLUMNS = (
    ("serial time", "size", size_label),
    ("scenarios", "scenarios", int),
    ("median rel. diff", "rel_median", ".2%"),
    ("p90", "rel_p90", ".2%"),
    ("shifted: median", "shifted_median", ".2%"),
    ("p90", "shifted_p90", ".2%"),
    ("shift", "shift_median", lambda shift: f"{shift:.3f}x"),
)
"""The same for the table by serial time (``noise_by_size``)."""


def _noise_table(columns: tuple, rows: list[tuple[str, dict[str, float]]]) -> str:
    """The markdown table of ``(mode, values)`` rows: the mode, then each column's value of ``values``."""

    def cell(value: float, fmt) -> object:
        return fmt(value) if callable(fmt) else format(value, fmt)

    return markdown_table(
        ["mode", *(header for header, _, _ in columns)],
        [[mode, *(cell(values[key], fmt) for _, key, fmt in columns)] for mode, values in rows],
    )


def _noise(df: pd.DataFrame, noise: pd.DataFrame | None) -> str:
    if noise is None or noise.empty:
        return (
            "## Run-to-run noise\n\nNot measured (run the sweep's `ficco bench` again with `--remeasure N`)."
        )
    runs = {m: (df[df["mode"] == m], noise[noise["mode"] == m]) for m in MODES if (noise["mode"] == m).any()}
    return (
        "## Run-to-run noise\n\nThe re-measured scenarios (`noise.parquet`) were measured again in a "
        "separate process, in a shuffled order, with other inputs and round orders. Relative differences "
        "are over every schedule ok in both runs.\n\n"
        + _noise_table(_NOISE_COLUMNS, [(mode, noise_summary(*both)) for mode, both in runs.items()])
        + "\n\nBy the scenario's serial time (first run); 'shifted': each scenario's median shift between "
        "the runs taken out, what a drift of the whole scenario (the host's speed, in eager mode) leaves "
        "of the differences between its schedules; 'shift': that drift, the second run's time over the "
        "first's (median scenario):\n\n"
        + _noise_table(
            _NOISE_BY_SIZE_COLUMNS, [(mode, b) for mode, both in runs.items() for b in noise_by_size(*both)]
        )
    )


def _host_speed(df: pd.DataFrame) -> str:
    factor = host_factor_of(df)
    value = f"**{factor:.2f}**" if np.isfinite(factor) else "not measurable (no eager time is host-bound)"
    return (
        "## Host speed\n\n"
        f"Host factor of the measuring machine: {value}: the median eager time over the executor's host "
        "price (`features.launch_cost.estimate_host_factor`) where the host bounds the eager time (the graph "
        "replay of the same schedule takes less than half of it). Eager times of small shapes follow it, "
        "so their labels hold for machines of a similar factor; a model records its training data's, and "
        "`Predictor.recommend(..., host_factor=...)` answers for another machine's."
    )


def _agreement(df: pd.DataFrame, noise: pd.DataFrame | None, directory: Path) -> str:
    from ficco.harness.sim_fit import agreement, calibrate

    hardware = dataset_hardware(directory)
    df = df[df["mode"] == "eager"]
    ids = df["scenario_id"].drop_duplicates().to_numpy()
    folds = [df[df["scenario_id"].isin(ids[i::2])] for i in (0, 1)]
    fitted = [calibrate(folds[i], hardware) for i in (0, 1)]
    rows = []
    for name, pairs in (
        ("default constants", [(df, None)]),
        (
            "calibrated on the other half of the scenarios (2-fold)",
            [(folds[1 - i], fitted[i]) for i in (0, 1)],
        ),
    ):
        scores = [
            [agreement(d, hardware, *([c] if c else []), tolerance=t) for d, c in pairs] for t in (0.0, 0.05)
        ]
        rows.append([name, f"{np.mean(scores[0]):.0%}", f"{np.mean(scores[1]):.0%}"])
    text = (
        "## Simulator agreement\n\nHow often `--backend sim` picks the measured best schedule (among the "
        "schedules measured ok), exactly or within 5% of the best:\n\n"
        + markdown_table(["sim constants", "exact", "within 5%"], rows)
    )
    if noise is not None and not noise.empty:
        s = noise_summary(df[df["mode"] == "eager"], noise[noise["mode"] == "eager"])
        text += (
            "\n\nFor scale (eager): the second run of the re-measured scenarios picks the first run's best "
            f"in {1 - s['best_changed']:.0%} of them."
        )
    return text


def _plot_best(labels: pd.DataFrame, op: str, mode: str, directory: Path) -> Path:
    """Scatter of the best schedule family over (m, n*k) for ``op`` in ``mode``; returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sub = labels[labels["op"] == op]
    fig, ax = plt.subplots(figsize=(7, 5), dpi=110)
    families = sub["best_schedule"].map(schedule_family)
    for family in SCHEDULE_FAMILIES:
        pick = sub[families == family]
        if not pick.empty:
            ax.scatter(
                pick["m"],
                pick["n"] * pick["k"],
                s=22,
                c=_COLORS[family],
                label=f"{family} ({len(pick)})",
                alpha=0.85,
                edgecolors="none",
            )
    ax.set(xscale="log", yscale="log", xlabel="m (rows)", ylabel="n * k")
    ax.set_title(f"{op}, {mode}: best schedule family ({len(sub)} scenarios)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    path = directory / f"best-{op}-{mode}.png"
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def shards_section(manifest: dict[str, Any]) -> str:
    """The card's "Shards" section of a gathered dataset: its shards, the machines and runs of each,
    the sweep time and GPU time, co-tenancy and what is missing."""
    g = manifest["gathered"]
    shards = g["shards"]
    machines = sorted({m for s in shards for m in s["machines"]})
    seconds = sum(s["seconds"] for s in shards)
    world = manifest["fingerprint"].get("world_size", 1)
    if manifest["backend"] == "gpu":
        hours = seconds / 3600
        time = f"{hours:.2f} h of sweep time on {world} GPUs each: {hours * world:.2f} GPU-hours"
    elif manifest["backend"] == "sim":
        time = f"{seconds:.1f} s of CPU time (simulated: no GPU was used)"
    else:
        time = f"{seconds / 60:.1f} min of sweep time on {world} CPU processes each (gloo: no GPU was used)"
    text = (
        f"## Shards\n\nGathered (`ficco dataset gather`) from {len(shards)} of {g['shard_count']} shards of "
        f"plan `{g['plan_hash'][:16]}`, measured on {len(machines)} machine(s) "
        f"({', '.join(f'`{m}`' for m in machines) or 'unrecorded'}; ids hash the host, naming none); {time}. "
        f"Content hash of the rows: `{g['rows_hash'][:16]}`."
    )
    if g["duplicates_dropped"]:
        text += f" {g['duplicates_dropped']} rows held by two shard directories were kept once."
    if g["missing_shards"] or g["unfinished"]:
        text += (
            f" **Incomplete:** missing shards {g['missing_shards']}, unfinished {g['unfinished']} "
            "(gathered with --partial)."
        )
    if any(r["shared_node"] for s in shards for r in s["runs"]):
        text += (
            " **Co-tenancy:** some shards ran beside others on one node (`--share-nodes`): their NVLink and "
            "host were shared, which disturbs overlap timing."
        )
    rows = [
        [
            s["shard"],
            s["scenarios"],
            s["rows"],
            f"{s['seconds']:.0f}",
            f"{s['estimated_seconds']:.0f}",
            ", ".join(sorted({r["engine"] for r in s["runs"]})) or "-",
            len(s["runs"]),
            ", ".join(s["machines"]) or "-",
        ]
        for s in shards
    ]
    header = ["shard", "scenarios", "rows", "sweep s", "estimated GPU s", "engine", "runs", "machines"]
    return text + "\n\n" + markdown_table(header, rows)
