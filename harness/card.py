"""The dataset card: ``card.md`` and one PNG per op of the best schedule over the (m, n*k) plane.

``write_card(directory)`` reads only the dataset directory (manifest, parts, ``noise.parquet``,
``plan.json``), so ``ficco bench --card-only`` regenerates it at any time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from ficco.features import Schedule
from ficco.harness.dataset import (
    PLAN,
    dataset_hardware,
    dataset_hash,
    label_table,
    load_dataset,
    load_noise,
    read_manifest,
)

if TYPE_CHECKING:
    import pandas as pd

CARD = "card.md"
SCHEDULE_FAMILIES = ("serial/sm", "serial/dma", "shard/sm", "shard/dma", "finer/sm", "finer/dma")
"""Plot colours: one per (granularity, executor)."""
_COLORS = dict(
    zip(SCHEDULE_FAMILIES, ("#7f7f7f", "#bcbd22", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"), strict=True)
)


def schedule_family(schedule: str) -> str:
    """``granularity/executor`` of a canonical schedule string (``finer/dma/s4/chunk`` -> ``finer/dma``)."""
    s = Schedule.parse(schedule)
    return f"{s.granularity}/{s.executor}"


def write_card(directory: str | Path, *, sim_agreement: bool = True) -> Path:
    """Write ``card.md`` and ``best-<op>.png`` into dataset ``directory``; return the card's path.

    ``sim_agreement`` (measured datasets only) adds how often the simulator picks the measured best
    schedule, with its default constants and calibrated on the other half of the scenarios.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest is None:
        raise ValueError(f"{directory} is not a ficco dataset: it has no manifest.json")
    df = load_dataset(directory)
    labels = label_table(df)
    plan_path = directory / PLAN
    plan = json.loads(plan_path.read_text()) if plan_path.exists() else None
    noise = load_noise(directory)
    plots = [_plot_best(labels, op, directory) for op in sorted(labels["op"].unique())]
    sections = [
        _header(manifest, df, directory),
        _measurement(manifest, plan, labels),
        _fingerprint(manifest),
        _size(manifest, df),
        _failures(df),
        _label_distribution(labels),
        _noise(df, noise),
    ]
    if sim_agreement and manifest["backend"] != "sim" and not labels.empty:
        sections.append(_agreement(df, noise, directory))
    sections.append(
        "## Best schedule over the (m, n*k) plane\n\n" + "\n".join(f"![{p.stem}]({p.name})" for p in plots)
    )
    path = directory / CARD
    path.write_text("\n\n".join(sections) + "\n")
    return path


def _table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _header(manifest: dict, df: pd.DataFrame, directory: Path) -> str:
    hw = manifest["hardware"]
    kind = {"gpu": "measured on GPUs", "gloo": "measured on CPUs (gloo)", "sim": "simulated (backend=sim)"}
    return (
        f"# Dataset card: {hw['id']}, {kind[manifest['backend']]}\n\n"
        f"{df['scenario_id'].nunique()} scenarios x every candidate schedule = {len(df)} rows. "
        f"Content hash (`harness.dataset.dataset_hash`): `{dataset_hash(directory)[:16]}`. "
        f"Created {manifest['created']}, last written {manifest['updated']}."
    )


def _measurement(manifest: dict, plan: dict | None, labels: pd.DataFrame) -> str:
    fp = manifest["fingerprint"]
    how = {
        "gpu": "One process per GPU under torchrun; every schedule run by the executor, checked against "
        "the serial result, warmed up and timed with CUDA events (median, p10, p90 over the repetitions)",
        "gloo": "One CPU process per rank under torchrun (gloo); the executor's CPU path, checked against "
        "the serial result",
        "sim": "The analytic model of `harness/sim.py` (GEMM roofline, transfer and contention terms "
        "calibrated on 2 x H200 measurements); no hardware was used",
    }[manifest["backend"]]
    reps = ", ".join(f"{k}={fp[k]}" for k in ("warmup", "reps") if k in fp)
    text = f"## How it was measured\n\n{how}{f' ({reps})' if reps else ''}."
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
    counts = labels.groupby("family").size().sort_values(ascending=False)
    text += "\n\n" + _table(["family", "scenarios"], [[f, n] for f, n in counts.items()])
    return text


def _fingerprint(manifest: dict) -> str:
    fp = manifest["fingerprint"]
    return "## Fingerprint\n\n" + _table(["key", "value"], [[k, f"`{fp[k]}`"] for k in sorted(fp)])


