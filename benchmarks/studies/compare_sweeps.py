"""Two sweeps of the same scenarios, measured independently (other sessions, machines or protocols): how
far their labels agree, per mode, with the card's noise arithmetic (``harness.card.noise_summary`` and
``noise_by_size``) applied to the second sweep as if it were the first one's re-measure. How two datasets'
time ratios and fastest schedules differ per schedule family, also where they measured only neighbouring
scenarios, is ``ficco dataset compare A B`` (``harness.compare``).

    .venv/bin/python -m benchmarks.studies.compare_sweeps datasets/h200x2 datasets/h200x2-v2 \
        --out benchmarks/results/compare-h200x2-v2.json

What an independent re-measurement of the first sweep would see: whether its best sets hold the other
run's fastest schedule, how much keeping its pick would lose, and how far single times move (also with each
scenario's common shift taken out), and that shift by size (``shift``: the second sweep's time over the
first's, the median scenario; in eager mode small shapes move with the host's speed, which differs between
sessions). Only scenarios and schedules measured ok in both count. Each sweep's timing protocol (its
manifest's, with ``features.label_source.PROTOCOL_BEFORE`` for what older manifests lack) goes into the JSON,
and where the two differ (e.g. ``pin``: ``share`` against ``seek``, which times eager blocks at the host's
usual speed) the printout says so, since the eager shift then includes that. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ficco.features import MODES
from ficco.features.dataset import LABEL_STAT, load_dataset, read_manifest
from ficco.features.label_source import PROTOCOL_BEFORE
from ficco.harness.card import noise_by_size, noise_summary, size_label
from ficco.harness.compare import setting_changes
from ficco.tables import text_table


def compare(first: Path, second: Path) -> dict:
    """Per mode: ``noise_summary`` and ``noise_by_size`` of ``second`` against ``first`` (rows of the
    scenarios in both)."""
    a, b = load_dataset(first), load_dataset(second)
    common = set(a["scenario_id"]) & set(b["scenario_id"])
    if not common:
        raise SystemExit(f"{first} and {second} share no scenario_id: nothing to compare")
    a, b = a[a["scenario_id"].isin(common)], b[b["scenario_id"].isin(common)]
    out = {"first": str(first), "second": str(second), "label_stat": LABEL_STAT, "modes": {}}
    out["protocols"] = {"first": protocol_of(first), "second": protocol_of(second)}
    for mode in MODES:
        am, bm = a[a["mode"] == mode], b[b["mode"] == mode]
        if am.empty or bm.empty:
            continue
        out["modes"][mode] = {"summary": noise_summary(am, bm), "by_size": noise_by_size(am, bm)}
    return out


def protocol_of(sweep: Path) -> dict:
    """The timing protocol ``sweep``'s manifest records, older manifests completed with
    ``PROTOCOL_BEFORE`` (empty for a sweep without a manifest)."""
    manifest = read_manifest(sweep)
    return PROTOCOL_BEFORE | manifest["protocol"] if manifest and "protocol" in manifest else {}


def protocol_changes(result: dict) -> list[str]:
    """``key: first -> second`` for every protocol setting the two sweeps of ``result`` differ in
    (``harness.compare.setting_changes``)."""
    return setting_changes(result["protocols"]["first"], result["protocols"]["second"])


def render(result: dict) -> str:
    """The comparison as two text tables."""
    rows = [
        [
            mode,
            f"{s['scenarios']:.0f}",
            f"{s['rel_diff_median']:.2%}",
            f"{s['rel_diff_p90']:.2%}",
            f"{s['second_best_in_first_set']:.0%}",
            f"{s['best_set_size_median']:.0f}",
            f"{s['best_changed']:.0%}",
            f"{s['loss_when_changed_median']:.2%}",
        ]
        for mode, part in result["modes"].items()
        for s in [part["summary"]]
    ]
    header = [
        "mode",
        "scenarios",
        "rel diff median",
        "p90",
        "2nd fastest in 1st set",
        "1st set size",
        "fastest changed",
        "loss when changed",
    ]
    by_size = [
        [
            mode,
            size_label(b["size"]),
            f"{b['scenarios']:.0f}",
            f"{b['rel_median']:.2%}",
            f"{b['rel_p90']:.2%}",
            f"{b['shifted_median']:.2%}",
            f"{b['shifted_p90']:.2%}",
            f"{b['shift_median']:.3f}x",
        ]
        for mode, part in result["modes"].items()
        for b in part["by_size"]
    ]
    size_header = [
        "mode", "serial time", "scenarios", "rel diff median", "p90", "shifted median", "p90", "shift",
    ]  # fmt: skip
    title = f"{result['first']} -> {result['second']}"
    if changes := protocol_changes(result):
        title += f"\nthe sweeps' protocols differ ({'; '.join(changes)}): the shifts include that"
    return f"{title}\n{text_table(header, rows)}\n\n{text_table(size_header, by_size)}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, help="dataset directory whose labels (best sets) are checked")
    parser.add_argument("second", type=Path, help="dataset directory measured independently")
    parser.add_argument("--out", type=Path, help="JSON file to write (default: print only)")
    args = parser.parse_args(argv)
    result = compare(args.first, args.second)
    print(render(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
