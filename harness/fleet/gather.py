"""Gather: the shards of one sweep (``harness.fleet.shards``), measured on any number of machines, into one
ordinary dataset directory. ``gather`` refuses shards that do not belong together (naming every key that
differs) and missing or unfinished ones unless ``partial``, keeps each row once, and records the shards,
machines and runs in the manifest's ``gathered`` entry. See docs/fleet.md, "Gather".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ficco.features.dataset import (
    FORMAT,
    MANIFEST,
    NOISE,
    PLAN,
    frame_hash,
    load_dataset,
    load_noise,
    read_manifest,
)
from ficco.harness.dataset import write_json_atomic, write_parquet_atomic
from ficco.harness.fleet.shards import SHARDS_DIR, code_version, read_runs

if TYPE_CHECKING:
    import pandas as pd

ROW_KEY = ["scenario_id", "mode", "schedule"]
"""What makes a dataset row unique."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardDir:
    """One shard directory as read by :func:`read_shard`."""

    directory: Path
    manifest: dict[str, Any]
    plan: dict[str, Any]
    """Its ``plan.json`` (the shard's part of the plan; ``settings["shard"]`` says which)."""

    @property
    def shard(self) -> dict[str, Any]:
        return self.plan["settings"]["shard"]

    @property
    def label(self) -> str:
        return f"{self.shard['index']}/{self.shard['count']}"

    def unfinished(self) -> list[str]:
        """Scenario ids of the shard's plan not yet measured."""
        done = set(self.manifest["finished"])
        return [sid for sid in _entry_ids(self.plan) if sid not in done]


@dataclass(frozen=True, kw_only=True, slots=True)
class Gathered:
    """What :func:`gather` wrote and found."""

    out: Path
    shards: int
    rows: int
    duplicates: int
    """Rows dropped because an earlier shard directory held them."""
    missing_shards: list[int]
    """Shard indices of the plan that no directory held."""
    unfinished: dict[str, int]
    """Shard (``I/N``) -> scenarios of its part not measured (only shards with some)."""
    rows_hash: str
    """``frame_hash`` of the rows written."""


