"""Registered models scored on the measured datasets kept out of every training set: model families and token
counts no model was trained on, as a registered model answers them.

    .venv/bin/python -m benchmarks.kept_out           # the current h200x2 model and its predecessor
    .venv/bin/python -m benchmarks.kept_out --model h200x2/20261123T112927Z-87cad5f0 --model h200x2
    .venv/bin/python -m benchmarks.kept_out --render  # the markdown again from the JSON

Each model (``HARDWARE`` for the current one, ``HARDWARE/VERSION`` for another) answers every (scenario,
mode) of each ``--dataset`` through ``Predictor.decide``, the path every answer takes (its policy and guard
included), at the dataset's own host factor; the picks are scored on the measured times per mode
(``training.metrics.score``: geometric-mean regret, picks more than 2% slower than serial/sm), beside vLLM's
and PyTorch's serial-or-async-TP rules on the rows that measured async-TP (the model on the same rows), and
over all kept-out rows together. Writes ``benchmarks/results/kept-out-<hardware>.{json,md}`` and prints the
markdown.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import REPO, rerender
from ficco.files import write_text_atomic

KEPT_OUT = (
    "datasets/h200x2-unseen", "datasets/h200x2-unseen-v3", "datasets/h200x2-heldout",
    "datasets/h200x2-heldout-v3",
)  # fmt: skip
"""The measured 2-GPU datasets no model trains on: families and token counts kept out for this score."""
PREVIOUS = "h200x2/20261123T112927Z-87cad5f0"
"""The model the current one replaced, scored beside it by default."""
RULES = ("vllm_sp_rule", "pytorch_autoheuristic")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument(
        "--model",
        action="append",
        default=None,
        help="HARDWARE (its current model) or HARDWARE/VERSION; repeat",
    )
    parser.add_argument(
        "--dataset", action="append", type=Path, default=None, help="A kept-out dataset; repeat"
    )
    parser.add_argument("--model-root", type=Path, default=REPO / "models", help="Model registry root")
    parser.add_argument("--out", type=Path, default=None, help="Results JSON (default: kept-out-<hw>.json)")
    parser.add_argument("--render", action="store_true", help="Only write the markdown from the JSON")
    args = parser.parse_args(argv)
    args.model = args.model or [PREVIOUS, "h200x2"]
    args.dataset = args.dataset or [REPO / d for d in KEPT_OUT]
    hardware = args.model[-1].split("/")[0]
    args.out = args.out or REPO / "benchmarks" / "results" / f"kept-out-{hardware}.json"
    return args


def _scores(table: Any, picks: np.ndarray, rules: dict[str, np.ndarray]) -> dict[str, Any]:
    """Each mode's scores of ``picks`` on ``table`` and of the serial-or-async-TP ``rules`` with the model on
    their rows (``training.evaluate.pickers_summary``); the metrics JSON keeps."""
    from ficco.training.evaluate import pickers_summary

    keep = ("geomean_regret", "n_slower_than_serial_2pct", "in_best_set", "n_scenarios")
    out = {}
    for mode in sorted(set(table.modes.tolist())):
        on = table.modes == mode
        summary, _ = pickers_summary(
            table.subset(on), {"model": picks[on]}, None, {r: fused[on] for r, fused in rules.items()}
        )
        out[mode] = {name: {k: m.get(k) for k in keep} for name, m in summary.items() if "n_scenarios" in m}
    return out


def run(models: list[str], datasets: list[Path], root: Path) -> dict[str, Any]:
    """Score every model of ``models`` (``HARDWARE[/VERSION]`` under ``root``) on each dataset and on all
    together; the results dict."""
    from ficco.training.dataset_table import concat_tables, load_dataset_table
    from ficco.training.peer_rules import pytorch_autoheuristic, vllm_sp_rule
    from ficco.training.predict.registry import load_predictor

    predictors = {}
    for spec in models:
        hardware, _, version = spec.partition("/")
        predictor = load_predictor(root, hardware, version or None)
        predictors[f"{hardware}/{predictor.version}"] = predictor
    tables = {
        str(p.relative_to(REPO) if p.is_relative_to(REPO) else p): load_dataset_table(p).table
        for p in datasets
    }
    tables["all kept-out sets"] = concat_tables(*tables.values())
    result: dict[str, Any] = {"models": {}, "datasets": {}}
    for name, predictor in predictors.items():
        result["models"][name] = {
            "feature_schema": predictor.feature_schema,
            "trained_on": (predictor.card.get("dataset") or {}).get("path"),
        }
    for label, table in tables.items():
        rules = {
            "vllm_sp_rule": vllm_sp_rule(table.scenarios),
            "pytorch_autoheuristic": pytorch_autoheuristic(table.scenarios),
        }
        entry: dict[str, Any] = {"n_rows": len(table), "host_factor": float(table.host_factor), "models": {}}
        for name, predictor in predictors.items():
            picks = predictor.decide(table.X, table.modes, host_factor=table.host_factors).final
            entry["models"][name] = _scores(table, picks, rules)
        result["datasets"][label] = entry
        print(f"scored {label}", flush=True)
    result["when"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return result


def render(result: dict[str, Any]) -> str:
    """The markdown of ``result``: per dataset and mode, each model's regret (slow picks), the rules' on their
    rows beside the last model's on the same rows."""
    names = list(result["models"])
    last = names[-1]
    head = " | ".join(f"`{n}`" for n in names)
    lines = [
        "# Kept-out datasets\n",
        "Written by `python -m benchmarks.kept_out`. Each registered model answers every (scenario, mode) of "
        "the measured datasets no model trains on, as a served answer is made (its policy and guard "
        "included), at each dataset's own host factor; geometric-mean regret against the measured best, "
        "in brackets the picks more than 2% slower than serial/sm. The rules choose between serial and "
        f"PyTorch's async-TP, on the rows that measured async-TP, beside `{last}` on the same rows.\n",
        f"| dataset | mode | rows | {head} | vLLM's rule | PyTorch's tree | `{last}` on their rows |",
        "|---|---|---|" + "---|" * (len(names) + 3),
    ]
    for label, entry in result["datasets"].items():
        modes = entry["models"][last]
        for mode, scores in modes.items():
            cells = []
            for n in names:
                m = entry["models"][n][mode]["model"]
                cells.append(f"{100 * m['geomean_regret']:.2f}% ({m['n_slower_than_serial_2pct']})")
            rule_cells = []
            for rule in (*RULES, "model_on_async_tp_rows"):
                m = scores.get(rule)
                rule_cells.append(
                    "-" if not m else f"{100 * m['geomean_regret']:.2f}% ({m['n_slower_than_serial_2pct']})"
                )
            rows = scores["model"]["n_scenarios"]
            lines.append(f"| {label} | {mode} | {rows} | " + " | ".join(cells + rule_cells) + " |")
    lines.append("\nModels: " + "; ".join(f"`{n}`: {json.dumps(v)}" for n, v in result["models"].items()))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.render:
        rerender(args.out, render)
        return
    result = run(args.model, args.dataset, args.model_root)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(result, indent=1) + "\n")
    markdown = render(result)
    write_text_atomic(args.out.with_suffix(".md"), markdown)
    print(markdown)


if __name__ == "__main__":
    main()
