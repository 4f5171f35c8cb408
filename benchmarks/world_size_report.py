r"""World-size report: how the best schedule, the achievable overlap and the model's picks change with the
number of GPUs, from one dataset per world size (no GPU needed).

    # measured datasets (each from `ficco bench --hardware h200x<w> --tp <w>`)
    .venv/bin/python -m benchmarks.world_size_report datasets/h200x2 datasets/h200x4 --out reports/world-size
    # the simulated what-if (harness/sim.py, no hardware; the report says so on every line that shows it)
    .venv/bin/python -m benchmarks.world_size_report datasets/h200x2-sim datasets/h200x4-sim \
        datasets/h200x8-sim --out reports/world-size-sim

Writes ``OUT/world-size.json``, ``OUT/report.md`` and three plots (``best-family.png``,
``speedup-cdf.png``, ``transfer.png``). Per world size and execution mode:

- **best schedules**: the share of scenarios whose fastest schedule is of each ``granularity/executor``
  family (``features.SCHEDULE_FAMILIES``), and the share whose best set holds ``serial/sm`` (overlap does not
  pay there);
- **achievable overlap**: the geometric-mean speedup of the fastest schedule over serial and over PyTorch
  async-TP, and the realized overlap of the communication-heavy scenarios (``executor_report``: (serial -
  best) / (serial - max(GEMM alone, fastest communication alone)), over scenarios whose fastest
  communication alone is >= 20% of the GEMM alone);
- **moves**: the same model layer (family, layer pair, tokens; ``features.model_config.layer_pairs`` of
  ``datasets/model_configs`` and ``datasets/moe_configs``) at one world size and the next: how often its
  fastest family stays or moves, per mode;
- **serial/dma by size**: per world size and mode, by the MiB each GPU receives, the share of scenarios
  whose fastest schedule is ``serial/dma`` and whose best set holds it (whether ``serial/dma`` earns its
  place at small sizes);
- **transfer**: a model trained on one world size's dataset picking for another's scenarios (``training.
  evaluate.split_summary``: the configuration and fallback cross-validated on the training dataset), beside
  the size heuristic fitted on the same training data; on the diagonal, the dataset's own family holdout
  (grouped cross-validation). Geometric-mean regret and the share of picks inside the best set.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import REPO, executor_report
from ficco.features import SCHEDULE_FAMILIES, Schedule
from ficco.files import write_text_atomic
from ficco.tables import markdown_table

PICKERS = ("model", "size_heuristic")
"""The pickers of the transfer matrix."""
CONFIG_DIRS = ("datasets/model_configs", "datasets/moe_configs")
"""Where the model layers that ``moves`` matches across world sizes come from (relative to the checkout)."""
SIZE_EDGES_MIB = (1, 4, 16, 64)
"""Edges of the size buckets of ``serial/dma by size`` (MiB each GPU receives)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.world_size_report", description=__doc__.splitlines()[0]
    )
    p.add_argument("datasets", nargs="+", type=Path, help="one dataset directory per world size")
    p.add_argument("--out", type=Path, required=True, help="folder of world-size.json, report.md and plots")
    p.add_argument("--seed", type=int, default=0, help="XGBoost seed")
    p.add_argument("--jobs", type=int, default=1, help="XGBoost threads")
    args = p.parse_args(argv)
    if len(args.datasets) < 2:
        p.error(f"give at least two datasets (one per world size); got {len(args.datasets)}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    from ficco.training.dataset_table import load_dataset_table

    loaded = [load_dataset_table(path) for path in args.datasets]
    sizes = [_world_size(d) for d in loaded]
    if len(set(sizes)) != len(sizes):
        sys.exit(f"error: the datasets must have distinct world sizes; got {sizes} for {args.datasets}")
    summary = world_size_summary(loaded, seed=args.seed, n_jobs=args.jobs, progress=True)
    args.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out / "world-size.json", json.dumps(summary, indent=1) + "\n")
    plot_best_family(summary, args.out / "best-family.png")
    plot_speedup_cdf(loaded, summary, args.out / "speedup-cdf.png")
    plot_transfer(summary, args.out / "transfer.png")
    write_text_atomic(args.out / "report.md", render_markdown(summary))
    print(f"wrote {args.out}/report.md, world-size.json and 3 plots")
    return summary


