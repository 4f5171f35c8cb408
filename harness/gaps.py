"""What a dataset's plan holds that its measurements lack, and the device time measuring it would take.

A sweep may stop before its plan is done (a budget, a failure), so a dataset, and every model trained on it,
can lack whole parts of the plan: the shape grid, model families, MoE routings, the re-measure that gives the
noise figures. :func:`dataset_gaps` lists them from ``plan.json`` and ``manifest.json`` and prices them at the
dataset's own measured pace (its card's rows per minute); ``ficco train`` records it in the model card
(``gaps``), and docs/models.md shows it for the shipped models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ficco.features import candidates
from ficco.features.dataset import GRID_FAMILY
from ficco.harness.plan import Plan

REMEASURE_SCENARIOS = 64
"""Scenarios a dataset measures again for its noise figures (``ficco bench --remeasure``, at least 64)."""
NOISE_FILE = "noise.parquet"


def _remeasured(directory: Path) -> int:
    """Distinct scenarios in the dataset's re-measure (``noise.parquet``); 0 without one."""
    path = directory / NOISE_FILE
    if not path.is_file():
        return 0
    import pyarrow.parquet as pq

    return len(set(pq.read_table(path, columns=["scenario_id"]).column("scenario_id").to_pylist()))


def dataset_gaps(directory: str | Path) -> dict[str, Any] | None:
    """The parts of ``directory``'s plan its measurements lack, and what measuring them would cost; None for
    a dataset without a plan or manifest (a single Parquet file, an old layout).

    Keys: ``dataset``; ``planned`` and ``measured`` scenarios; ``grid`` ([measured, planned] shapes of the
    log-uniform grid); ``families`` (family -> [measured, planned] scenarios, for each family the sweep did
    not finish; a scenario two families share counts for both); ``moe_routings`` ({"planned", "measured"}
    lists of [experts, top_k]); ``remeasured`` (scenarios of the noise re-measure); ``rows_per_minute``
    (the sweep's measured pace); ``to_measure`` (the unmeasured scenarios, their rows: every candidate
    schedule in every mode, and device minutes at that pace); ``to_remeasure`` (a re-measure of
    :data:`REMEASURE_SCENARIOS` scenarios where none was made; minutes at the mean rows per measured
    scenario).
    """
    directory = Path(directory)
    if not (directory / "plan.json").is_file() or not (directory / "manifest.json").is_file():
        return None
    plan = Plan.from_json((directory / "plan.json").read_text())
    manifest = json.loads((directory / "manifest.json").read_text())
    finished = set(manifest.get("finished", []))
    modes = (manifest.get("protocol") or {}).get("modes") or ["eager", "graph"]
    counts: dict[str, list[int]] = {}
    routings: dict[tuple[int, int], bool] = {}
    missing = []
    for family, scenario in plan:
        key = scenario.key()
        done = key in finished
        for name in plan.shared.get(key, (family,)):
            counts.setdefault(name, [0, 0])
            counts[name][0] += done
            counts[name][1] += 1
        if scenario.experts:
            routing = (scenario.experts, scenario.top_k)
            routings[routing] = routings.get(routing, False) or done
        if not done:
            missing.append(scenario)
    rows, seconds = int(manifest.get("rows", 0)), float(manifest.get("seconds", 0.0))
    pace = rows / (seconds / 60) if rows and seconds > 0 else None
    missing_rows = sum(len(candidates(s)) for s in missing) * len(modes)
    remeasured = _remeasured(directory)
    measured = len(finished & {s.key() for _, s in plan})
    per_scenario = rows / len(finished) if finished else 0.0
    return {
        "dataset": str(directory),
        "planned": len(plan),
        "measured": measured,
        "grid": counts.get(GRID_FAMILY, [0, 0]),
        "families": {f: c for f, c in counts.items() if f != GRID_FAMILY and c[0] < c[1]},
        "moe_routings": {
            "planned": [list(r) for r in sorted(routings)],
            "measured": [list(r) for r in sorted(routings) if routings[r]],
        },
        "remeasured": remeasured,
        "rows_per_minute": None if pace is None else round(pace),
        "to_measure": {
            "scenarios": len(missing),
            "rows": missing_rows,
            "device_minutes": None if pace is None else round(missing_rows / pace, 1),
        },
        "to_remeasure": None
        if remeasured
        else {
            "scenarios": REMEASURE_SCENARIOS,
            "device_minutes": None if pace is None else round(REMEASURE_SCENARIOS * per_scenario / pace, 1),
        },
    }


def gaps_line(gaps: dict[str, Any]) -> str | None:
    """:func:`dataset_gaps` as one line for people (``ficco train`` prints it); None when nothing lacks."""
    parts = []
    grid_done, grid_planned = gaps["grid"]
    if grid_done < grid_planned:
        parts.append(f"grid shapes {grid_done}/{grid_planned}")
    parts += [f"{family} {done}/{planned}" for family, (done, planned) in gaps["families"].items()]
    routings = gaps["moe_routings"]
    lacking = [r for r in routings["planned"] if r not in routings["measured"]]
    if lacking:
        parts.append("MoE routings (experts, top_k) " + ", ".join(f"({e}, {k})" for e, k in lacking))
    if gaps["to_remeasure"] is not None:
        parts.append("no noise re-measure")
    if not parts:
        return None
    measure, remeasure = gaps["to_measure"], gaps["to_remeasure"]
    cost = [f"{measure['scenarios']} scenarios, {measure['device_minutes']} min"]
    if remeasure is not None:
        cost.append(f"a {remeasure['scenarios']}-scenario re-measure, {remeasure['device_minutes']} min")
    return (
        f"{gaps['dataset']} measured {gaps['measured']} of its plan's {gaps['planned']} scenarios; it lacks "
        f"{'; '.join(parts)}. Measuring them would take about {' and '.join(cost)} of GPU time at its pace "
        f"({gaps['rows_per_minute']} rows per minute; the model card's gaps)"
    )