def find_shards(paths: Sequence[str | Path]) -> list[Path]:
    """The shard directories ``paths`` name: each a dataset directory, or a folder holding ``shard-*``
    directories (directly or in its ``shards/``). ``ValueError`` names a path that is neither."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if (path / MANIFEST).is_file():
            found.append(path)
            continue
        inner = [p for base in (path, path / SHARDS_DIR) for p in sorted(base.glob("shard-*")) if p.is_dir()]
        if not inner:
            raise ValueError(
                f"{path} is neither a shard directory (it has no {MANIFEST}) nor a folder of shard-* "
                "directories (`ficco fleet shard --shard I/N --out DIR` writes DIR/shards/shard-*)"
            )
        found += inner
    return list(dict.fromkeys(found))


def read_shard(directory: Path) -> ShardDir:
    """The manifest and plan of shard ``directory``; ``ValueError`` if it is not a shard of a sweep."""
    manifest = read_manifest(directory)
    if manifest is None:
        raise ValueError(f"{directory} has no {MANIFEST}: not a dataset directory")
    try:
        plan = json.loads((directory / PLAN).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read the plan of {directory}: {err}") from None
    if "shard" not in plan.get("settings", {}):
        raise ValueError(
            f"{directory} is a whole dataset, not a shard (its {PLAN} has no settings.shard); gather "
            "takes the directories `ficco fleet shard` writes"
        )
    return ShardDir(directory=directory, manifest=manifest, plan=plan)


def sweep_identity(shard: ShardDir) -> dict[str, Any]:
    """What every shard of one dataset must share, as flat ``key -> value``: backend, ``hardware.*``,
    ``fingerprint.*``, ``protocol.*``, the plan hash and the shard count."""
    m = shard.manifest
    return {
        "backend": m["backend"],
        **{f"hardware.{k}": v for k, v in m["hardware"].items()},
        **{f"fingerprint.{k}": v for k, v in m["fingerprint"].items()},
        **{f"protocol.{k}": v for k, v in m.get("protocol", {}).items()},
        "plan_hash": shard.shard["plan_hash"],
        "shard_count": shard.shard["count"],
    }


def check_same_sweep(shards: Sequence[ShardDir]) -> None:
    """Raise ``ValueError`` naming every key of :func:`sweep_identity` on which the shards differ, with each
    value and the shards holding it."""
    identities = [sweep_identity(s) for s in shards]
    keys = sorted({k for i in identities for k in i})
    differ = []
    for key in keys:
        holders: dict[str, list[str]] = {}
        for shard, identity in zip(shards, identities, strict=True):
            holders.setdefault(json.dumps(identity.get(key), sort_keys=True), []).append(shard.label)
        if len(holders) > 1:
            sides = " vs ".join(f"{value} (shards {', '.join(who)})" for value, who in holders.items())
            differ.append(f"{key}: {sides}")
    if differ:
        raise ValueError(
            "refusing to gather shards of different fingerprints or plans; they differ in "
            f"{len(differ)} key(s):\n  " + "\n  ".join(differ)
        )


def gather(paths: Sequence[str | Path], out: str | Path, *, partial: bool = False) -> Gathered:
    """Union the shards ``paths`` (:func:`find_shards`) into dataset ``out``. Raises ``ValueError`` for shards
    of different sweeps, missing or unfinished shards unless ``partial``, and an ``out`` holding a dataset."""
    import pandas as pd

    out = Path(out)
    if read_manifest(out) is not None:
        raise ValueError(f"{out} already holds a dataset; gather into a new directory")
    shards = [read_shard(d) for d in find_shards(paths)]
    if not shards:
        raise ValueError("no shard directories given")
    check_same_sweep(shards)
    count = shards[0].shard["count"]
    missing = sorted(set(range(count)) - {s.shard["index"] for s in shards})
    unfinished = {s.label: n for s in shards if (n := len(s.unfinished()))}
    if (missing or unfinished) and not partial:
        raise ValueError(_incomplete_message(missing, unfinished, count))
    frames, seen, duplicates = [], set(), 0
    for shard in shards:
        frame, dropped = _new_rows(load_dataset(shard.directory), seen)
        frames.append(frame)
        duplicates += dropped
    rows = pd.concat(frames, ignore_index=True)
    digest = frame_hash(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "parts").mkdir(exist_ok=True)
    parts = []
    for k, (shard, frame) in enumerate(zip(shards, frames, strict=True)):
        name = f"parts/part-{k:05d}.parquet"
        write_parquet_atomic(out / name, frame, _part_metadata(shard))
        parts.append({"file": name, "rows": len(frame), "scenarios": int(frame["scenario_id"].nunique())})
    noise = _gathered_noise(shards)
    if noise is not None:
        write_parquet_atomic(out / NOISE, noise)
    plan = merged_plan(shards)
    write_json_atomic(out / PLAN, plan)
    finished = set(rows["scenario_id"])
    first = shards[0].manifest
    manifest = {
        "format": FORMAT,
        "backend": first["backend"],
        "hardware": first["hardware"],
        "fingerprint": first["fingerprint"],
        "protocol": first.get("protocol", {}),
        "created": min(s.manifest["created"] for s in shards),
        "updated": datetime.now(UTC).isoformat(timespec="seconds"),
        "parts": parts,
        "finished": [sid for sid in _entry_ids(plan) if sid in finished],
        "rows": len(rows),
        "seconds": round(sum(s.manifest["seconds"] for s in shards), 3),
        "gathered": {
            "plan_hash": shards[0].shard["plan_hash"],
            "shard_count": count,
            "rows_hash": digest,
            "duplicates_dropped": duplicates,
            "missing_shards": missing,
            "unfinished": unfinished,
            "gathered_by": code_version(),
            "shards": [_shard_record(s, f) for s, f in zip(shards, frames, strict=True)],
        },
    }
    write_json_atomic(out / MANIFEST, manifest)
    from ficco.harness.card import write_card

    write_card(out)
    return Gathered(
        out=out,
        shards=len(shards),
        rows=len(rows),
        duplicates=duplicates,
        missing_shards=missing,
        unfinished=unfinished,
        rows_hash=digest,
    )


def _incomplete_message(missing: list[int], unfinished: dict[str, int], count: int) -> str:
    lines = []
    if missing:
        lines.append(f"missing shard(s) {missing} of {count}")
    lines += [f"shard {label}: {n} scenario(s) not measured yet" for label, n in unfinished.items()]
    return (
        "the sweep is incomplete:\n  " + "\n  ".join(lines) + "\nRun the missing shards (the same `ficco "
        "bench --shard I/N` command resumes one), or pass --partial to gather what there is"
    )


def _entry_ids(plan: dict[str, Any]) -> list[str]:
    """Scenario ids of a ``plan.json``'s entries, in order."""
    from ficco.features import Scenario

    return [Scenario.from_dict(s).key() for _, s in plan["entries"]]