def world_size_summary(loaded: list, *, seed: int = 0, n_jobs: int = 1, progress: bool = False) -> dict:
    """The report's numbers for ``loaded`` (``training.dataset_table.LoadedDataset``, one per world size):
    ``datasets``, ``best_schedules``, ``overlap`` and ``transfer`` (see the module docstring); ``progress``:
    a bar per cross-validation."""
    from ficco.training.crossval import cross_validate
    from ficco.training.evaluate import held_out_baselines, rounded, split_summary, unseen
    from ficco.training.metrics import score

    names = [_label(d) for d in loaded]
    cvs = []
    for d, name in zip(loaded, names, strict=True):
        print(f"{name}: cross-validating on {d.info['n_scenarios']} scenarios", flush=True)
        cvs.append(cross_validate(d.table, seed=seed, n_jobs=n_jobs, progress=progress))
    ordered = sorted(zip(loaded, names, strict=True), key=lambda pair: _world_size(pair[0]))
    transfer: dict[str, dict] = {}
    for train, cv, train_name in zip(loaded, cvs, names, strict=True):
        row: dict = {}
        for test, test_name in zip(loaded, names, strict=True):
            if test is train:
                baseline = held_out_baselines(train.table, cv.folds)["size_heuristic"]
                row[test_name] = {
                    mode: {
                        "model": score(train.table.subset(on), cv.final[on]),
                        "size_heuristic": score(train.table.subset(on), baseline[on]),
                    }
                    for mode, on in _modes(train.table)
                }
                continue
            print(f"trained on {train_name}, picking for {test_name}", flush=True)
            fresh, _ = unseen(test.table, train.table)
            split = split_summary(train.table, fresh, cv.choice, test.noise, seed=seed, n_jobs=n_jobs)
            row[test_name] = {mode: {p: s[p] for p in PICKERS if p in s} for mode, s in split.items()}
        transfer[train_name] = row
    return {
        "datasets": [_dataset_info(d, name) for d, name in zip(loaded, names, strict=True)],
        "simulated": [name for d, name in zip(loaded, names, strict=True) if _simulated(d)],
        "best_schedules": {name: best_schedules(d.table) for d, name in zip(loaded, names, strict=True)},
        "moves": {f"{a} -> {b}": moves(x, y) for (x, a), (y, b) in itertools.pairwise(ordered)},
        "serial_dma_by_size": {
            name: serial_dma_by_size(d.table) for d, name in zip(loaded, names, strict=True)
        },
        "overlap": {name: overlap(d) for d, name in zip(loaded, names, strict=True)},
        "transfer": rounded(transfer),
        "note": "transfer[train][test][mode][picker]: picks of a model (or the size heuristic) fitted on "
        "train, scored on test's scenarios that train does not hold; the diagonal is the family holdout",
    }


def best_schedules(table) -> dict[str, dict[str, float]]:
    """Per mode: the share of scenarios whose fastest schedule is of each family, and ``serial_in_best_set``
    (the share whose best set holds ``serial/sm``)."""
    from ficco.training.model import SCHEDULES, SERIAL_INDEX

    families = np.array([Schedule.parse(s).family for s in SCHEDULES], dtype=object)
    out = {}
    for mode, on in _modes(table):
        best = families[table.best[on]]
        shares = {f: float(np.mean(best == f)) for f in SCHEDULE_FAMILIES}
        out[mode] = {**shares, "serial_in_best_set": float(np.mean(table.in_best[on, SERIAL_INDEX]))}
    return out