def _size(manifest: dict, df: pd.DataFrame) -> str:
    seconds = manifest["seconds"]
    rate = len(df) / (seconds / 60) if seconds > 0 else float("nan")
    return (
        "## Size and speed\n\n"
        + _table(
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
        "most frequent:\n\n" + _table(["schedule", "error", "rows"], rows)
    )


def _label_distribution(labels: pd.DataFrame) -> str:
    counts = labels["best_schedule"].value_counts()
    rows = [[f"`{s}`", n, f"{n / len(labels):.0%}"] for s, n in counts.items()]
    speed = [
        [
            op,
            len(g),
            f"{g['speedup'].median():.2f}x",
            f"{g['speedup'].quantile(0.9):.2f}x",
            f"{g['speedup'].max():.2f}x",
            f"{(g['best_schedule'] == 'serial/sm').mean():.0%}",
        ]
        for op, g in labels.groupby("op")
    ]
    return (
        "## Labels (best schedule per scenario)\n\n"
        + _table(["best schedule", "scenarios", "share"], rows)
        + "\n\nSpeed-up of the best schedule over `serial/sm`:\n\n"
        + _table(["op", "scenarios", "median", "p90", "max", "serial is best"], speed)
    )


def noise_summary(df: pd.DataFrame, noise: pd.DataFrame) -> dict[str, float]:
    """Run-to-run noise of re-measured scenarios: relative differences of the medians of every (scenario,
    schedule) ok in both runs (median, p90, max), the median within-run spread (p90 - p10) / median, the
    fraction of scenarios whose best schedule differs between the runs with the median loss of keeping
    the first run's pick in the second, and how often the second run's pick is within 5% of the first
    run's best (in the first run's times)."""
    keys = ["scenario_id", "schedule"]
    both = df[[*keys, "median_ms", "p10_ms", "p90_ms", "ok"]].merge(
        noise[[*keys, "median_ms", "ok"]], on=keys, suffixes=("", "_2")
    )
    both = both[both["ok"] & both["ok_2"]]
    rel = (both["median_ms_2"] - both["median_ms"]).abs() / both["median_ms"]
    first = label_table(df[df["scenario_id"].isin(noise["scenario_id"])]).set_index("scenario_id")
    second = label_table(noise).set_index("scenario_id")
    common = first.index.intersection(second.index)
    changed = first.loc[common, "best_schedule"] != second.loc[common, "best_schedule"]
    second_times = noise.set_index(keys)["median_ms"]
    loss = [
        second_times.get((sid, first.at[sid, "best_schedule"]), np.nan) / second.at[sid, "best_ms"] - 1.0
        for sid in common[changed.to_numpy()]
    ]
    first_times = df.set_index(keys)["median_ms"]
    within = [
        first_times.get((sid, second.at[sid, "best_schedule"]), np.nan) <= 1.05 * first.at[sid, "best_ms"]
        for sid in common
    ]
    return {
        "scenarios": float(len(common)),
        "pairs": float(len(both)),
        "rel_diff_median": float(rel.median()),
        "rel_diff_p90": float(rel.quantile(0.9)),
        "rel_diff_max": float(rel.max()),
        "spread_median": float(((both["p90_ms"] - both["p10_ms"]) / both["median_ms"]).median()),
        "best_changed": float(changed.mean()) if len(common) else float("nan"),
        "loss_when_changed_median": float(np.nanmedian(loss)) if loss else 0.0,
        "second_pick_within_5pct": float(np.mean(within)) if within else float("nan"),
    }


def _noise(df: pd.DataFrame, noise: pd.DataFrame | None) -> str:
    if noise is None or noise.empty:
        return "## Run-to-run noise\n\nNot measured (run `ficco bench --resume --remeasure N`)."
    s = noise_summary(df, noise)
    return (
        f"## Run-to-run noise\n\n{int(s['scenarios'])} scenarios were measured a second time after the sweep "
        f"(`noise.parquet`, {int(s['pairs'])} schedule pairs ok in both runs).\n\n"
        + _table(
            ["", "value"],
            [
                ["median relative difference between runs", f"{s['rel_diff_median']:.1%}"],
                ["p90 / max relative difference", f"{s['rel_diff_p90']:.1%} / {s['rel_diff_max']:.1%}"],
                ["median within-run spread (p90 - p10) / median", f"{s['spread_median']:.1%}"],
                ["best schedule changed between runs", f"{s['best_changed']:.0%} of scenarios"],
                [
                    "median loss of the first run's pick, when it changed",
                    f"{s['loss_when_changed_median']:.1%}",
                ],
                [
                    "second run's pick within 5% of the first run's best",
                    f"{s['second_pick_within_5pct']:.0%}",
                ],
            ],
        )
    )


def _agreement(df: pd.DataFrame, noise: pd.DataFrame | None, directory: Path) -> str:
    from ficco.harness.sim import agreement, calibrate

    hardware = dataset_hardware(directory)
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
        + _table(["sim constants", "exact", "within 5%"], rows)
    )
    if noise is not None and not noise.empty:
        s = noise_summary(df, noise)
        text += (
            "\n\nFor scale: the second run of the re-measured scenarios picks the first run's best in "
            f"{1 - s['best_changed']:.0%} of them, and a schedule within 5% of it in "
            f"{s['second_pick_within_5pct']:.0%}."
        )
    return text


def _plot_best(labels: pd.DataFrame, op: str, directory: Path) -> Path:
    """Scatter of the best schedule family over (m, n*k) for ``op``, log axes; returns the PNG path."""
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
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("m (rows)")
    ax.set_ylabel("n * k")
    ax.set_title(f"{op}: best schedule family ({len(sub)} scenarios)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    path = directory / f"best-{op}.png"
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
