"""``ficco results``: the results page (``docs/results.md``), generated from the committed results.

Every number on the page is read from a committed file (the evaluations, the benchmarks' JSON, the current
model's card), so the page cannot drift from its data; ``tests/training/test_results.py`` fails when the
committed page differs from what this writes.

    ficco results --out docs/results.md
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from ficco.files import write_text_atomic
from ficco.tables import markdown_table

ROOT = Path(__file__).resolve().parents[1]
"""The checkout whose committed results the page reads."""
RESULTS = Path("benchmarks/results")
EVALUATIONS = (
    "evaluate-h200x2.json",
    "evaluate-h200x2-unseen.json",
    "evaluate-h200x2-heldout.json",
    "evaluate-h200x2-heldout-v3.json",
)
"""Model evaluations: the first holds out model families of the training data, each of them scores the model
on a test set of families it never saw (``transfer``)."""
PICKERS = (
    ("model", "model"),
    ("ceiling", "noise ceiling"),
    ("size_heuristic", "size heuristic"),
    ("best_fixed", "best fixed schedule"),
    ("always_serial", "always serial"),
    ("always_async_tp", "always async-TP"),
)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}%"


def _read(root: Path, name: str) -> dict[str, Any]:
    return json.loads((root / RESULTS / name).read_text())


def predictor_section(root: Path) -> list[str]:
    """The current model and its family holdout, per mode and picker."""
    hardware = "h200x2"
    version = (root / "models" / hardware / "CURRENT").read_text().strip()
    card = json.loads((root / "models" / hardware / version / "card.json").read_text())
    data = _read(root, EVALUATIONS[0])
    rows = []
    for mode in data["modes"]:
        holdout = data["modes"][mode]["family_holdout"]
        for key, name in PICKERS:
            if m := holdout.get(key):
                rows.append(
                    [
                        mode,
                        name,
                        _pct(m["geomean_regret"]),
                        _pct(m["in_best_set"]),
                        m["n_slower_than_serial_2pct"],
                        _pct(m["max_regret"]),
                        m["n_scenarios"],
                    ]
                )
    return [
        "## Predictor",
        "",
        f"Model `{hardware}/{version}` (objective `{card['objective']}`, feature schema "
        f"`{card['feature_schema_version']}`, training host factor {card['host_factor']}), trained on "
        f"`{data['dataset']['path']}`. Model families held out by grouped cross-validation "
        f"(`{RESULTS / EVALUATIONS[0]}`):",
        "",
        markdown_table(
            [
                "mode",
                "picker",
                "geomean regret",
                "pick in best set",
                "> 2% slower than serial",
                "largest regret",
                "scenarios",
            ],
            rows,
        ),
    ]


def transfer_section(root: Path) -> list[str]:
    """The model on sets of families it never saw, asked at the test machine's host factor and at its own."""
    rows = []
    for name in EVALUATIONS:
        data = _read(root, name)
        if not data.get("transfer_dataset"):
            continue
        cells = [
            f"`{data['transfer_dataset']['path']}`",
            data["transfer_split"]["n_scenarios"],
            f"{data['transfer_split']['host_factor']['transfer']:.2f}",
        ]
        eager, graph = data["modes"]["eager"]["transfer"], data["modes"]["graph"]["transfer"]
        at_own = eager.get("model_at_training_host_factor")
        cells += [
            _pct(eager["model"]["geomean_regret"]),
            _pct(at_own and at_own["geomean_regret"]),
            _pct(eager["size_heuristic"]["geomean_regret"]),
            _pct(graph["model"]["geomean_regret"]),
            _pct(graph["size_heuristic"]["geomean_regret"]),
        ]
        rows.append(cells)
    header = [
        "test set",
        "scenarios",
        "host factor",
        "eager",
        "eager at training host factor",
        "eager, size heuristic",
        "graph",
        "graph, size heuristic",
    ]
    return [
        "## Unseen model families",
        "",
        "Geomean regret on test sets of families the model never saw (`transfer` of each `evaluate-*.json`):",
        "",
        markdown_table(header, rows),
    ]