def moves(small, large) -> dict[str, Any]:
    """How the fastest family of the same model layer moves from ``small``'s world size to ``large``'s:
    ``{"matched": n, mode: {from family: {to family: count}}}`` over the (family, layer pair, tokens) both
    datasets hold, in the modes both hold."""
    from ficco.features.model_config import layer_pairs, load_model_configs
    from ficco.training.model import SCHEDULES

    w_small, w_large = _world_size(small), _world_size(large)
    rows = {
        id(d): {key: i for i, key in enumerate(zip(d.table.scenario_ids, d.table.modes, strict=True))}
        for d in (small, large)
    }
    families = np.array([Schedule.parse(s).family for s in SCHEDULES], dtype=object)
    configs = {c.name: c for folder in CONFIG_DIRS for c in load_model_configs(REPO / folder)}
    found = set(np.asarray(small.table.families).tolist()) & set(np.asarray(large.table.families).tolist())
    out: dict[str, Any] = {"matched": 0}
    modes = sorted(set(np.asarray(small.table.modes).tolist()) & set(np.asarray(large.table.modes).tolist()))
    for name in sorted(found & set(configs)):
        for tokens in _tokens_of(small, name) & _tokens_of(large, name):
            try:
                pairs_small = layer_pairs(configs[name], tp=w_small, tokens=tokens, hardware=small.hardware)
                pairs_large = layer_pairs(configs[name], tp=w_large, tokens=tokens, hardware=large.hardware)
            except ValueError:  # the config does not split at one of the sizes
                continue
            by_name = {p.name: p.scenario.key() for p in pairs_large}
            for pair in pairs_small:
                ids = (pair.scenario.key(), by_name.get(pair.name))
                hits = [(rows[id(small)].get((ids[0], m)), rows[id(large)].get((ids[1], m))) for m in modes]
                if any(i is None or j is None for i, j in hits):
                    continue
                out["matched"] += 1
                for mode, (i, j) in zip(modes, hits, strict=True):
                    before, after = families[small.table.best[i]], families[large.table.best[j]]
                    cell = out.setdefault(mode, {}).setdefault(before, {})
                    cell[after] = cell.get(after, 0) + 1
    return out


def _tokens_of(loaded, family: str) -> set[int]:
    """The token counts (``m`` of the all-gather pairs) ``loaded`` holds for ``family``."""
    on = np.asarray(loaded.table.families) == family
    return {s.m for s, hit in zip(loaded.table.scenarios, on, strict=True) if hit and s.op == "ag_gemm"}


def serial_dma_by_size(table) -> dict[str, list[dict[str, Any]]]:
    """Per mode, per bucket of MiB each GPU receives (``SIZE_EDGES_MIB``): ``{bucket, scenarios, best,
    in_best_set}``, the shares of its scenarios whose fastest schedule is ``serial/dma`` and whose best set
    holds it."""
    from ficco.training.model import SCHEDULE_INDEX

    column = SCHEDULE_INDEX["serial/dma"]
    mib = np.array([s.comm_bytes / 2**20 for s in table.scenarios])  # the busiest rank's, received
    edges = [0.0, *SIZE_EDGES_MIB, math.inf]
    out = {}
    for mode, on in _modes(table):
        buckets = []
        for lo, hi in itertools.pairwise(edges):
            mine = on & (mib >= lo) & (mib < hi)
            if not mine.any():
                continue
            buckets.append(
                {
                    "bucket": f"{lo:g}-{hi:g} MiB" if math.isfinite(hi) else f">= {lo:g} MiB",
                    "scenarios": int(mine.sum()),
                    "best": float(np.mean(table.best[mine] == column)),
                    "in_best_set": float(np.mean(table.in_best[mine, column])),
                }
            )
        out[mode] = buckets
    return out


