"""The sweep: every candidate schedule of every planned scenario, written so that nothing is lost.

Crash safety (``kill -9`` at any point, then the same command again):

1. Rows are buffered and flushed about every ``flush_seconds`` as a new part: written to a temporary
   file, fsynced, then renamed to ``parts/part-XXXXX.parquet`` (``os.replace``).
2. Only then is the manifest rewritten (temporary file + ``os.replace``) to list the part and its finished
   scenario ids. A part not in the manifest (a crash between 1 and 2) is ignored, and overwritten by the
   next flush, which takes the same index.
3. On start the manifest's finished ids are skipped: nothing is measured twice, nothing written twice.

Under torchrun every rank runs ``run_sweep`` with the same plan: all ranks read the manifest before their
first (collective) ``measure``, so they skip the same scenarios in the same order; only rank 0 writes.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ficco.features import HardwareProfile, Scenario, candidates
from ficco.harness.backend import Backend, Measurement, ScenarioResult
from ficco.harness.dataset import (
    FORMAT,
    MANIFEST,
    NOISE,
    PLAN,
    load_noise,
    read_manifest,
    result_rows,
    rows_frame,
    write_json_atomic,
)
from ficco.harness.fingerprint import fingerprint_differences
from ficco.harness.plan import Plan

if TYPE_CHECKING:
    import pandas as pd

FLUSH_SECONDS = 10.0
"""Seconds of measurements buffered before a part is written (the most a crash can lose)."""
MAX_FAILING_START = 3
"""A sweep whose first this-many scenarios all raise in ``measure`` stops (the backend is broken)."""


class FingerprintMismatch(ValueError):
    """Resuming a dataset on a machine or software stack other than the one that measured it."""


def run_sweep(
    plan: Sequence[tuple[str, Scenario]],
    backend: Backend,
    out_dir: str | Path,
    *,
    progress: bool = True,
    remeasure: int = 0,
    flush_seconds: float = FLUSH_SECONDS,
) -> Path:
    """Measure every candidate schedule of every scenario of ``plan`` not yet in ``out_dir``, then
    re-measure ``remeasure`` finished scenarios (spread over the plan) into ``noise.parquet``.

    Returns ``out_dir``. Raises ``FingerprintMismatch`` naming the differing keys when ``out_dir`` was
    measured with another fingerprint, ``ValueError`` for a plan mixing hardware profiles.
    """
    out = Path(out_dir)
    writer = backend.rank == 0
    hardware = _plan_hardware(plan)
    manifest = _open_manifest(out, backend, hardware, writer)
    noise = load_noise(out)  # read now: every rank must see the same state before its first measure
    if writer and isinstance(plan, Plan):
        write_json_atomic(out / PLAN, json.loads(plan.to_json()))
    first: dict[str, tuple[str, Scenario]] = {}
    for family, scenario in plan:
        first.setdefault(scenario.key(), (family, scenario))
    unique = list(first.values())
    finished = set(manifest["finished"])
    todo = [(f, s) for f, s in unique if s.key() not in finished]
    _log(writer, f"{out}: {len(unique) - len(todo)} of {len(unique)} scenarios already measured")
    sink = _PartSink(out, manifest, writer, flush_seconds)
    _measure_all(todo, backend, sink, progress and writer, len(unique), "bench")
    sink.flush()
    if remeasure > 0:
        finished |= {s.key() for _, s in todo}
        _remeasure(unique, finished, noise, backend, out, remeasure, progress and writer, flush_seconds)
    return out


def _log(writer: bool, text: str) -> None:
    if writer:
        print(text, file=sys.stderr, flush=True)


def _plan_hardware(plan: Sequence[tuple[str, Scenario]]) -> HardwareProfile | None:
    ids = {s.hardware.id for _, s in plan}
    if len(ids) > 1:
        raise ValueError(f"a plan must use one hardware profile; got {sorted(ids)}")
    return plan[0][1].hardware if plan else None


def _open_manifest(out: Path, backend: Backend, hardware: HardwareProfile | None, writer: bool) -> dict:
    """The existing manifest (after checking fingerprint and hardware) or a new one (written by rank 0)."""
    fingerprint = backend.fingerprint()
    manifest = read_manifest(out)
    if manifest is not None:
        diff = fingerprint_differences(manifest["fingerprint"], fingerprint)
        if diff:
            raise FingerprintMismatch(
                f"refusing to resume {out}: it was measured with a different fingerprint.\n  "
                + "\n  ".join(diff)
                + "\nStart a new dataset with another --out directory."
            )
        if hardware is not None and manifest["hardware"]["id"] != hardware.id:
            raise ValueError(
                f"refusing to resume {out}: it holds hardware {manifest['hardware']['id']!r}, the plan "
                f"targets {hardware.id!r}"
            )
        return manifest
    if hardware is None:
        raise ValueError(f"{out} has no dataset yet and the plan is empty: nothing to measure")
    now = _now()
    manifest = {
        "format": FORMAT,
        "backend": backend.name,
        "hardware": hardware.to_dict(),
        "fingerprint": fingerprint,
        "created": now,
        "updated": now,
        "parts": [],
        "finished": [],
        "rows": 0,
        "seconds": 0.0,
    }
    if writer:
        (out / "parts").mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / MANIFEST, manifest)
    return manifest


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _measure_one(backend: Backend, scenario: Scenario) -> ScenarioResult:
    """``backend.measure`` over every candidate; an exception marks every schedule failed."""
    schedules = candidates(scenario)
    try:
        return backend.measure(scenario, schedules)
    except Exception as err:  # the backend broke on this scenario: record it, keep the sweep going
        error = f"{type(err).__name__}: {err}".splitlines()[0][:500]
        return ScenarioResult(
            measurements=[Measurement(schedule=str(s), ok=False, error=error) for s in schedules]
        )


def _measure_all(
    todo: list[tuple[str, Scenario]], backend: Backend, sink: _Sink, progress: bool, total: int, desc: str
) -> None:
    """Measure ``todo`` in order, handing each scenario's rows to ``sink.add``."""
    from tqdm import tqdm

    bar = tqdm(total=total, initial=total - len(todo), desc=desc, unit="scenario", disable=not progress)
    failing = 0
    try:
        for i, (family, scenario) in enumerate(todo):
            start = time.perf_counter()
            result = _measure_one(backend, scenario)
            rows = result_rows(family, scenario, result, backend.name)
            failing = failing + 1 if not any(r["ok"] for r in rows) else 0
            if failing == i + 1 and failing >= MAX_FAILING_START:
                raise RuntimeError(
                    f"the {backend.name} backend failed every schedule of the first {failing} scenarios; "
                    f"last error: {rows[0]['error']}"
                )
            sink.add(scenario.key(), rows, time.perf_counter() - start)
            bar.update(1)
            bar.set_postfix(rows=sink.rows_written + len(sink.rows), refresh=False)
    finally:
        bar.close()


