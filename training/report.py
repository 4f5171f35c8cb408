"""``ficco report``: a markdown page with PNG plots of how the model does on a dataset.

Per execution mode: ``confusion-<mode>.png`` (measured best against held-out pick), ``regret_cdf-<mode>.png``
(the model, every baseline and the noise ceiling) and per op ``map-<op>-<mode>.png`` (measured against
predicted best schedule over (n*k, m), coloured by granularity/executor).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ficco.features import SCHEDULE_FAMILIES, Schedule
from ficco.tables import markdown_table
from ficco.training.dataset_table import DatasetTable
from ficco.training.evaluate import Evaluation
from ficco.training.metrics import REPORTED, reported_cells
from ficco.training.model import SCHEDULES


def _kind(schedule: str) -> int:
    """Map colour of a schedule: its family's index (splits, grain and priority share a colour)."""
    return SCHEDULE_FAMILIES.index(Schedule.parse(schedule).family)


def plot_confusion(table: DatasetTable, picks: np.ndarray, path: Path) -> None:
    """Counts of (measured best, picked) over the schedules that occur in either, as a heat map."""
    import matplotlib.pyplot as plt

    used = np.union1d(table.best, picks)
    index = {c: i for i, c in enumerate(used)}
    counts = np.zeros((len(used), len(used)), dtype=np.int64)
    np.add.at(counts, ([index[b] for b in table.best], [index[p] for p in picks]), 1)
    size = 2.0 + 0.45 * len(used)
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    image = ax.imshow(np.log1p(counts), cmap="Blues")
    for (i, j), n in np.ndenumerate(counts):
        if n:
            ax.text(j, i, str(n), ha="center", va="center", fontsize=7,
                    color="white" if n > counts.max() / 2 else "black")  # fmt: skip
    labels = [SCHEDULES[c] for c in used]
    ax.set_xticks(range(len(used)), labels, rotation=90, fontsize=7)
    ax.set_yticks(range(len(used)), labels, fontsize=7)
    ax.set(xlabel="picked (held out)", ylabel="measured best")
    ax.set_title(f"top1 {np.mean(picks == table.best):.3f} over {len(table)} scenarios")
    fig.colorbar(image, ax=ax, label="log(1 + count)", shrink=0.7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_regret_cdf(regrets: dict[str, np.ndarray], path: Path, title: str) -> None:
    """Empirical CDF of each named picker's regrets ``[n_picker]`` (x: symlog, linear below 1%); the model
    drawn thick, the noise ceiling dashed."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name, r in regrets.items():
        regret = np.sort(r)
        ax.step(regret, np.arange(1, len(regret) + 1) / len(regret), where="post", label=name,
                linewidth=2.2 if name in ("model", "ceiling") else 1.2,
                linestyle="--" if name == "ceiling" else "-")  # fmt: skip
    ax.set_xscale("symlog", linthresh=0.01)
    ax.set(title=title, xlim=(0, None), xlabel="regret  t_picked / t_best - 1  (dotted: 2%)")
    ax.axvline(0.02, color="grey", linestyle=":", linewidth=1)
    ax.set_ylabel("fraction of scenarios")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_schedule_map(
    table: DatasetTable, picks: np.ndarray, op: str, predicted_label: str, path: Path
) -> None:
    """Measured best (left) and ``picks`` (right) of ``op``'s scenarios over (n*k, m), log axes."""
    import matplotlib.pyplot as plt

    rows = [i for i, s in enumerate(table.scenarios) if s.op == op]
    nk = np.array([table.scenarios[i].n * table.scenarios[i].k for i in rows], dtype=float)
    m = np.array([table.scenarios[i].m for i in rows], dtype=float)
    colors = plt.get_cmap("tab10").colors
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharex=True, sharey=True)
    for ax, chosen, title in (
        (axes[0], table.best[rows], "measured best"),
        (axes[1], picks[rows], predicted_label),
    ):
        kinds = np.array([_kind(SCHEDULES[c]) for c in chosen])
        for k, name in enumerate(SCHEDULE_FAMILIES):
            sel = kinds == k
            if sel.any():
                ax.scatter(nk[sel], m[sel], s=22, color=colors[k], label=name, edgecolors="none")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set(xlabel="n * k", title=f"{op}: {title}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("m")
    handles = {h.get_label(): h for ax in axes for h in ax.collections}
    fig.legend(list(handles.values()), list(handles), loc="center right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.87, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _metrics_table(rows: dict[str, dict[str, Any]]) -> str:
    """One line per picker (or family), one column per metric."""
    return markdown_table(["", *REPORTED], [[name, *reported_cells(m)] for name, m in rows.items()])


def write_report(
    table: DatasetTable,
    evaluation: Evaluation,
    out_dir: str | Path,
    *,
    title: str,
    predicted: np.ndarray | None = None,
    predicted_label: str = "predicted (held out)",
) -> Path:
    """Write ``report.md`` and its PNGs into ``out_dir``; return the markdown path. ``predicted`` (schedule
    columns ``[n]``, e.g. a registered model's) replaces the held-out picks in the schedule maps."""
    import matplotlib

    matplotlib.use("Agg")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    s = evaluation.summary
    lines = [
        f"# {title}",
        "",
        "Every prediction below is held out (grouped cross-validation: the model never saw the scenario's "
        f"model family or grid region; {s['cv']['n_folds']} folds). The noise ceiling is the independent "
        "re-measure's own picks scored against the sweep.",
        "",
        *[f"- `{name}`: {note}" for name, note in s["pickers"].items()],
        "",
    ]
    for mode, result in s["modes"].items():
        on = table.modes == mode
        sub = table.subset(on)
        held_out = evaluation.cv.final[on]
        shown = held_out if predicted is None else predicted[on]
        plot_confusion(sub, held_out, out / f"confusion-{mode}.png")
        plot_regret_cdf(evaluation.regrets[mode], out / f"regret_cdf-{mode}.png", f"{mode} mode, held out")
        ops = sorted({sc.op for sc in sub.scenarios})
        label = "predicted (held out)" if predicted is None else predicted_label
        for op in ops:
            plot_schedule_map(sub, shown, op, label, out / f"map-{op}-{mode}.png")
        region = result["region_holdout"]
        without = result["fallback"]["without_fallback"]
        lines += [
            f"## {mode} mode",
            "",
            "### Family holdout: model, baselines and the noise ceiling",
            "",
            _metrics_table(result["family_holdout"]),
            "",
            f"![regret CDF {mode}](regret_cdf-{mode}.png)",
            "",
            f"Safe fallback: {result['fallback']['n_fallbacks']} fallbacks to serial/sm; without it the "
            f"geomean regret would be {without['geomean_regret']:.4f} and "
            f"{without['n_slower_than_serial_2pct']} picks slower than serial by more than 2%.",
            "",
            f"### Region holdout ({s['region_split']})",
            "",
            _metrics_table(region) if region else "(no rows)",
            "",
            "### Per family",
            "",
            _metrics_table(result["per_family"]),
            "",
            f"![confusion {mode}](confusion-{mode}.png)",
            "",
            *[f"![{op} {mode}](map-{op}-{mode}.png)\n" for op in ops],
        ]
    lines += [
        "## Selection",
        "",
        f"Configuration {s['cv']['config']}, fallback {s['cv']['policy']}; {s['cv']['selection']}. "
        f"Held-out loss by configuration: {s['cv']['config_loss']}.",
        "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