def overlap(loaded) -> dict[str, dict[str, Any]]:
    """Per mode: ``n_scenarios``, the geometric-mean speedup of the fastest schedule over serial and over
    async-TP (where measured), and ``executor_report.average_realized_overlap`` of the scenarios."""
    table, shapes = loaded.table, scenario_shapes(loaded)
    out = {}
    for mode, on in _modes(table):
        best, serial, async_tp = table.best_ms[on], table.serial_ms[on], table.async_tp_ms[on]
        measured = np.isfinite(async_tp)
        rows = [shapes[(sid, mode)] for sid in table.scenario_ids[on]]
        for row, b in zip(rows, best, strict=True):
            row["best_ms"] = float(b)
        out[mode] = {
            "n_scenarios": int(on.sum()),
            "speedup_vs_serial": executor_report.geomean((serial / best).tolist()),
            "speedup_vs_async_tp": executor_report.geomean((async_tp[measured] / best[measured]).tolist()),
            "realized_overlap_comm_heavy": executor_report.average_realized_overlap(rows),
        }
    return out


def scenario_shapes(loaded) -> dict[tuple[str, str], dict]:
    """Per (scenario id, mode) of ``loaded``'s dataset: the record ``executor_report`` reads (``serial_ms``,
    ``gemm_alone_ms``, ``comm_alone_ms``: NCCL's collective alone, ``dma_comm_alone_ms``), None where a
    baseline was not measured."""
    from ficco.features.dataset import load_dataset

    frame = load_dataset(loaded.paths[0])
    serial = frame[frame["schedule"] == "serial/sm"].drop_duplicates(["scenario_id", "mode"])
    out = {}
    for row in serial.itertuples(index=False):
        out[(row.scenario_id, row.mode)] = {
            "serial_ms": _value(row.time_ms),
            "gemm_alone_ms": _value(row.gemm_alone_ms),
            "comm_alone_ms": _value(row.nccl_comm_ms),
            "dma_comm_alone_ms": _value(row.dma_comm_ms),
        }
    return out


def render_markdown(summary: dict) -> str:
    """The report: datasets, best schedules, achievable overlap and the transfer matrix, with the plots."""
    simulated = set(summary["simulated"])
    lines = ["# World-size report", ""]
    if simulated:
        lines += [
            f"**Simulated:** {', '.join(sorted(simulated))} come from the simulator (`harness/sim.py`); no "
            "hardware was used for them and their numbers are not measurements. Its GEMM times were measured "
            "on one GPU, its transfers, contention and host time fitted to the 2- and 4-GPU measurements "
            "(`benchmarks/results/sim-fidelity.md`: how far its picks are from the measured best on model "
            "families the fit never saw). 8 GPUs is an extrapolation.",
            "",
        ]
    lines += ["## Datasets", ""]
    lines.append(
        markdown_table(
            ["world size", "dataset", "hardware", "source", "scenarios", "re-measured"],
            [
                [
                    d["name"],
                    d["path"],
                    d["hardware_id"],
                    d["source"],
                    d["n_scenarios"],
                    d["n_noise_scenarios"],
                ]
                for d in summary["datasets"]
            ],
        )
    )
    lines += ["", "## Best schedules", "", "Share of scenarios whose fastest schedule is of each family.", ""]
    header = ["world size", "mode", *SCHEDULE_FAMILIES, "serial in best set"]
    rows = [
        [name, mode, *(f"{s[f]:.0%}" for f in SCHEDULE_FAMILIES), f"{s['serial_in_best_set']:.0%}"]
        for name, modes in summary["best_schedules"].items()
        for mode, s in modes.items()
    ]
    lines += [markdown_table(header, rows), "", "![best family](best-family.png)", ""]
    lines += _moves_markdown(summary.get("moves", {}))
    lines += _serial_dma_markdown(summary.get("serial_dma_by_size", {}))
    lines += ["## Achievable overlap", ""]
    header = ["world size", "mode", "scenarios", "best vs serial", "best vs async-TP", "realized overlap"]
    rows = []
    for name, modes in summary["overlap"].items():
        for mode, o in modes.items():
            realized = o["realized_overlap_comm_heavy"]
            rows.append(
                [
                    name,
                    mode,
                    o["n_scenarios"],
                    _x(o["speedup_vs_serial"]),
                    _x(o["speedup_vs_async_tp"]),
                    f"{_f(realized['value'])} ({realized['shapes']} comm-heavy)",
                ]
            )
    lines += [markdown_table(header, rows), "", "![speedup CDF](speedup-cdf.png)", ""]
    lines += [
        "## Transfer across world sizes",
        "",
        "Geometric-mean regret (share of picks in the best set) of a model trained on the row's dataset, "
        "picking for the column's scenarios; size heuristic fitted on the same data in brackets. Diagonal: "
        "family holdout.",
        "",
    ]
    tests = [d["name"] for d in summary["datasets"]]
    modes = sorted({m for row in summary["transfer"].values() for cell in row.values() for m in cell})
    for mode in modes:
        rows = []
        for train, row in summary["transfer"].items():
            cells = []
            for test in tests:
                cell = row.get(test, {}).get(mode, {})
                model, heuristic = cell.get("model"), cell.get("size_heuristic")
                text = (
                    "n/a" if model is None else f"{model['geomean_regret']:.2%} ({model['in_best_set']:.0%})"
                )
                if heuristic is not None:
                    text += f" [{heuristic['geomean_regret']:.2%}]"
                cells.append(text)
            rows.append([f"train {train}", *cells])
        lines += [f"**{mode}**", "", markdown_table(["", *(f"test {t}" for t in tests)], rows), ""]
    lines += ["![transfer](transfer.png)", ""]
    return "\n".join(lines)