class _Sink:
    """Buffers measured rows and writes them about every ``flush_seconds`` (rank 0 only)."""

    def __init__(self, out: Path, writer: bool, flush_seconds: float, rows_written: int) -> None:
        self.out, self.writer, self.flush_seconds = out, writer, flush_seconds
        self.rows: list[dict[str, Any]] = []
        self.ids: list[str] = []
        self.seconds = 0.0
        self.last_flush = time.monotonic()
        self.rows_written = rows_written

    def add(self, scenario_id: str, rows: list[dict[str, Any]], seconds: float) -> None:
        self.rows += rows
        self.ids.append(scenario_id)
        self.seconds += seconds
        if time.monotonic() - self.last_flush >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        if self.ids and self.writer:
            self._write()
        self.rows_written += len(self.rows)
        self.rows, self.ids, self.seconds = [], [], 0.0
        self.last_flush = time.monotonic()

    def _write(self) -> None:
        raise NotImplementedError


class _PartSink(_Sink):
    """Each flush: a new part, then the manifest listing it (see the module docstring)."""

    def __init__(self, out: Path, manifest: dict, writer: bool, flush_seconds: float) -> None:
        super().__init__(out, writer, flush_seconds, manifest["rows"])
        self.manifest = manifest

    def _write(self) -> None:
        m = self.manifest
        name = f"parts/part-{len(m['parts']):05d}.parquet"
        _write_parquet_atomic(self.out / name, rows_frame(self.rows))
        m["parts"].append({"file": name, "rows": len(self.rows), "scenarios": len(self.ids)})
        m["finished"] += self.ids
        m["rows"] += len(self.rows)
        m["seconds"] = round(m["seconds"] + self.seconds, 3)
        m["updated"] = _now()
        write_json_atomic(self.out / MANIFEST, m)


class _NoiseSink(_Sink):
    """Each flush rewrites ``noise.parquet`` whole. Its scenario ids are the only record of what was
    re-measured, so a crash cannot leave a duplicate behind."""

    def __init__(self, out: Path, existing: pd.DataFrame, writer: bool, flush_seconds: float) -> None:
        super().__init__(out, writer, flush_seconds, len(existing))
        self.existing = existing

    def _write(self) -> None:
        import pandas as pd

        self.existing = pd.concat([self.existing, rows_frame(self.rows)], ignore_index=True)
        _write_parquet_atomic(self.out / NOISE, self.existing)


def _write_parquet_atomic(path: Path, frame: pd.DataFrame) -> None:
    """Write ``frame`` to ``path`` via a temporary file, fsync and ``os.replace``."""
    tmp = path.with_name(f".{path.name}.tmp")
    frame.to_parquet(tmp, index=False)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remeasure_targets(plan_ids: Sequence[str], finished: set[str], count: int) -> list[str]:
    """``count`` finished scenario ids spread evenly over the plan order (all of them if fewer)."""
    done = [sid for sid in plan_ids if sid in finished]
    if count >= len(done):
        return done
    step = len(done) / count
    return [done[math.floor(i * step)] for i in range(count)]


def _remeasure(
    unique: list[tuple[str, Scenario]],
    finished: set[str],
    noise: pd.DataFrame | None,
    backend: Backend,
    out: Path,
    count: int,
    progress: bool,
    flush_seconds: float,
) -> None:
    """Top the noise table up to ``count`` scenarios (those already in it count; new ones are spread over
    the plan)."""
    noise = rows_frame([]) if noise is None else noise
    have = set(noise["scenario_id"])
    plan_ids = [s.key() for _, s in unique]
    spread = remeasure_targets(plan_ids, finished, count)
    order = [sid for sid in dict.fromkeys(spread + plan_ids) if sid in finished and sid not in have]
    by_id = {s.key(): (f, s) for f, s in unique}
    todo = [by_id[sid] for sid in order[: max(count - len(have), 0)]]
    sink = _NoiseSink(out, noise, backend.rank == 0, flush_seconds)
    _measure_all(todo, backend, sink, progress, len(todo), "noise")
    sink.flush()