def _new_rows(frame: pd.DataFrame, seen: set[tuple[str, str, str]]) -> tuple[pd.DataFrame, int]:
    """``frame`` without rows whose ``ROW_KEY`` is in ``seen`` or repeated within it (``seen`` grows);
    returns the kept rows and how many were dropped."""
    import pandas as pd

    keys = pd.MultiIndex.from_frame(frame[ROW_KEY])
    kept = frame[~(keys.isin(seen) | keys.duplicated())].reset_index(drop=True)
    seen.update(keys)
    return kept, len(frame) - len(kept)


def _part_metadata(shard: ShardDir) -> dict[str, Any]:
    return {
        "fingerprint": shard.manifest["fingerprint"],
        "plan_hash": shard.shard["plan_hash"],
        "code_version": ", ".join(sorted({r["code_version"] for r in read_runs(shard.directory)})),
        "shard": shard.label,
    }


def _gathered_noise(shards: Sequence[ShardDir]) -> pd.DataFrame | None:
    """The shards' re-measured rows, each ``ROW_KEY`` once; None if no shard re-measured."""
    import pandas as pd

    frames = [n for s in shards if (n := load_noise(s.directory)) is not None]
    if not frames:
        return None
    return pd.concat(frames, ignore_index=True).drop_duplicates(ROW_KEY).reset_index(drop=True)


def merged_plan(shards: Sequence[ShardDir]) -> dict[str, Any]:
    """The whole plan's ``plan.json`` from its shards' parts: entries back in plan order (by the positions
    each shard records), the families sharing a scenario united, ``settings`` without the shard (its
    ``estimated_minutes`` the shards' sum)."""
    placed: dict[int, list] = {}
    shared: dict[str, list[str]] = {}
    for shard in shards:
        for position, entry in zip(shard.shard["positions"], shard.plan["entries"], strict=True):
            placed.setdefault(position, entry)
        shared.update(shard.plan["shared"])
    settings = {k: v for k, v in shards[0].plan["settings"].items() if k != "shard"}
    estimated = sum(s.shard["estimated_seconds"] for s in shards)
    settings["estimated_minutes"] = round(estimated / 60, 2)
    return {
        "settings": settings,
        "entries": [placed[p] for p in sorted(placed)],
        "shared": shared,
        "dropped": shards[0].plan["dropped"],
    }


def _shard_record(shard: ShardDir, frame: pd.DataFrame) -> dict[str, Any]:
    runs = read_runs(shard.directory)
    return {
        "shard": shard.label,
        "directory": str(shard.directory),
        "scenarios": int(frame["scenario_id"].nunique()),
        "rows": len(frame),
        "seconds": shard.manifest["seconds"],
        "estimated_seconds": shard.shard["estimated_seconds"],
        "machines": sorted({r["machine"] for r in runs}),
        "runs": [{k: r[k] for k in ("started", "engine", "job", "machine", "shared_node")} for r in runs],
        "code_versions": sorted({r["code_version"] for r in runs}),
    }