def _moves_markdown(moves_by_pair: dict) -> list[str]:
    """Per pair of world sizes and mode: the transition table of the fastest family, rows the smaller
    world size's, columns the larger's."""
    if not moves_by_pair:
        return []
    lines = [
        "## How the best schedule moves",
        "",
        "The same model layer (family, layer pair, tokens) at one world size and the next: how many have "
        "their fastest schedule in each family (rows: the smaller world size, columns: the larger).",
        "",
    ]
    for pair, found in moves_by_pair.items():
        for mode in (m for m in found if m != "matched"):
            table = found[mode]
            after = [f for f in SCHEDULE_FAMILIES if any(f in row for row in table.values())]
            rows = [[before, *(table[before].get(f, 0) for f in after)] for before in SCHEDULE_FAMILIES
                    if before in table]  # fmt: skip
            stay = sum(table[f].get(f, 0) for f in table)
            lines += [f"**{pair}, {mode}** ({found['matched']} layers; {stay} keep their family)", ""]
            lines += [markdown_table(["", *after], rows), ""]
    return lines


def _serial_dma_markdown(by_size: dict) -> list[str]:
    """Per world size and mode, the ``serial/dma`` shares by size bucket."""
    if not by_size:
        return []
    rows = [
        [name, mode, b["bucket"], b["scenarios"], f"{b['best']:.0%}", f"{b['in_best_set']:.0%}"]
        for name, modes in by_size.items()
        for mode, buckets in modes.items()
        for b in buckets
    ]
    return [
        "## serial/dma by size",
        "",
        "Share of scenarios whose fastest schedule is `serial/dma`, and whose best set holds it, by the MiB "
        "each GPU receives.",
        "",
        markdown_table(["world size", "mode", "MiB received", "scenarios", "fastest", "in best set"], rows),
        "",
    ]