def executor_section(root: Path) -> list[str]:
    """The all-to-all alone and the all-gather bandwidth: NCCL against the copy engines."""
    a2a = _read(root, "a2a-h200x2.json")
    rows = [
        [
            f"{row['bytes_per_peer'] // 1024:,}",
            f"{row['nccl_ms']:.3f}",
            f"{row['dma_ms']:.3f}",
            f"{row['dma_ms'] / row['nccl_ms']:.2f}",
        ]
        for row in a2a["sizes"]
        if row["dma_ms"]
    ]
    gather = _read(root, "executor-h200x2.json")["allgather_bandwidth"]
    bandwidth = [
        [
            f"{row['mbytes']:,}",
            f"{row['nccl_ms']:.3f}",
            f"{row['dma_ms']:.3f}",
            f"{row['nccl_ms'] / row['dma_ms']:.2f}",
        ]
        for row in gather
    ]
    return [
        "## Executor on 2 x H200",
        "",
        f"All-to-all alone (`{RESULTS}/a2a-h200x2.json`), per call; goal: {a2a['goal']['note']}.",
        "",
        markdown_table(["KiB per peer", "NCCL ms", "copy engines ms", "copy engines / NCCL"], rows),
        "",
        f"All-gather alone (`{RESULTS}/executor-h200x2.json`), MiB each GPU receives:",
        "",
        markdown_table(["MiB", "NCCL ms", "copy engines ms", "speedup of the copy engines"], bandwidth),
    ]


def block_section(root: Path) -> list[str]:
    """The transformer block benchmark: geomean step speedup over serial NCCL per variant."""
    data = _read(root, "block-h200x2.json")
    speedups = data["summary"]["speedup_vs_serial_gmean"]
    rows = [[variant, f"{value:.3f}"] for variant, value in speedups.items()]
    return [
        "## Transformer block",
        "",
        f"Llama-3.1 layers at TP=2, sequence parallel, "
        f"{len(data['points'])} points (`{RESULTS}/block-h200x2.json`, planner: "
        f"{data['meta']['planner_source']}): geomean step speedup over serial NCCL.",
        "",
        markdown_table(["variant", "speedup"], rows),
    ]


def service_section(root: Path) -> list[str]:
    """The service's latency under load and the predictor's fast path."""
    data = _read(root, "service-cpu.json")
    rows = [[f"{row['rate']:g}", row["p50_ms"], row["p99_ms"], row["errors"]] for row in data["latency"]]
    beside = data["beside_batches"]
    rows.append(
        [
            f"{beside['rate']:g} beside 10,000-scenario batches",
            beside["p50_ms"],
            beside["p99_ms"],
            beside["errors"],
        ]
    )
    fast = _read(root, "predict-fastpath.json")
    single = [[key, f"{value['median_us']:.0f}"] for key, value in fast["single"].items()]
    return [
        "## Service and predictor speed",
        "",
        f"`/v1/recommend` on {data['machine'].get('cpus', 'a')}-core CPU, load generator beside the server "
        f"(`{RESULTS}/service-cpu.json`); a batch of {data['batch']['size']:,} takes "
        f"{data['batch']['median_s']} s, start-up {data['startup_s']} s.",
        "",
        markdown_table(["requests/s", "p50 ms", "p99 ms", "errors"], rows),
        "",
        f"One decision (`{RESULTS}/predict-fastpath.json`, model `{fast['model_version']}`), microseconds:",
        "",
        markdown_table(["mode/path", "median us"], single),
    ]


SECTIONS: tuple[Callable[[Path], list[str]], ...] = (
    predictor_section,
    transfer_section,
    executor_section,
    block_section,
    service_section,
)
"""The page's sections, in order."""


def render_results(root: Path = ROOT) -> str:
    """The results page (markdown) from ``root``'s committed results."""
    intro = (
        "Generated by `ficco results --out docs/results.md` from the committed files it names; do not edit "
        "by hand. Regret: how much slower the pick is than the fastest measured schedule (docs/glossary.md)."
    )
    lines = ["# Results", "", intro, ""]
    for section in SECTIONS:
        lines += [*section(root), ""]
    return "\n".join(lines)


def results_command(
    out: Annotated[Path, typer.Option("--out", help="Where to write the page.")] = Path("docs/results.md"),
) -> None:
    """Write the results page from the committed evaluations and benchmark results."""
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, render_results())
    typer.echo(f"results: {out}")