def plot_best_family(summary: dict, path: Path) -> None:
    """Stacked bars: per (world size, mode), the share of scenarios whose fastest schedule is of each
    family."""
    import matplotlib.pyplot as plt

    bars = [
        (f"{name}\n{mode}", s)
        for name, modes in summary["best_schedules"].items()
        for mode, s in modes.items()
    ]
    fig, ax = plt.subplots(figsize=(1.3 * len(bars) + 3, 4.2))
    bottom = np.zeros(len(bars))
    for family in SCHEDULE_FAMILIES:
        share = np.array([s[family] for _, s in bars])
        ax.bar([label for label, _ in bars], share, bottom=bottom, label=family)
        bottom += share
    ax.set_ylabel("share of scenarios whose fastest schedule is of the family")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1, 0.5))
    ax.set_title(_title("Best schedule family by world size", summary))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_speedup_cdf(loaded: list, summary: dict, path: Path) -> None:
    """Per mode, the CDF of the fastest schedule's speedup over serial, one line per world size."""
    import matplotlib.pyplot as plt

    modes = sorted({m for d in loaded for m in set(d.table.modes)})
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.2), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        for d, info in zip(loaded, summary["datasets"], strict=True):
            on = d.table.modes == mode
            speedup = np.sort(d.table.serial_ms[on] / d.table.best_ms[on])
            ax.step(speedup, np.arange(1, len(speedup) + 1) / len(speedup), where="post", label=info["name"])
        ax.set_xscale("log")
        ax.set_xlabel("fastest schedule's speedup over serial/sm")
        ax.set_ylabel("fraction of scenarios")
        ax.set_title(f"{mode} mode")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(_title("Fastest schedule over serial, by world size", summary), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_transfer(summary: dict, path: Path) -> None:
    """Per mode, a heat map of the model's geometric-mean regret, train world size by test world size."""
    import matplotlib.pyplot as plt

    names = [d["name"] for d in summary["datasets"]]
    ticks = [n.replace(" (", "\n(") for n in names]
    modes = sorted({m for row in summary["transfer"].values() for cell in row.values() for m in cell})
    fig, axes = plt.subplots(1, len(modes), figsize=(4.8 * len(modes), 4.4), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        grid = np.array([[_model_regret(summary, a, b, mode) for b in names] for a in names])
        image = ax.imshow(100 * grid, cmap="viridis_r")
        middle = np.nanmax(grid) / 2
        for (i, j), value in np.ndenumerate(grid):
            color = "black" if value < middle else "white"
            ax.text(j, i, f"{value:.2%}", ha="center", va="center", color=color, fontsize=9)
        ax.set_xticks(range(len(names)), [f"test {t}" for t in ticks], fontsize=8)
        ax.set_yticks(range(len(names)), [f"train {t}" for t in ticks], fontsize=8)
        ax.set_title(f"model geomean regret, {mode} mode", fontsize=10)
        fig.colorbar(image, ax=ax, label="%", shrink=0.8)
    fig.suptitle(_title("Trained on one world size, picking for another", summary), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _model_regret(summary: dict, train: str, test: str, mode: str) -> float:
    """The model's geometric-mean regret trained on ``train``, picking for ``test`` in ``mode`` (NaN if
    absent)."""
    return summary["transfer"][train][test].get(mode, {}).get("model", {}).get("geomean_regret", np.nan)


def _dataset_info(loaded, name: str) -> dict:
    info = loaded.info
    return {
        "name": name,
        "path": info["path"],
        "hardware_id": info["hardware_id"],
        "world_size": _world_size(loaded),
        "source": "simulated" if _simulated(loaded) else "measured",
        "n_scenarios": info["n_scenarios"],
        "n_noise_scenarios": info["n_noise_scenarios"],
    }


def _world_size(loaded) -> int:
    return int(loaded.table.scenarios[0].world_size)


def _simulated(loaded) -> bool:
    return "sim" in loaded.info["backends"]


def _label(loaded) -> str:
    """``<w> GPUs``, with ``(sim)`` for a simulated dataset: every table and plot carries it."""
    return f"{_world_size(loaded)} GPUs" + (" (sim)" if _simulated(loaded) else "")


def _title(text: str, summary: dict) -> str:
    return f"{text} (simulated: {', '.join(summary['simulated'])})" if summary["simulated"] else text


def _modes(table):
    from ficco.features import MODES

    return [(m, table.modes == m) for m in MODES if m in set(table.modes)]


def _value(x) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}x"


def _f(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main()
